"""The `provisioner` command line: one composition root per command.

Every failure a command lets escape is turned into one line on stderr and the
exit code of infrastructure/failures.py, in one place (`_Main.invoke`), without any
configured secret; the global `--debug` shows the traceback before it. One-shot
commands hold at most one database connection, opened per use.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from infrastructure.fake_gateway.cli import serve as serve_fake_gateway
from infrastructure.settings.table import default_of, whole_range
from worker.cli import read as cli_read
from worker.cli.audit import audit
from worker.cli.config import config
from worker.cli.dead_letters import dead_letters
from worker.cli.fleet import workers
from worker.cli.retry import retry
from worker.cli.rollout import rollout
from worker.cli.serve import projections, reconcile, relay, run, worker
from worker.cli.setup import broker, db
from worker.console import CommandFailed, echo, load_settings, service_only
from worker.logs import printable


class _Main(click.Group):
    """The command group; turns any failure of a command into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        """Every error line (and a `--debug` traceback) without any configured secret."""
        from worker.console import shown

        # A command's --help reads no setting: it shows whatever the environment holds.
        rest = [*getattr(ctx, "_protected_args", ()), *ctx.args]
        ctx.meta["asks_help"] = any(arg in ("-h", "--help") for arg in rest)
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            exc.message = printable(shown(exc.message))  # a usage error may quote an argument
            raise
        except (click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:  # `provisioner ... | head`: the reader has all it wants
            _quiet_stdout()
            raise click.exceptions.Exit(0) from None
        except Exception as exc:  # noqa: BLE001 - every failure ends as one line and a code
            if ctx.params.get("debug"):
                import traceback

                echo(shown(traceback.format_exc()).rstrip(), err=True)
            from worker.edges import describe

            failure = describe(exc)
            raise CommandFailed(shown(str(failure)), failure.exit_code) from None


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the flush at exit raises no second error."""
    import contextlib
    import os
    import sys

    with contextlib.suppress(OSError, ValueError):  # not a real file (a test's capture)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="workspace-provisioner", prog_name="provisioner")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="-v: the project's debug lines, every hop among them; -vv: the libraries' too.",
)
@click.option("--debug", is_flag=True, help="Show the traceback of a failure.")
@click.option(
    "--i-know-this-is-a-test",
    "fake_is_test",
    is_flag=True,
    help="Let PROVISIONER_FAKE_GATEWAY=1 run with PostgreSQL or RabbitMQ (as =test does).",
)
def main(verbose: int, debug: bool, fake_is_test: bool) -> None:  # noqa: ARG001 - load_settings reads it
    """Event-sourced provisioning of brand sub-workspaces in the workspace gateway."""
    from infrastructure.settings.checks import check_environment
    from infrastructure.settings.model import log_format, log_secrets
    from worker.logs import raise_loggers, root_level, setup

    setup(root_level(verbose), log_format(), log_secrets())
    raise_loggers(verbose)  # -v: the project's loggers; -vv: the libraries' too
    # An unknown PROVISIONER_* name stops every command; a half-embedded default, those
    # that use the store or the broker (`config` shows the settings, then refuses).
    context = click.get_current_context()
    if not context.meta.get("asks_help"):
        invoked = context.invoked_subcommand
        check_environment(mix=invoked not in ("demo", "fake-gateway", "config"))
    if debug:  # the project's own debug lines; a failure's traceback is `_Main.invoke`'s
        logging.getLogger("provisioner").setLevel(logging.DEBUG)


@main.command()
@click.argument("brand_id")
@click.option("--title", required=True, help="The brand's display name (the workspace title).")
@click.option("--parent", required=True, help="The organisation's parent workspace id.")
@click.option("--wait", is_flag=True, help="Wait for the attempt to end; exit 0 only if promoted.")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait with --wait.")
def provision(brand_id: str, title: str, parent: str, wait: bool, timeout: float) -> None:
    """Request a workspace for BRAND_ID; a worker and a relay carry it out."""
    from domain.errors import ProvisionerError

    service = service_only()
    try:
        attempt_id = service.request_provisioning(brand_id, title, parent)
    except ProvisionerError as exc:
        raise click.ClickException(str(exc)) from None
    echo(f"attempt {attempt_id} started for brand {brand_id}")
    if wait:
        sys.exit(_wait_for(service, attempt_id, timeout))


def _wait_for(service: Any, attempt_id: Any, timeout: float) -> int:
    import time

    from domain.policies import AttemptState

    # Each poll opens, uses and closes the process's one connection; the pause
    # grows to 2 s so that hundreds of waiting commands stay light on the server.
    deadline, pause = time.monotonic() + timeout, 0.25
    while time.monotonic() < deadline:
        attempt = service.attempt(attempt_id)
        if attempt.is_terminal:
            from infrastructure.views.audit import attempt_story
            from worker.console import outcome_sentence, shown

            echo(shown(outcome_sentence(attempt_story(service, attempt_id))))
            return 0 if attempt.state is AttemptState.PROMOTED else 1
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 1.5, 2.0)
    echo(
        f"attempt {attempt_id} still pending after {timeout:.0f}s: is a worker and a relay "
        "running (`provisioner run`)?",
        err=True,
    )
    return 2


@main.command()
@click.argument("brand_id")
@click.option(
    "--purge-now",
    is_flag=True,
    help="Empty its workspace now, not at the end of PROVISIONER_DECOMMISSION_DELAY_S.",
)
def deactivate(brand_id: str, purge_now: bool) -> None:
    """Deactivate BRAND_ID: cancel its attempt; a worker empties its workspace once the
    retention window (PROVISIONER_DECOMMISSION_DELAY_S) ends, unless it is provisioned
    again before then."""
    from domain.errors import ProvisionerError
    from worker.actions import deactivate as deactivated

    try:
        done = deactivated(load_settings(), brand_id, purge_now=purge_now)
    except ProvisionerError as exc:
        raise click.ClickException(str(exc)) from None
    echo(done)


for command in (
    cli_read.status,
    cli_read.history,
    cli_read.attempt,
    cli_read.pointer,
    cli_read.attempts,
    cli_read.brands,
    db,
    broker,
    projections,
    worker,
    relay,
    run,
    reconcile,
    rollout,
    retry,
    dead_letters,
    audit,
    workers,
):
    main.add_command(command)
main.add_command(serve_fake_gateway, "fake-gateway")
main.add_command(config)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def health(as_json: bool) -> None:
    """Check the database, the broker, the gateway and its token, the relay's and the
    projections' lag and stuck attempts; exit 0 when every check passes, 1 if any fails,
    4 if a peer refuses us for good (the gateway's certificate does not verify)."""
    import json

    from infrastructure.failures import EXIT_REFUSED
    from worker.health.report import check_once
    from worker.health.results import healthy, refusal, report

    settings = load_settings()
    results = check_once(settings)
    if as_json:
        echo(json.dumps(settings.secrets().scrub_value(report(results)), indent=2))
    else:
        echo(settings.secrets().scrub("\n".join(r.line() for r in results)))
    refused = refusal(results)
    if refused is not None:  # no outage to wait out: the deployment is broken
        raise CommandFailed(settings.secrets().scrub(refused.detail), EXIT_REFUSED)
    sys.exit(0 if healthy(results) else 1)


@main.command()
@click.option(
    "--host",
    default=None,
    help=f"Address to bind (PROVISIONER_WEB_HOST, {default_of('web_host')}).",
)
@click.option(
    "--port",
    default=None,
    type=click.IntRange(*whole_range("PROVISIONER_WEB_PORT")),
    help=f"PROVISIONER_WEB_PORT, {default_of('web_port')}.",
)
def web(host: str | None, port: int | None) -> None:
    """Serve the operator's pages: brands, a brand's timeline, stuck attempts, dead
    letters, audits and lag (with PROVISIONER_WEB_TOKEN set, each needs that bearer
    token, and forms retry, deactivate, replay, purge and audit behind a CSRF check)."""
    from infrastructure.settings.parsing import check_host
    from infrastructure.stopping import stopping
    from worker.web.app import serve

    settings = load_settings()
    host = check_host("--host", host) if host is not None else settings.web_host
    with stopping("web"):  # uvicorn hands the signal back as it stops
        serve(settings, host, port or settings.web_port)


@main.command()
@click.option(
    "--brands",
    default=20,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="How many brands to provision.",
)
@click.option("--seed", default=11, show_default=True, help="The fake gateway's seed.")
@click.option(
    "--database-url",
    default="sqlite:///var/demo.sqlite",
    show_default=True,
    help="Where the demo's events go (started afresh).",
)
def demo(brands: int, seed: int, database_url: str) -> None:
    """Provision brands in-process against the fake gateway, with faults, and report."""
    from worker.demo import run_demo

    sys.exit(run_demo(brands=brands, seed=seed, database_url=database_url))


if __name__ == "__main__":
    main()
