"""The relay: follows the notification log and publishes what the events imply.

Position and publishing: read a batch after the tracked position, publish every
message it implies (all sent, then the publisher confirms awaited once), then
record the batch's last notification id. A crash between publishing and recording re-publishes that
batch on restart: harmless, since hops are idempotent and integration events
carry a stable `event_id`. Only one relay should run per database (a second
one would only duplicate messages, never lose them; its position write fails
on the tracking table and it re-reads).

On PostgreSQL it sleeps on LISTEN (the event store NOTIFYs on every save); on
SQLite and in memory it polls.
"""

from __future__ import annotations

import logging
import select
import threading
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import psycopg
from eventsourcing.persistence import IntegrityError, TrackingRecorder

from infrastructure.broker.outbox import (
    TOPICS,
    IntegrationEvent,
    OutboxMapper,
    Work,
    load_position,
    save_position,
)
from infrastructure.broker.publisher import Broker
from infrastructure.failures import ReconnectPauses
from infrastructure.outages import Outage, refusal, which_service
from infrastructure.store.eventstore import (
    EVENTS_TABLE,
    ProvisionerApplication,
    postgres_conninfo,
)
from infrastructure.views.heartbeats import Heartbeat
from worker.health import metrics

log = logging.getLogger("provisioner.relay")


@dataclass
class RelayStats:
    events: int = 0
    work_published: int = 0
    events_published: int = 0
    position: int = 0


class Relay:
    def __init__(
        self,
        app: ProvisionerApplication,
        broker: Broker,
        positions: TrackingRecorder,
        *,
        database_url: str,
        batch_size: int = 500,
        poll_s: float = 0.2,
        linger_s: float = 0.01,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.app = app
        self.broker = broker
        self.positions = positions
        self.database_url = database_url
        self.batch_size = batch_size
        self.poll_s = poll_s
        self.linger_s = linger_s
        self.mapper = OutboxMapper(app)
        self.heartbeat = heartbeat or Heartbeat(None, "relay")
        self.stats = RelayStats(position=load_position(positions))

    def pump(self) -> int:
        """Publish one batch after the tracked position; return how many events it held."""
        notes = self.app.recorder.select_notifications(
            start=self.stats.position + 1, limit=self.batch_size, topics=TOPICS
        )
        if not notes:
            return 0
        work: list[Work] = []
        integration: list[IntegrationEvent] = []
        events = [self.app.mapper.to_domain_event(note) for note in notes]
        for event in events:
            implied_work, implied_events = self.mapper.map(event)
            work += implied_work
            integration += implied_events
        # One batch: every message sent, then the broker's confirms awaited once.
        self.broker.publish_many(
            [(item.message, item.delay_s) for item in work],
            [(out.routing_key, out.payload) for out in integration],
        )
        self.stats.work_published += len(work)
        self.stats.events_published += len(integration)
        for item in work:
            metrics.RELAYED.labels(item.message.type).inc()
        for out in integration:
            metrics.RELAYED.labels(out.routing_key).inc()
        last = notes[-1].id
        try:
            save_position(self.positions, last)
        except IntegrityError:
            # Another relay recorded this position first: follow it from there.
            log.warning("position %d already recorded elsewhere; re-reading", last)
            self.stats.position = load_position(self.positions)
            return len(notes)
        self.stats.position = last
        self.stats.events += len(notes)
        for event in events:  # counted once this batch is on record as published
            metrics.count_ended(event)
        return len(notes)

    def run(self, stop: threading.Event) -> None:
        """Pump until `stop` is set, sleeping on LISTEN/NOTIFY or polling when idle.

        A failure (broker or database down, restarting, or dropping the
        connection) never ends the relay: the position is recorded only after a
        batch is published, so it backs off, opens a fresh listener and re-reads
        from the recorded position (re-publishing is harmless). It logs the
        outage once and the recovery once. A broker or database that refuses us
        for good (credentials, no such vhost or database) raises ServiceRefused.
        """
        backoff = ReconnectPauses()
        outage = Outage(log, "relay", self.broker.url, announce_start=False)
        while not stop.is_set():
            try:
                with self._listener() as wait:
                    # Connected before the first event needs it: a broker that
                    # refuses us is known at start, not at the first publish.
                    self.broker.declare()
                    while not stop.is_set():
                        published = self.pump()
                        self.heartbeat.beat()
                        outage.up()
                        backoff.reset()
                        if published < self.batch_size:
                            # Caught up: sleep until a save notifies, then linger a
                            # moment so that one read and one batch of confirms
                            # covers the saves committing meanwhile (under load a
                            # wake-up per save cost a query, a tracking write and a
                            # confirm round trip each).
                            wait(stop)
                            stop.wait(self.linger_s)
            except Exception as exc:  # noqa: BLE001 - a refusal ends the relay, the rest waits
                urls = {"broker_url": self.broker.url, "database_url": self.database_url}
                refused = refusal(exc, **urls)
                if refused is not None:
                    raise refused from None
                pause = backoff.next()
                outage.failed(which_service(exc, **urls), exc, pause)
                self.heartbeat.wait(stop, pause)
        self.heartbeat.close()

    def _listener(self) -> Any:
        if self.database_url.startswith(("postgresql://", "postgres://")):
            return _PostgresListener(self.database_url, self.poll_s)
        return _Poller(self.poll_s)


class _Poller:
    def __init__(self, poll_s: float) -> None:
        self.poll_s = poll_s

    def __enter__(self) -> Any:
        return lambda stop: stop.wait(self.poll_s)

    def __exit__(self, *exc: object) -> None:
        return None


class _PostgresListener:
    """LISTEN on the event table's channel; wake on NOTIFY or after `timeout_s`."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.conn: psycopg.Connection[Any] | None = None

    def __enter__(self) -> Any:
        self.conn = psycopg.connect(postgres_conninfo(self.url), autocommit=True)
        self.conn.execute(f"LISTEN {EVENTS_TABLE}")
        return self._wait

    def _wait(self, stop: threading.Event) -> None:
        assert self.conn is not None
        if stop.is_set():
            return
        readable, _, _ = select.select([self.conn.fileno()], [], [], self.timeout_s)
        if readable:
            # Drain every pending notification; one batch read covers them all.
            for _ in self.conn.notifies(timeout=0, stop_after=1000):
                pass

    def __exit__(self, *exc: object) -> None:
        if self.conn is not None:
            with suppress(Exception):
                self.conn.close()
