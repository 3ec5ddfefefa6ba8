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

from infrastructure.eventstore import init_database
from infrastructure.fake_gateway.cli import serve as serve_fake_gateway
from worker import cli_read
from worker.cli_dead_letters import dead_letters
from worker.cli_support import (
    Failed,
    cell,
    declared_broker,
    echo,
    load_settings,
    service_only,
    views,
)
from worker.logs import printable

# As PROVISIONER_CONCURRENCY (infrastructure/settings.py): 0 or less would run nothing.
CONCURRENCY = click.IntRange(1, 512)


class _Main(click.Group):
    """The command group; turns any failure of a command into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        """Every error line (and a `--debug` traceback) without any configured secret."""
        from worker.cli_support import shown

        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            exc.message = printable(shown(exc.message))  # a usage error may quote an argument
            raise
        except (click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:  # noqa: BLE001 - every failure ends as one line and a code
            if ctx.params.get("debug"):
                import traceback

                echo(shown(traceback.format_exc()).rstrip(), err=True)
            from worker.edges import describe

            failure = describe(exc)
            raise Failed(shown(str(failure)), failure.exit_code) from None


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="workspace-provisioner", prog_name="provisioner")
@click.option("-v", "--verbose", is_flag=True, help="Log every hop.")
@click.option("--debug", is_flag=True, help="Show the traceback of a failure.")
@click.option(
    "--i-know-this-is-a-test", "fake_is_test", is_flag=True,
    help="Let PROVISIONER_FAKE_GATEWAY=1 run with PostgreSQL or RabbitMQ (as =test does).",
)  # fmt: skip
def main(verbose: bool, debug: bool, fake_is_test: bool) -> None:  # noqa: ARG001 - load_settings reads it
    """Event-sourced provisioning of brand sub-workspaces in the workspace gateway."""
    from infrastructure.settings import log_format, log_secrets
    from worker.logs import setup

    setup(logging.INFO if verbose else logging.WARNING, log_format(), log_secrets())
    if debug:  # the project's own debug lines; a failure's traceback is `_Main.invoke`'s
        logging.getLogger("provisioner").setLevel(logging.DEBUG)


@main.group()
def db() -> None:
    """The event store's schema."""


@db.command("init")
@click.option("--database-url", envvar="PROVISIONER_DATABASE_URL", help="Overrides the setting.")
def db_init(database_url: str | None) -> None:
    """Create the event tables if missing (idempotent, safe to run concurrently)."""
    from infrastructure.eventstore import check_database_url
    from infrastructure.redaction import redact_url
    from infrastructure.views import SqlViewStore

    settings = load_settings()
    url = database_url or settings.database_url
    check_database_url(url)
    init_database(url, wait_s=settings.connect_wait_s)
    with SqlViewStore(url, wait_s=settings.connect_wait_s) as store:
        store.setup()
    echo(f"event store ready: {redact_url(url)}")


@main.group()
def broker() -> None:
    """The RabbitMQ topology."""


@broker.command("init")
@click.option("--broker-url", envvar="PROVISIONER_BROKER_URL", help="Overrides the setting.")
@click.option("--queue-type", type=click.Choice(["classic", "quorum"]), default=None)
@click.option(
    "--print-permissions", is_flag=True,
    help="Print the rabbitmqctl commands that create the users and permissions; connect to "
    "nothing (docs/operations.md, Broker permissions).",
)  # fmt: skip
@click.option("--producer", "producers", multiple=True, metavar="NAME",
              help="A producer's user, repeatable (default: producer).")  # fmt: skip
@click.option("--service-user", metavar="NAME", help="The service's user (default: provisioner).")
@click.option("--vhost", metavar="V", help="The virtual host (default: provisioning).")
def broker_init(
    *,
    broker_url: str | None,
    queue_type: str | None,
    print_permissions: bool,
    producers: tuple[str, ...],
    service_user: str | None,
    vhost: str | None,
) -> None:
    """Declare exchanges and queues (idempotent), or print the broker permissions."""
    if print_permissions:
        _print_permissions(vhost or "provisioning", service_user or "provisioner", producers)
        return
    if producers or service_user or vhost:
        raise click.UsageError("--producer, --service-user and --vhost go with --print-permissions")
    from infrastructure.broker import Topology
    from infrastructure.settings import BROKER_SCHEMES, check_url

    settings = load_settings()
    url = check_url("--broker-url", broker_url or settings.broker_url, BROKER_SCHEMES)
    topology = Topology(queue_type=queue_type or settings.queue_type)
    with declared_broker(url, topology):
        pass
    echo(f"broker topology declared ({topology.queue_type} queues)")


def _print_permissions(vhost: str, service_user: str, producers: tuple[str, ...]) -> None:
    from infrastructure.broker_permissions import rabbitmqctl_lines

    try:
        lines = rabbitmqctl_lines(vhost, service_user, producers or ("producer",))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    echo("\n".join(lines))


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
            from infrastructure.audit import attempt_story
            from worker.cli_support import outcome_sentence, shown

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
def deactivate(brand_id: str) -> None:
    """Deactivate BRAND_ID: cancel its attempt; a worker then empties its workspace."""
    from domain.errors import ProvisionerError

    service = service_only()
    try:
        result = service.deactivate(brand_id)
    except ProvisionerError as exc:
        raise click.ClickException(str(exc)) from None
    from worker.cli_support import deactivation_sentence

    echo(deactivation_sentence(result))


for command in (cli_read.status, cli_read.history, cli_read.attempt, cli_read.pointer,
                cli_read.attempts):  # fmt: skip
    main.add_command(command)


@main.group()
def projections() -> None:
    """The read models: run them, see their lag, rebuild them."""


projections.add_command(cli_read.projections_status)


@projections.command("run")
@click.option("--batch", default=2000, show_default=True, type=click.IntRange(1, 100_000))
def projections_run(batch: int) -> None:
    """Keep every projection caught up with the event log (also part of `run`)."""
    _serve(("projections",), None, batch=batch)


@projections.command("rebuild")
@click.argument("name", required=False)
@click.option("--batch", default=5000, show_default=True, type=click.IntRange(1, 100_000))
def projections_rebuild(name: str | None, batch: int) -> None:
    """Rebuild from the whole log beside the live copy, then switch readers atomically.

    Readers keep getting answers throughout. Interrupted, it resumes when run again.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from infrastructure.eventstore import open_event_store
    from infrastructure.views import PROJECTIONS, LogSource, UnknownProjection, projection
    from projections.core import rebuild

    try:
        chosen = [projection(name)] if name else list(PROJECTIONS.values())
    except UnknownProjection as exc:
        raise click.ClickException(str(exc)) from None
    settings = load_settings()
    with views(read_only=False) as store, Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} ev/s"), TimeElapsedColumn(), TimeRemainingColumn(),
    ) as bar:  # fmt: skip
        app = open_event_store(settings.database_url, one_shot=True, wait_s=settings.connect_wait_s)
        try:
            for proj in chosen:
                task = bar.add_task(proj.name, total=None, rate="-")

                def show(p: Any, task: Any = task, label: str = proj.name) -> None:
                    speed = bar.tasks[task].speed
                    rate = f"{speed:,.0f}" if speed else "-"
                    bar.update(task, completed=p.done, total=p.total, rate=rate,
                               description=f"{label} -> {p.copy}")  # fmt: skip

                copy = rebuild(proj, LogSource(app, store), store, limit=batch, on_progress=show)
                bar.console.print(cell(f"{proj.name}: readers now use {copy}"))
        finally:
            app.close()


def _serve(
    parts: tuple[str, ...],
    concurrency: int | None,
    *,
    batch: int = 2000,
    reconcile_every: tuple[float, float, float, float | None] = (60.0, 60.0, 30.0, None),
) -> None:
    """Run the chosen parts until SIGTERM or SIGINT, then stop them cleanly."""
    import signal
    import threading
    from contextlib import ExitStack

    from infrastructure.broker import is_memory
    from infrastructure.failures import ConfigurationError, ServiceUnavailable
    from worker.runtime import build, build_projector

    settings = load_settings()
    if is_memory(settings.broker_url) and parts in (("worker",), ("relay",), ("reconciler",)):
        raise ConfigurationError(
            "memory:// is an in-process broker: use `provisioner run`, or set "
            "PROVISIONER_BROKER_URL=amqp://... to run the worker and relay apart"
        )
    from worker.probes import Probes, serve

    probes = Probes()
    serve(settings.metrics_host, settings.metrics_port, probes)
    # Start-up and outage lines ("connected to ...", a recovery) show without -v;
    # these loggers say nothing else at INFO (hops log on provisioner.engine).
    if not logging.getLogger("provisioner").isEnabledFor(logging.INFO):
        for name in ("connect", "worker", "relay", "projections", "reconciler"):
            logging.getLogger(f"provisioner.{name}").setLevel(logging.INFO)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # The projections alone need neither the gateway nor the broker.
    context: Any = (
        build_projector(settings, stop=stop)
        if parts == ("projections",)
        else build(settings, parts=parts, concurrency=concurrency, stop=stop)
    )
    with ExitStack() as stack:
        try:
            runtime = stack.enter_context(context)
        except ServiceUnavailable as exc:
            if not stop.is_set():
                raise
            echo(f"stopped while waiting: {exc}", err=True)
            return
        probes.attach(runtime, parts)
        if "worker" in parts:
            runtime.start(runtime.worker(concurrency).run, "worker", stop)
        if "relay" in parts:
            runtime.start(runtime.relay().run, "relay", stop)
        if "projections" in parts:
            runtime.start(runtime.projector(batch).run, "projections", stop)
        if "reconciler" in parts:
            overdue, grace, interval, deadline = reconcile_every
            reconciler, publisher = runtime.reconciler(
                overdue_s=overdue, grace_s=grace, interval_s=interval, deadline_s=deadline
            )
            runtime.start(lambda s: reconciler.run(s, publisher), "reconciler", stop)
        echo(f"{' + '.join(parts)} running; Ctrl-C or SIGTERM stops")
        while not stop.wait(0.5):
            if not all(t.is_alive() for t in runtime.threads):
                stop.set()
        for thread in runtime.threads:
            thread.join(10 if runtime.failures else 90)
        _stopped(runtime.failures)


def _stopped(failures: dict[str, BaseException]) -> None:
    """A component that raised stops the process: one line with its reason, its exit code."""
    if not failures:
        return
    name, exc = next(iter(failures.items()))
    if click.get_current_context().find_root().params.get("debug"):
        raise exc
    from worker.edges import describe

    failure = describe(exc)
    raise Failed(f"{name} stopped: {failure}", failure.exit_code)


@main.command()
@click.option(
    "--concurrency",
    type=CONCURRENCY,
    default=None,
    help="Hops in flight, 1 to 512 (default: PROVISIONER_CONCURRENCY, 8).",
)
def worker(concurrency: int | None) -> None:
    """Consume hop and command messages from RabbitMQ."""
    _serve(("worker",), concurrency)


@main.command()
def relay() -> None:
    """Publish the messages the event log implies (the outbox relay)."""
    _serve(("relay",), None)


@main.command()
@click.option(
    "--concurrency",
    type=CONCURRENCY,
    default=None,
    help="Hops in flight, 1 to 512 (default: PROVISIONER_CONCURRENCY, 8).",
)
def run(concurrency: int | None) -> None:
    """Worker, relay, projections and reconciler in one process: the small-deployment mode."""
    _serve(("worker", "relay", "projections", "reconciler"), concurrency)


@main.command()
@click.option("--once", is_flag=True, help="One sweep, print what it re-published, exit.")
@click.option("--overdue", default=60.0, show_default=True, help="Seconds a hop may be overdue.")
@click.option("--grace", default=60.0, show_default=True, help="Seconds before owed work counts.")
@click.option("--interval", default=30.0, show_default=True, help="Seconds between sweeps.")
@click.option(
    "--deadline",
    type=float,
    default=None,
    help="Seconds before a pending attempt fails (PROVISIONER_ATTEMPT_DEADLINE_S, a day).",
)
def reconcile(
    *, once: bool, overdue: float, grace: float, interval: float, deadline: float | None
) -> None:
    """Re-publish overdue hops, owed releases and decommissions; fail attempts past their
    deadline (safe to run anywhere, any number of times)."""
    if not once:
        _serve(("reconciler",), None, reconcile_every=(overdue, grace, interval, deadline))
        return
    from infrastructure.broker import Topology, is_memory
    from worker.reconciler import Reconciler

    settings = load_settings()
    if is_memory(settings.broker_url):
        from infrastructure.failures import ConfigurationError

        raise ConfigurationError("memory:// is in-process: the reconciler runs inside `run`")
    service = service_only()
    reconciler = Reconciler(
        settings.database_url, overdue_s=overdue, grace_s=grace,
        deadline_s=deadline or settings.attempt_deadline_s, service=service,
    )  # fmt: skip
    topology = Topology(queue_type=settings.queue_type)
    try:
        with declared_broker(settings.broker_url, topology) as broker, views() as store:
            report = reconciler.sweep(store, broker)
    finally:
        service.app.close()
    echo(
        f"re-published {report.hops} hops, {report.releases} releases, "
        f"{report.decommissions} decommissions; {report.expired} attempts failed at "
        "their deadline"
    )


main.add_command(serve_fake_gateway, "fake-gateway")
main.add_command(dead_letters)
from worker.cli_rollout import retry, rollout  # noqa: E402 - registered here, beside them

main.add_command(rollout)
main.add_command(retry)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def health(as_json: bool) -> None:
    """Check the database, the broker, the gateway and its token, the relay's and the
    projections' lag and stuck attempts; exit 0 when every check passes, 1 if any fails."""
    import json

    from worker.health import check_once, healthy, report

    settings = load_settings()
    results = check_once(settings)
    if as_json:
        echo(json.dumps(settings.secrets().scrub_value(report(results)), indent=2))
    else:
        echo(settings.secrets().scrub("\n".join(r.line() for r in results)))
    sys.exit(0 if healthy(results) else 1)


@main.command()
@click.option("--host", default=None, help="Address to bind (PROVISIONER_WEB_HOST, 127.0.0.1).")
@click.option(
    "--port", default=None, type=click.IntRange(1, 65535), help="PROVISIONER_WEB_PORT, 8080."
)
def web(host: str | None, port: int | None) -> None:
    """Serve the operator's read-only pages: brands, a brand's timeline, stuck attempts,
    dead letters and lag (with PROVISIONER_WEB_TOKEN set, each needs that bearer token)."""
    from infrastructure.settings import check_host
    from worker.web.app import serve

    settings = load_settings()
    host = check_host("--host", host) if host is not None else settings.web_host
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
