"""Composition root: build the service, the broker pieces, the worker and the relay
from Settings. Nothing here is built at import time."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from domain.liveness import beat_interval_s
from domain.ports import Gateway
from infrastructure.broker.connection import is_memory
from infrastructure.broker.delays import DelayScheduler
from infrastructure.broker.publisher import Broker
from infrastructure.broker.topology import Topology
from infrastructure.failures import ConfigurationError
from infrastructure.fake_gateway.config import FakeConfig
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.gateway.contact import GatewayContact
from infrastructure.gateway.family_reads import SharedFamilyReads
from infrastructure.gateway.pacing import MemoryPaceStore, Pace, PaceStore, PgPaceStore
from infrastructure.gateway.tls import refuse_unverified
from infrastructure.service import ProvisioningService
from infrastructure.settings.model import Settings
from infrastructure.store.eventstore import (
    ProvisionerApplication,
    is_postgres,
    open_event_store,
    open_position_store,
)
from infrastructure.views.audit_findings import FindingsWriter
from infrastructure.views.heartbeats import Heartbeat
from infrastructure.views.store import SqlViewStore, memory_views_url
from worker.audit_schedule import AuditSchedule
from worker.consumer import HopWorker
from worker.gateway_watch import GatewayWatch
from worker.health import metrics
from worker.projector import Projector
from worker.reconciler import GRACE_S, OVERDUE_S, Reconciler
from worker.relay import Relay

log = logging.getLogger("provisioner.runtime")


class _Threads:
    """Background parts of a process, each on a daemon thread, stopped by one event.

    A part that raises is recorded in `failures` (name -> exception), so the
    process can say why it stopped and exit with the failure's own code.
    """

    threads: list[threading.Thread]
    failures: dict[str, BaseException]

    def start(
        self, target: Callable[[threading.Event], None], name: str, stop: threading.Event
    ) -> threading.Thread:
        def run(stop: threading.Event) -> None:
            try:
                target(stop)
            except BaseException as exc:
                self.failures[name] = exc
                log.debug("%s stopped", name, exc_info=True)
                stop.set()

        thread = threading.Thread(target=run, args=(stop,), name=name, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread


ALL_PARTS = ("worker", "relay", "projections", "reconciler")


def heartbeat(
    settings: Settings, views_url: str, component: str, contact: GatewayContact | None = None
) -> Heartbeat:
    """The component's beats, in the read models' database (the event store's, or the
    in-process one of memory://), often enough for PROVISIONER_HEARTBEAT_MAX_AGE_S;
    with `contact`, when the process last had an answer from the gateway."""
    every = beat_interval_s(settings.heartbeat_max_age_s)
    answered = (lambda: contact.answered_at) if contact is not None else None
    return Heartbeat(views_url, component, every_s=every, answered_at=answered)


def pool_size(parts: tuple[str, ...], concurrency: int) -> int:
    """Event-store connections one process needs: one per hop thread, one more for the
    worker's consumer, and one each for the relay's, the projections' and the
    reconciler's reads of the log (docs/configuration.md has the arithmetic)."""
    size = concurrency + 1 if "worker" in parts else 0
    return size + sum(1 for part in ("relay", "projections", "reconciler") if part in parts)


@dataclass
class Runtime(_Threads):
    settings: Settings
    app: ProvisionerApplication
    gateway: Gateway
    service: ProvisioningService
    topology: Topology
    scheduler: DelayScheduler | None
    views_url: str = ""
    fake: FakeGateway | None = None
    pace: Pace | None = None
    audits: bool = False  # the reconciler runs the upstream audit (it calls the gateway)
    # When this process last had an answer from the gateway (None: it calls none).
    contact: GatewayContact | None = None
    gateway_url: str = ""
    threads: list[threading.Thread] = field(default_factory=list)
    failures: dict[str, BaseException] = field(default_factory=dict)

    def beats(self, component: str) -> Heartbeat:
        return heartbeat(self.settings, self.views_url, component, self.contact)

    def watch_gateway(self, stop: threading.Event) -> None:
        """Until the gateway first answers this process, an ERROR line every 30 s
        (worker/gateway_watch.py), on a daemon thread that ends then; not one of the
        process's parts (its end stops nothing)."""
        if self.contact is None:
            return
        watch = GatewayWatch(self.gateway, self.contact, self.gateway_url)
        threading.Thread(target=watch.run, args=(stop,), name="gateway-watch", daemon=True).start()

    def worker(self, concurrency: int | None = None) -> HopWorker:
        return HopWorker(
            self.service,
            self.settings.broker_url,
            topology=self.topology,
            concurrency=concurrency or self.settings.concurrency,
            scheduler=self.scheduler,
            database_url=self.settings.database_url,
            tls=self.settings.broker_tls(),
            scopes=self.settings.scopes(),
            heartbeat=self.beats("worker"),
        )

    def _broker(self) -> Broker:
        s = self.settings
        return Broker(s.broker_url, self.topology, scheduler=self.scheduler, tls=s.broker_tls())

    def relay(self) -> Relay:
        url = self.settings.database_url
        positions = open_position_store(url, create_table=not is_postgres(url))
        broker = self._broker()
        beats = self.beats("relay")
        return Relay(self.app, broker, positions, database_url=url, heartbeat=beats)

    def projector(self, batch: int = 2000) -> Projector:
        return Projector(
            self.app,
            self.views_url,
            database_url=self.settings.database_url,
            batch=batch,
            heartbeat=self.beats("projections"),
        )

    def reconciler(
        self,
        *,
        overdue_s: float = OVERDUE_S,
        grace_s: float = GRACE_S,
        interval_s: float = 30.0,
        deadline_s: float | None = None,
    ) -> tuple[Reconciler, Broker]:
        broker = self._broker()
        reconciler = Reconciler(
            self.views_url,
            overdue_s=overdue_s,
            grace_s=grace_s,
            interval_s=interval_s,
            deadline_s=deadline_s or self.settings.attempt_deadline_s,
            service=self.service,
            stuck_after_s=self.settings.health_stuck_after_s,
            orphan_window_s=self.settings.inference_window_s,
            heartbeat=self.beats("reconciler"),
            heartbeat_max_age_s=self.settings.heartbeat_max_age_s,
        )
        if self.audits:
            every, findings = self.settings.audit_every_s, FindingsWriter(self.views_url)
            reconciler.audit = AuditSchedule(self.service, every, findings=findings)
        return reconciler, broker


def family_wait_s(timeout_s: float, retries: int = 2) -> float:
    """How long a hop waits for a shared family read it joined: the read in flight and
    its own, each with every retry at the gateway's timeout, and a margin for the
    pace's turn and the listing's transfer."""
    return 2 * (retries + 1) * timeout_s + 30.0


def pace_store(
    settings: Settings, gateway_url: str, *, calls: bool, stop: threading.Event | None = None
) -> PaceStore:
    """The fleet's shared pace in PostgreSQL (one row per gateway) for a process that
    calls the gateway; in the process's memory otherwise (SQLite and memory://,
    where `run` alone calls it). `stop`: a full database is waited for until then."""
    if calls and is_postgres(settings.database_url):
        return PgPaceStore(settings.database_url, gateway_url, stop=stop)
    return MemoryPaceStore()


@contextmanager
def build(
    settings: Settings,
    *,
    fake_config: FakeConfig | None = None,
    parts: tuple[str, ...] = ALL_PARTS,
    concurrency: int | None = None,
    stop: threading.Event | None = None,
) -> Iterator[Runtime]:
    """Everything one process needs; closes it all on exit.

    A process that runs the worker calls the gateway: it needs
    PROVISIONER_GATEWAY_URL and its token, or PROVISIONER_FAKE_GATEWAY=1 for
    the in-process fake (ConfigurationError otherwise, before anything
    connects). With memory:// the in-process delay scheduler runs too. The
    database is waited for while it is unavailable (until `stop`).
    """
    # The reconciler audits upstream (PROVISIONER_AUDIT_EVERY_S) beside a worker, or on
    # its own when the gateway is configured; it then calls the gateway, paced too.
    audits = "reconciler" in parts and settings.audit_every_s > 0
    audits = audits and ("worker" in parts or settings.gateway_url is not None)
    calls = "worker" in parts or audits
    chosen = settings.gateway() if calls else ("http://127.0.0.1:9", "no-calls")
    if chosen is not None:  # a certificate that does not verify: exit 4, nothing started
        refuse_unverified(chosen[0], settings.gateway_ca_file)
    with ExitStack() as stack:
        size = pool_size(parts, concurrency or settings.concurrency)
        app = open_event_store(settings.database_url, pool_size=size, wait_s=None, stop=stop)
        stack.callback(app.close)
        fake = None
        if chosen is None:
            fake = stack.enter_context(
                FakeGateway(fake_config or FakeConfig(), parents=settings.parents())
            )
            url, token = fake.url, "embedded-fake"
            log.info("PROVISIONER_FAKE_GATEWAY=1: the in-process fake gateway at %s", url)
        else:
            url, token = chosen
        store = pace_store(settings, url, calls=calls, stop=stop)
        pace = Pace(store, settings.pace(), on_event=metrics.observe_pace)
        stack.callback(pace.close)
        contact = GatewayContact() if calls else None
        observe = contact.observing(metrics.observe_gateway) if contact else metrics.observe_gateway
        gateway = stack.enter_context(
            HttpGateway(
                url,
                token,
                read_timeout=settings.gateway_timeout_s,
                observe=observe,
                pace=pace,
                ca_file=settings.gateway_ca_file,
                on_family_share=metrics.observe_family_share,
                on_bytes=metrics.observe_bytes,
            )
        )
        # The hop threads share their family reads, per parent, each never staler than
        # its own; a caller waits at most for the read in flight and the next one.
        shared = SharedFamilyReads(
            gateway,
            wait_s=family_wait_s(settings.gateway_timeout_s),
            on_ask=metrics.observe_family_ask,
        )
        topology = Topology(queue_type=settings.queue_type)
        scheduler = None
        if is_memory(settings.broker_url):
            scheduler = DelayScheduler(Broker(settings.broker_url, topology, scheduler=None))
            stack.callback(scheduler.stop)
        # The configured token never reaches an event or a log through a producer's text.
        secrets = (settings.gateway_token,) if settings.gateway_token else ()
        engine = settings.engine(acting=calls)
        service = ProvisioningService(app, shared, settings=engine, secrets=secrets)
        views_url = settings.database_url
        if urlsplit(views_url).scheme == "memory":
            views_url = memory_views_url()
            # An in-process database lives while one connection to it is open.
            stack.enter_context(SqlViewStore(views_url)).setup()
        yield Runtime(
            settings,
            app,
            gateway,
            service,
            topology,
            scheduler,
            views_url,
            fake,
            pace,
            audits,
            contact,
            url,
        )


@dataclass
class ProjectorRuntime(_Threads):
    """What `provisioner projections run` needs: the event store and nothing else."""

    settings: Settings
    app: ProvisionerApplication
    threads: list[threading.Thread] = field(default_factory=list)
    failures: dict[str, BaseException] = field(default_factory=dict)

    def projector(self, batch: int = 2000) -> Projector:
        url = self.settings.database_url
        beats = heartbeat(self.settings, url, "projections")
        return Projector(self.app, url, database_url=url, batch=batch, heartbeat=beats)


@contextmanager
def build_projector(
    settings: Settings, *, stop: threading.Event | None = None
) -> Iterator[ProjectorRuntime]:
    if urlsplit(settings.database_url).scheme == "memory":
        raise ConfigurationError(
            "a memory:// event store lives in one process: use `provisioner run`"
        )
    size = pool_size(("projections",), 0)
    app = open_event_store(settings.database_url, pool_size=size, wait_s=None, stop=stop)
    try:
        yield ProjectorRuntime(settings, app)
    finally:
        app.close()
