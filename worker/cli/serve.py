"""The long-running commands (`worker`, `relay`, `run`, `reconcile`, `projections
run`) and the projections' one-shot commands: each runs its parts until SIGTERM
or SIGINT (`serve`), then stops them cleanly."""

from __future__ import annotations

import logging
from typing import Any

import click

from infrastructure.settings.table import default_of, whole_range
from worker.cli import read as cli_read
from worker.console import (
    CommandFailed,
    cell,
    declared_broker,
    echo,
    load_settings,
    service_only,
    views,
)

# Loggers whose INFO lines show without -v: start-up and outage lines ("connected to
# ...", a recovery), and each lifecycle edge once (a brand promoted, the gateway's
# circuit closed, its pace learned or cut; failures and an opened circuit are WARNING
# or ERROR anyway). They say nothing else at INFO (hops log on provisioner.engine).
SHOWN_AT_INFO = (
    "connect",
    "worker",
    "relay",
    "projections",
    "reconciler",
    "engine.lifecycle",
    "gateway.lifecycle",
)


def show_lifecycle() -> None:
    """Raise SHOWN_AT_INFO to INFO, unless -v shows every line already."""
    if not logging.getLogger("provisioner").isEnabledFor(logging.INFO):
        for name in SHOWN_AT_INFO:
            logging.getLogger(f"provisioner.{name}").setLevel(logging.INFO)


# As PROVISIONER_CONCURRENCY (infrastructure/settings/table.py): 0 or less would run nothing.
_CONCURRENCY = whole_range("PROVISIONER_CONCURRENCY")
concurrency_option = click.option(
    "--concurrency",
    type=click.IntRange(*_CONCURRENCY),
    default=None,
    help=(
        f"Hops in flight, {_CONCURRENCY[0]} to {_CONCURRENCY[1]} "
        f"(default: PROVISIONER_CONCURRENCY, {default_of('concurrency')})."
    ),
)


@click.group()
def projections() -> None:
    """The read models: run them, see their lag, rebuild them."""


projections.add_command(cli_read.projections_status)


@projections.command("run")
@click.option("--batch", default=2000, show_default=True, type=click.IntRange(1, 100_000))
def projections_run(batch: int) -> None:
    """Keep every projection caught up with the event log (also part of `run`)."""
    serve(("projections",), None, batch=batch)


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

    from infrastructure.store.eventstore import open_event_store
    from infrastructure.views.log_source import LogSource
    from infrastructure.views.store import PROJECTIONS, UnknownProjection, projection
    from projections.core import rebuild

    try:
        chosen = [projection(name)] if name else list(PROJECTIONS.values())
    except UnknownProjection as exc:
        raise click.ClickException(str(exc)) from None
    settings = load_settings()
    with (
        views(read_only=False) as store,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} ev/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        ) as bar,
    ):
        app = open_event_store(settings.database_url, one_shot=True, wait_s=settings.connect_wait_s)
        try:
            for proj in chosen:
                task = bar.add_task(proj.name, total=None, rate="-")

                def show(p: Any, task: Any = task, label: str = proj.name) -> None:
                    speed = bar.tasks[task].speed
                    rate = f"{speed:,.0f}" if speed else "-"
                    bar.update(
                        task,
                        completed=p.done,
                        total=p.total,
                        rate=rate,
                        description=f"{label} -> {p.copy}",
                    )

                copy = rebuild(proj, LogSource(app, store), store, limit=batch, on_progress=show)
                bar.console.print(cell(f"{proj.name}: readers now use {copy}"))
        finally:
            app.close()


def serve(
    parts: tuple[str, ...],
    concurrency: int | None,
    *,
    batch: int = 2000,
    reconcile_every: dict[str, Any] | None = None,
) -> None:
    """Run the chosen parts until SIGTERM or SIGINT, then stop them cleanly."""
    import threading
    from contextlib import ExitStack

    from infrastructure.broker.connection import is_memory
    from infrastructure.failures import ConfigurationError, ServiceUnavailable
    from infrastructure.stopping import stopping
    from worker.runtime import build, build_projector

    settings = load_settings()
    if is_memory(settings.broker_url) and parts in (("worker",), ("relay",), ("reconciler",)):
        raise ConfigurationError(
            "memory:// is an in-process broker: use `provisioner run`, or set "
            "PROVISIONER_BROKER_URL=amqp://... to run the worker and relay apart"
        )
    from worker.health.probes import Probes, serve

    probes = Probes()
    serve(settings.metrics_host, settings.metrics_port, probes)
    show_lifecycle()
    stop = threading.Event()
    # The projections alone need neither the gateway nor the broker.
    context: Any = (
        build_projector(settings, stop=stop)
        if parts == ("projections",)
        else build(settings, parts=parts, concurrency=concurrency, stop=stop)
    )
    with ExitStack() as stack:
        # SIGTERM and SIGINT set `stop`; one line says why the process stopped.
        stack.enter_context(stopping(" + ".join(parts), stop))
        try:
            runtime = stack.enter_context(context)
        except ServiceUnavailable as exc:
            if not stop.is_set():
                raise
            echo(f"stopped while waiting: {exc}", err=True)
            return
        probes.attach(runtime, parts)
        if parts != ("projections",):
            runtime.watch_gateway(stop)  # a gateway that never answered: an ERROR each 30 s
        if "worker" in parts:
            runtime.start(runtime.worker(concurrency).run, "worker", stop)
        if "relay" in parts:
            runtime.start(runtime.relay().run, "relay", stop)
        if "projections" in parts:
            runtime.start(runtime.projector(batch).run, "projections", stop)
        if "reconciler" in parts:
            # The reconciler's own defaults unless `reconcile` gave its options.
            reconciler, publisher = runtime.reconciler(**(reconcile_every or {}))
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
    raise CommandFailed(f"{name} stopped: {failure}", failure.exit_code)


@click.command()
@concurrency_option
def worker(concurrency: int | None) -> None:
    """Consume hop and command messages from RabbitMQ."""
    serve(("worker",), concurrency)


@click.command()
def relay() -> None:
    """Publish the messages the event log implies (the outbox relay)."""
    serve(("relay",), None)


@click.command()
@concurrency_option
def run(concurrency: int | None) -> None:
    """Worker, relay, projections and reconciler in one process: the small-deployment mode."""
    serve(("worker", "relay", "projections", "reconciler"), concurrency)


@click.command()
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
        every = {
            "overdue_s": overdue,
            "grace_s": grace,
            "interval_s": interval,
            "deadline_s": deadline,
        }
        serve(("reconciler",), None, reconcile_every=every)
        return
    from infrastructure.broker.connection import is_memory
    from infrastructure.broker.topology import Topology
    from worker.reconciler import Reconciler

    settings = load_settings()
    if is_memory(settings.broker_url):
        from infrastructure.failures import ConfigurationError

        raise ConfigurationError("memory:// is in-process: the reconciler runs inside `run`")
    service = service_only()
    reconciler = Reconciler(
        settings.database_url,
        overdue_s=overdue,
        grace_s=grace,
        deadline_s=deadline or settings.attempt_deadline_s,
        service=service,
        stuck_after_s=settings.health_stuck_after_s,
        orphan_window_s=settings.inference_window_s,
    )
    topology = Topology(queue_type=settings.queue_type)
    try:
        with declared_broker(settings.broker_url, topology) as broker, views() as store:
            report = reconciler.sweep(store, broker)
    finally:
        service.app.close()
    echo(
        f"re-published {report.hops} hops, {report.releases} owed releases "
        f"({report.stuck} stuck), {report.rechecks} orphan re-checks, "
        f"{report.decommissions} decommissions; {report.expired} attempts failed at "
        "their deadline"
    )
