"""The reconciler: nothing stays pending forever, nothing owed stays unreleased.

Each sweep reads the projections and re-publishes what should have happened:
- a hop for every pending attempt whose next hop is overdue by `overdue_s`;
- a release for every ended attempt that has owed one for `grace_s`;
- a decommission for every deactivated brand still bound `grace_s` later.

Every message it sends is one the engine handles idempotently (a hop that is
not the attempt's expected one changes nothing; releases and decommissions
re-check the attempt and the claims first), so it is safe to run anywhere, any
number of times, beside a healthy relay. Re-publishing is enough to end every
attempt: each hop that runs either ends it or schedules the next, and the hop
budget fails it `exhausted` at the end.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

from prometheus_client import Counter

from infrastructure import messages
from infrastructure.broker import Broker
from infrastructure.views import PROJECTIONS, SqlViewStore, list_attempts

log = logging.getLogger("provisioner.reconciler")
REPUBLISHED = Counter(
    "provisioner_reconciled_total", "Messages the reconciler re-published, by type", ["type"]
)


@dataclass
class SweepReport:
    hops: int = 0
    releases: int = 0
    decommissions: int = 0

    @property
    def total(self) -> int:
        return self.hops + self.releases + self.decommissions


class Reconciler:
    def __init__(
        self,
        views_url: str,
        *,
        overdue_s: float = 60.0,
        grace_s: float = 60.0,
        limit: int = 1000,
        interval_s: float = 30.0,
    ) -> None:
        self.views_url = views_url
        self.overdue_s = overdue_s
        self.grace_s = grace_s
        self.limit = limit
        self.interval_s = interval_s

    def sweep(
        self, store: SqlViewStore, broker: Broker, now: datetime | None = None
    ) -> SweepReport:
        now = now or datetime.now(UTC)
        report = SweepReport()
        for row in list_attempts(
            store, stuck=True, overdue_s=self.overdue_s, limit=self.limit, now=now
        ):
            broker.publish(messages.hop(UUID(row["attempt_id"]), row["next_hop"]))
            report.hops += 1
        before = store.dialect.to_db("ts", now - timedelta(seconds=self.grace_s))
        owed = store.rows(
            PROJECTIONS["attempts"],
            # A pending attempt's surplus is released when the attempt ends.
            "release_owed > 0 AND state <> 'pending' AND updated_at < ?",
            [before],
            limit=self.limit,
        )
        for row in owed:
            broker.publish(messages.release(UUID(row["attempt_id"])))
            report.releases += 1
        bound = store.rows(
            PROJECTIONS["brand_workspaces"],
            "lifecycle = 'deactivated' AND workspace_id IS NOT NULL AND updated_at < ?",
            [before],
            limit=self.limit,
        )
        for row in bound:
            broker.publish(messages.decommission(row["brand_id"]))
            report.decommissions += 1
        for kind, count in (("hop", report.hops), ("release", report.releases),
                            ("decommission", report.decommissions)):  # fmt: skip
            if count:
                REPUBLISHED.labels(kind).inc(count)
        if report.total:
            log.warning(
                "re-published %d hops, %d releases, %d decommissions",
                report.hops, report.releases, report.decommissions,
            )  # fmt: skip
        return report

    def run(self, stop: threading.Event, broker: Broker) -> None:
        """Sweep every `interval_s` until `stop` is set; a failure is logged and retried."""
        while not stop.is_set():
            try:
                with SqlViewStore(self.views_url) as store:
                    store.check()
                    self.sweep(store, broker)
            except Exception as exc:  # noqa: BLE001 - supervise: log, retry next interval
                log.warning("reconciler sweep failed (%s: %s)", type(exc).__name__, exc)
            stop.wait(self.interval_s)
