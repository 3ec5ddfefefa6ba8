"""`provisioner fake-gateway`: serve the fake until SIGINT or SIGTERM.

Flags: ``--host``, ``--port`` (0 picks a free port), ``--parent`` (repeatable)
and one per knob of `FakeConfig` (``--latency-ms``, ``--zombie-rate``, ...).
The listening URL is printed first, on one line.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import click

from infrastructure.fake_gateway.config import (
    KNOB_HELP,
    KNOB_NAMES,
    KNOB_TYPES,
    STATUS_CASES,
    FakeConfig,
)
from infrastructure.fake_gateway.server import FakeGateway


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


@click.command("fake-gateway", context_settings={"help_option_names": ["-h", "--help"]})
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
    """Serve the fake workspace gateway (docs/gateway.md) until interrupted.

    Admin endpoints (JSON, no auth, never throttled, not counted): GET /_fake/state
    (workspaces, creates, calls, faults, throttled, outage), POST /_fake/reset
    (forget all but the parents; keeps the config), GET|POST /_fake/config (read
    or set knobs), POST /_fake/scripts ({"title": "fate"}), POST /_fake/workspaces
    (seed one; .../{id}/projects adds a project) and POST /_fake/outage
    ({"seconds": N, "mode": "503" | "refuse"}; a refuse outage ends by itself).
    """
    config = FakeConfig()
    try:
        config.update({name: value for name, value in knobs.items() if value is not None})
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal(done))
    with FakeGateway(config, host=host, port=port, parents=parents or ("org-parent",)) as fake:
        click.echo(f"fake gateway listening on {fake.url}")
        while not done.wait(0.5):
            pass


def _on_signal(done: threading.Event) -> Callable[[int, FrameType | None], None]:
    def handler(_signum: int, _frame: FrameType | None) -> None:
        done.set()

    return handler
