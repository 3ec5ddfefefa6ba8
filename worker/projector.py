"""The projection runner: keeps every projection's live copy caught up with the log.

One runner per database is the normal deployment (inside `provisioner run`, or
`provisioner projections run`). A second one is harmless: its batches fail the
position compare-and-set and roll back. On PostgreSQL it sleeps on LISTEN (the
event store NOTIFYs on every save); on SQLite it polls.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from prometheus_client import Counter, Gauge

from infrastructure.failures import ReconnectPauses
from infrastructure.outages import Outage, refusal
from infrastructure.store.eventstore import ProvisionerApplication, is_postgres
from infrastructure.views.heartbeats import Heartbeat
from infrastructure.views.log_source import LogSource
from infrastructure.views.store import PROJECTIONS, SqlViewStore
from projections.core import Projection, catch_up, rebuild
from worker.relay import _Poller, _PostgresListener

log = logging.getLogger("provisioner.projections")
PROJECTED = Counter(
    "provisioner_projected_events_total", "Events applied to projections", ["projection"]
)
POSITION = Gauge(
    "provisioner_projection_position", "Notification id a projection applied up to", ["projection"]
)


class Projector:
    def __init__(
        self,
        app: ProvisionerApplication,
        views_url: str,
        *,
        database_url: str,
        projections: Sequence[Projection] = tuple(PROJECTIONS.values()),
        poll_s: float = 0.2,
        batch: int = 2000,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.app = app
        self.views_url = views_url
        self.database_url = database_url
        self.projections = projections
        self.poll_s = poll_s
        self.batch = batch
        self.applied = 0
        self._upgraded = False
        self.heartbeat = heartbeat or Heartbeat(None, "projections")

    def upgrade(self, store: SqlViewStore) -> None:
        """Rebuild (without downtime) every projection whose live copy older code built."""
        for projection in store.outdated():
            if projection not in self.projections:
                continue
            log.warning("projection %s changed meaning: rebuilding it", projection.name)
            copy = rebuild(projection, LogSource(self.app, store), store, limit=5000)
            log.info("projection %s rebuilt as %s", projection.name, copy)
        self._upgraded = True

    def step(self, store: SqlViewStore) -> int:
        """Catch every projection up; return how many events were applied."""
        if not self._upgraded:
            self.upgrade(store)
        source = LogSource(self.app)
        done = 0
        for projection in self.projections:
            count = catch_up(projection, source, store, limit=self.batch)
            if count:
                PROJECTED.labels(projection.name).inc(count)
                POSITION.labels(projection.name).set(store.position(projection)[1])
            done += count
        self.applied += done
        return done

    def run(self, stop: threading.Event) -> None:
        """Follow the log until `stop` is set; a failure backs off and resumes.

        Resuming is always safe: each batch committed its rows and its position
        together, so the runner starts again exactly where the last one ended.
        A database outage is logged once, and its end once; a database that
        refuses us for good (credentials, no such database) raises ServiceRefused.
        """
        backoff = ReconnectPauses()
        outage = Outage(log, "projections", self.database_url, announce_start=False)
        while not stop.is_set():
            try:
                with SqlViewStore(self.views_url) as store, self._listener() as wait:
                    store.setup()
                    while not stop.is_set():
                        applied = self.step(store)
                        self.heartbeat.beat(store)
                        outage.up()
                        backoff.reset()
                        if applied == 0:
                            wait(stop)
            except Exception as exc:  # noqa: BLE001 - a refusal ends the runner, the rest waits
                refused = refusal(exc, database_url=self.database_url)
                if refused is not None:
                    raise refused from None
                pause = backoff.next()
                outage.failed(self.database_url, exc, pause)
                self.heartbeat.wait(stop, pause)
        self.heartbeat.close()

    def _listener(self) -> _PostgresListener | _Poller:
        if is_postgres(self.database_url):
            return _PostgresListener(self.database_url, self.poll_s)
        return _Poller(self.poll_s)
