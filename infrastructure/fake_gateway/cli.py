"""`provisioner fake-gateway`: serve the fake until SIGINT or SIGTERM.

Flags: ``--host``, ``--port`` (0 picks a free port), ``--parent`` (repeatable)
and one per knob of `FakeConfig` (``--latency-ms``, ``--zombie-rate``, ...).
`--help` lists the admin calls too (routes.ADMIN_CALLS). The listening URL is
printed first, on one line; one log line says why it stopped. Workspace ids
carry a random prefix per start unless ``--seed`` is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from infrastructure.fake_gateway.config import (
    KNOB_HELP,
    KNOB_NAMES,
    KNOB_TYPES,
    STATUS_CASES,
    FakeConfig,
)
from infrastructure.fake_gateway.routes import ADMIN_CALLS, SCRIPT_FATES
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.stopping import stopping


def _knob_options(command: Callable[..., None]) -> Callable[..., None]:
    """One option per knob, named after it, unset unless given."""
    defaults = FakeConfig()
    for name in reversed(KNOB_NAMES):
        kind = KNOB_TYPES[name]
        option_type: Any = click.Choice(STATUS_CASES) if kind is str else kind
        meaning = f"{KNOB_HELP[name]}; " if name in KNOB_HELP else ""
        command = click.option(
            "--" + name.replace("_", "-"),
            name,
            type=option_type,
            default=None,
            help=f"{meaning}default {getattr(defaults, name)!r}",
        )(command)
    return command


def _help() -> str:
    """The command's help: what it serves, then each admin call on a line of its own."""
    width = max(len(path) for _, path, _ in ADMIN_CALLS)
    calls = "\n".join(f"{method:<4} {path:<{width}}  {what}" for method, path, what in ADMIN_CALLS)
    return (
        "Serve the fake workspace gateway (docs/gateway.md) until interrupted.\n\n"
        "Admin calls (JSON in and out, no auth, never throttled, not counted):\n\n"
        f"\b\n{calls}\n\n"
        f"Script fates: {SCRIPT_FATES}.\n\n"
        "Workspace and project ids carry a random prefix per start, so that a restarted "
        "fake never issues an id again; with --seed they follow from the seed alone "
        "(the same every start)."
    )


@click.command(
    "fake-gateway", help=_help(), context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8089, show_default=True, help="0 picks a free port.")
@click.option(
    "--parent",
    "parents",
    multiple=True,
    metavar="ID",
    help="A parent workspace id (repeatable; default org-parent).",
)
@_knob_options
def serve(host: str, port: int, parents: tuple[str, ...], **knobs: object) -> None:
    config = FakeConfig()
    try:
        config.update({name: value for name, value in knobs.items() if value is not None})
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    prefix = "" if knobs.get("seed") is not None else None  # --seed: the seed's ids alone
    parents = parents or ("org-parent",)
    with (
        stopping("fake-gateway") as done,
        FakeGateway(config, host=host, port=port, parents=parents, id_prefix=prefix) as fake,
    ):
        click.echo(f"fake gateway listening on {fake.url}")
        while not done.wait(0.5):
            pass
