"""The `provisioner` command line: one composition root per command.

Every failure a command lets escape is turned into one line on stderr and the
exit code of infrastructure/failures.py, in one place (`_Main.invoke`); the
global `--debug` shows the traceback instead. One-shot commands hold at most
one database connection, opened per use.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, ClassVar

import click
from rich.markup import escape

from infrastructure.eventstore import init_database, redact
from infrastructure.settings import Settings


def _settings() -> Settings:
    return Settings.from_env()


class _Failed(click.ClickException):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _Main(click.Group):
    """The command group; turns any failure of a command into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if ctx.params.get("debug"):
                raise
            from worker.edges import describe

            failure = describe(exc)
            raise _Failed(str(failure), failure.exit_code) from None


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log every hop.")
@click.option("--debug", is_flag=True, help="Show the traceback of a failure.")
def main(verbose: bool, debug: bool) -> None:
    """Event-sourced provisioning of brand sub-workspaces in the workspace gateway."""
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )


def _cell(value: Any) -> str:
    """Text for a Rich table cell: whatever came from the wire or a producer, escaped."""
    return escape("" if value is None else str(value))


@main.group()
def db() -> None:
    """The event store's schema."""


@db.command("init")
@click.option("--database-url", envvar="PROVISIONER_DATABASE_URL", help="Overrides the setting.")
def db_init(database_url: str | None) -> None:
    """Create the event tables if missing (idempotent, safe to run concurrently)."""
    from infrastructure.eventstore import check_database_url
    from infrastructure.views import SqlViewStore

    settings = _settings()
    url = database_url or settings.database_url
    check_database_url(url)
    init_database(url, wait_s=settings.connect_wait_s)
    with SqlViewStore(url, wait_s=settings.connect_wait_s) as store:
        store.setup()
    click.echo(f"event store ready: {redact(url)}")


@main.group()
def broker() -> None:
    """The RabbitMQ topology."""


@broker.command("init")
@click.option("--broker-url", envvar="PROVISIONER_BROKER_URL", help="Overrides the setting.")
@click.option("--queue-type", type=click.Choice(["classic", "quorum"]), default=None)
def broker_init(broker_url: str | None, queue_type: str | None) -> None:
    """Declare exchanges and queues (idempotent)."""
    from infrastructure.broker import Broker, Topology

    settings = _settings()
    url = broker_url or settings.broker_url
    topology = Topology(queue_type=queue_type or settings.queue_type)
    publisher = Broker(url, topology, scheduler=None)
    try:
        publisher.declare()
    finally:
        publisher.close()
    click.echo(f"broker topology declared ({topology.queue_type} queues)")


def _service_only(*, read_only: bool = False) -> Any:
    """A service for the request path (no gateway call is made there) on one
    database connection at a time, opened per use. `read_only`: creates nothing."""
    from infrastructure.eventstore import open_event_store
    from infrastructure.gateway import HttpGateway
    from infrastructure.service import ProvisioningService

    settings = _settings()
    app = open_event_store(
        settings.database_url, one_shot=True, read_only=read_only,
        wait_s=settings.connect_wait_s,
    )  # fmt: skip
    gateway = HttpGateway("http://127.0.0.1:9", "request-path")
    return ProvisioningService(app, gateway, settings=settings.engine())


@main.command()
@click.argument("brand_id")
@click.option("--title", required=True, help="The brand's display name (the workspace title).")
@click.option("--parent", required=True, help="The organisation's parent workspace id.")
@click.option("--wait", is_flag=True, help="Wait for the attempt to end; exit 0 only if promoted.")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait with --wait.")
def provision(brand_id: str, title: str, parent: str, wait: bool, timeout: float) -> None:
    """Request a workspace for BRAND_ID; a worker and a relay carry it out."""
    from domain.errors import ProvisionerError

    service = _service_only()
    try:
        attempt_id = service.request_provisioning(brand_id, title, parent)
    except ProvisionerError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"attempt {attempt_id} started for brand {brand_id}")
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
            click.echo(
                f"attempt {attempt_id}: {attempt.state.value} {attempt.last_status}".rstrip()
            )
            return 0 if attempt.state is AttemptState.PROMOTED else 1
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 1.5, 2.0)
    click.echo(
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

    service = _service_only()
    try:
        result = service.deactivate(brand_id)
    except ProvisionerError as exc:
        raise click.ClickException(str(exc)) from None
    if result.already_deactivated:
        click.echo(f"brand {brand_id} was already deactivated")
    else:
        click.echo(
            f"brand {brand_id} deactivated; cancelled attempt: {result.cancelled_attempt_id}"
        )


def _print(data: Any, as_json: bool, render: Any) -> None:
    import json

    if as_json:
        click.echo(json.dumps(data, indent=2, default=_jsonable))
    else:
        render(data)


def _events_table(story: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=_cell(f"attempt {story['attempt_id']}: {story['state']}"))
    for column in ("at", "event", "hop", "workspace", "provenance", "reason"):
        table.add_column(column)
    for e in story["events"]:
        table.add_row(
            _cell(e["at"][:23]),
            _cell(e["type"]),
            _cell(e["hop"]),
            _cell(e["workspace_id"]),
            _cell(e["provenance"]),
            _cell((e["reason"] or "")[:60]),
        )
    return table


def _audit(fetch: Any) -> Any:
    from domain.errors import ProvisionerError

    service = _service_only(read_only=True)
    try:
        return fetch(service)
    except ProvisionerError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        service.app.close()


@main.command()
@click.argument("brand_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(brand_id: str, as_json: bool) -> None:
    """The brand's current state and workspace."""
    from infrastructure.audit import brand_status

    data = _audit(lambda service: brand_status(service, brand_id))
    _print(data, as_json, lambda d: click.echo("\n".join(f"{k}: {v}" for k, v in d.items())))


@main.command()
@click.argument("brand_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def history(brand_id: str, as_json: bool) -> None:
    """Every attempt of the brand, oldest first, with its events (from the event store)."""
    from rich.console import Console

    from infrastructure.audit import brand_history

    data = _audit(lambda service: brand_history(service, brand_id))

    def render(stories: list[dict[str, Any]]) -> None:
        console = Console()
        for story in stories:
            console.print(_events_table(story))

    _print(data, as_json, render)


@main.command()
@click.argument("attempt_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def attempt(attempt_id: str, as_json: bool) -> None:
    """One attempt in full."""
    from uuid import UUID

    from rich.console import Console

    from infrastructure.audit import attempt_story

    try:
        parsed = UUID(attempt_id)
    except ValueError:
        raise click.ClickException(f"{attempt_id!r} is not an attempt id (a UUID)") from None
    data = _audit(lambda service: attempt_story(service, parsed))
    _print(data, as_json, lambda d: Console().print(_events_table(d)))


class _Time(click.ParamType[Any]):
    """An ISO 8601 time (UTC unless it says otherwise), `now`, or an age: 30s, 15m, 2h, 7d."""

    name = "TIME"
    _UNITS: ClassVar[dict[str, int]] = {"s": 1, "m": 60, "h": 3600, "d": 86400}

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        from datetime import UTC, datetime, timedelta

        if isinstance(value, datetime):
            return value
        text = str(value).strip()
        now = datetime.now(UTC)
        if text == "now":
            return now
        unit = self._UNITS.get(text[-1:])
        if unit and text[:-1].replace(".", "", 1).isdigit():
            return now - timedelta(seconds=float(text[:-1]) * unit)
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            self.fail(
                f"{text!r} is not a time: use ISO 8601 (2026-11-30T12:00:00Z), "
                "now, or an age such as 15m, 2h, 7d",
                param,
                ctx,
            )
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _jsonable(value: Any) -> Any:
    from datetime import datetime

    return value.isoformat() if isinstance(value, datetime) else str(value)


def _views(*, read_only: bool = True) -> Any:
    """The read models of the configured database, checked to exist (creating nothing)."""
    from infrastructure.views import SqlViewStore

    settings = _settings()
    url = settings.database_url
    store = SqlViewStore(url, read_only=read_only, wait_s=settings.connect_wait_s)
    try:
        store.check()
    except BaseException:
        store.close()
        raise
    return store


@main.command()
@click.argument("brand_id")
@click.option("--at", "at", type=_Time(), required=True, help="When (ISO 8601, or an age: 2h).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def pointer(brand_id: str, at: Any, as_json: bool) -> None:
    """The workspace the brand was bound to at a time (replayed from the event store)."""
    from infrastructure.audit import pointer_at

    data = _audit(lambda service: pointer_at(service, brand_id, at))
    _print(data, as_json, lambda d: click.echo("\n".join(f"{k}: {v}" for k, v in d.items())))


ATTEMPT_COLUMNS = ("attempt_id", "brand_id", "state", "hops_used", "candidate_id",
                   "provenance", "started_at", "next_hop_due", "last_error")  # fmt: skip


@main.command()
@click.option(
    "--state",
    type=click.Choice(["pending", "promoted", "failed", "cancelled", "superseded"]),
    help="Only attempts in this state.",
)
@click.option("--stuck", is_flag=True, help="Pending attempts whose next hop is overdue.")
@click.option("--overdue", default=60.0, show_default=True, help="Seconds overdue for --stuck.")
@click.option("--since", type=_Time(), help="Started at or after this time (or age: 1d).")
@click.option("--brand", "brand_id", help="Only this brand's attempts.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def attempts(
    *,
    state: str | None,
    stuck: bool,
    overdue: float,
    since: Any,
    brand_id: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Attempts from the `attempts` projection, newest first (stuck: most overdue first)."""
    from infrastructure.views import list_attempts

    if stuck and state not in (None, "pending"):
        raise click.UsageError("--stuck lists pending attempts; drop --state or use pending")
    with _views() as store:
        rows = list_attempts(
            store, state=state, stuck=stuck, overdue_s=overdue, since=since,
            brand_id=brand_id, limit=limit,
        )  # fmt: skip

    def render(found: list[dict[str, Any]]) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{len(found)} attempts")
        for column in ATTEMPT_COLUMNS:
            table.add_column(column)
        for row in found:
            cells = [row[c] for c in ATTEMPT_COLUMNS]
            table.add_row(*(_cell(None if v is None else _jsonable(v)[:40]) for v in cells))
        Console().print(table)

    _print(rows, as_json, render)


@main.group()
def projections() -> None:
    """The read models: run them, see their lag, rebuild them."""


@projections.command("run")
@click.option("--batch", default=2000, show_default=True, type=click.IntRange(1, 100_000))
def projections_run(batch: int) -> None:
    """Keep every projection caught up with the event log (also part of `run`)."""
    _serve(("projections",), None, batch=batch)


@projections.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def projections_status(as_json: bool) -> None:
    """Per projection: position, head of the log, events behind, rows, rebuild."""
    from infrastructure.eventstore import open_event_store
    from infrastructure.views import LogSource

    settings = _settings()
    with _views() as store:
        app = open_event_store(
            settings.database_url, one_shot=True, read_only=True, wait_s=settings.connect_wait_s
        )
        try:
            data = store.status(LogSource(app, store))
        finally:
            app.close()

    def render(report: list[dict[str, Any]]) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table()
        columns = ("projection", "copy", "position", "head", "behind", "rows", "rebuilding")
        for column in columns:
            table.add_column(column, no_wrap=column in ("projection", "copy"))
        for item in report:
            table.add_row(*(_cell(item[c]) for c in columns))
        Console().print(table)

    _print(data, as_json, render)


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
    settings = _settings()
    with _views(read_only=False) as store, Progress(
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
                bar.console.print(f"{proj.name}: readers now use {copy}")
        finally:
            app.close()


def _serve(
    parts: tuple[str, ...],
    concurrency: int | None,
    *,
    batch: int = 2000,
    reconcile_every: tuple[float, float, float, float] = (60.0, 60.0, 30.0, 3600.0),
) -> None:
    """Run the chosen parts until SIGTERM or SIGINT, then stop them cleanly."""
    import signal
    import threading

    from infrastructure.broker import is_memory
    from worker.runtime import build, build_projector

    settings = _settings()
    if is_memory(settings.broker_url) and parts in (("worker",), ("relay",), ("reconciler",)):
        raise click.ClickException(
            "memory:// is an in-process broker: use `provisioner run`, or set "
            "PROVISIONER_BROKER_URL=amqp://... to run the worker and relay apart"
        )
    from worker.metrics import serve

    serve(settings.metrics_port)
    # Start-up lines (waiting for the database, "connected to ...") show without -v.
    logging.getLogger("provisioner.database").setLevel(logging.INFO)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # The projections alone need neither the gateway nor the broker.
    context: Any = (
        build_projector(settings, stop=stop)
        if parts == ("projections",)
        else build(settings, parts=parts, concurrency=concurrency, stop=stop)
    )
    with context as runtime:
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
        click.echo(f"{' + '.join(parts)} running; Ctrl-C or SIGTERM stops")
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
    raise _Failed(f"{name} stopped: {failure}", failure.exit_code)


@main.command()
@click.option("--concurrency", type=int, default=None, help="Hops in flight (default 8).")
def worker(concurrency: int | None) -> None:
    """Consume hop and command messages from RabbitMQ."""
    _serve(("worker",), concurrency)


@main.command()
def relay() -> None:
    """Publish the messages the event log implies (the outbox relay)."""
    _serve(("relay",), None)


@main.command()
@click.option("--concurrency", type=int, default=None, help="Hops in flight (default 8).")
def run(concurrency: int | None) -> None:
    """Worker, relay, projections and reconciler in one process: the small-deployment mode."""
    _serve(("worker", "relay", "projections", "reconciler"), concurrency)


@main.command()
@click.option("--once", is_flag=True, help="One sweep, print what it re-published, exit.")
@click.option("--overdue", default=60.0, show_default=True, help="Seconds a hop may be overdue.")
@click.option("--grace", default=60.0, show_default=True, help="Seconds before owed work counts.")
@click.option("--interval", default=30.0, show_default=True, help="Seconds between sweeps.")
@click.option(
    "--deadline", default=3600.0, show_default=True, help="Seconds before a pending attempt fails."
)
def reconcile(
    *, once: bool, overdue: float, grace: float, interval: float, deadline: float
) -> None:
    """Re-publish overdue hops, owed releases and decommissions; fail attempts past their
    deadline (safe to run anywhere, any number of times)."""
    if not once:
        _serve(("reconciler",), None, reconcile_every=(overdue, grace, interval, deadline))
        return
    from infrastructure.broker import Broker, Topology, is_memory
    from worker.reconciler import Reconciler

    settings = _settings()
    if is_memory(settings.broker_url):
        raise click.ClickException("memory:// is in-process: the reconciler runs inside `run`")
    service = _service_only()
    broker = Broker(settings.broker_url, Topology(queue_type=settings.queue_type), scheduler=None)
    reconciler = Reconciler(
        settings.database_url, overdue_s=overdue, grace_s=grace, deadline_s=deadline,
        service=service,
    )  # fmt: skip
    try:
        with _views() as store:
            report = reconciler.sweep(store, broker)
    finally:
        broker.close()
        service.app.close()
    click.echo(
        f"re-published {report.hops} hops, {report.releases} releases, "
        f"{report.decommissions} decommissions; {report.expired} attempts failed at "
        "their deadline"
    )


@main.command(
    "fake-gateway",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def fake_gateway(args: tuple[str, ...]) -> None:
    """Serve the fake workspace gateway (see `provisioner fake-gateway --help`)."""
    from infrastructure.fake_gateway import main as fake_main

    sys.exit(fake_main(list(args)))


@main.command()
@click.option("--brands", default=20, show_default=True, help="How many brands to provision.")
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
