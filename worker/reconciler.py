"""The reconciler: nothing stays pending forever, nothing owed stays unreleased.

Each sweep reads the projections and re-publishes what should have happened:
- a hop for every pending attempt whose next hop is overdue by `overdue_s`;
- a release for every ended attempt (promoted ones included) that has owed one
  for `grace_s` (one owed for `stuck_after_s` after it ended is logged as stuck,
  with its brand and attempt); and, during `orphan_window_s` after it ended, a
  re-check (the same release message, counted apart: nothing is owed) for one whose
  create is unresolved or was given up unconfirmed (the workspace may still
  appear upstream: the release looks for it again, even after a later create
  succeeded) and for one failed `exhausted` (its shells, emptied while still
  `not ready`, are re-checked and emptied again if projects appeared);
- a decommission for every deactivated brand still bound `grace_s` after its
  retention window ended (`purge_at`): after a restart or a lost message too;
  not for one whose emptying the gateway refused for good (`emptying_refused`:
  an operator's `deactivate --purge-now` sends it again);
- and, given the service, it fails (`deadline`) every attempt still pending
  `deadline_s` after it started: one whose hops cannot run at all (its message
  dead-lettered every time) would otherwise stay pending forever.

Every message it sends is one the engine handles idempotently (a hop that is
not the attempt's expected one changes nothing; releases and decommissions
re-check the attempt and the claims first), so it is safe to run anywhere, any
number of times, beside a healthy relay. What it sent it does not send again
for `resend_s`, and stuck attempts are paged through, so a long worker outage
neither floods the queue nor starves the attempts beyond the first page.
Re-publishing is enough to end every attempt: each hop that runs either ends
it or schedules the next, and the hop budget fails it `exhausted` at the end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import UUID

from prometheus_client import Counter

from domain.liveness import Beat, Liveness, liveness
from infrastructure.broker import messages
from infrastructure.broker.publisher import Broker
from infrastructure.failures import ReconnectPauses
from infrastructure.outages import Outage, refusal, which_service
from infrastructure.service import ProvisioningService
from infrastructure.settings.table import default_of
from infrastructure.views.heartbeats import Heartbeat, read_processes
from infrastructure.views.queries import list_attempts
from infrastructure.views.store import PROJECTIONS, SqlViewStore
from projections.attempts import OWING
from projections.core import Row
from worker.audit_schedule import AuditSchedule

log = logging.getLogger("provisioner.reconciler")
OVERDUE_S = 60.0  # default: how long a hop may be overdue before it is re-published
GRACE_S = 60.0  # default: how long owed work waits before it is re-published
REPUBLISHED = Counter(
    "provisioner_reconciled_total", "Messages the reconciler re-published, by type", ["type"]
)


@dataclass
class SweepReport:
    hops: int = 0
    releases: int = 0  # owed: `provisioner_releases_owed` counts the same rows
    rechecks: int = 0  # nothing owed: within the orphan window, look for a late create
    decommissions: int = 0
    expired: int = 0
    stuck: int = 0  # owed releases still owed `stuck_after_s` after the attempt ended
    hop_brands: list[str] = field(default_factory=list)  # whose overdue hops were sent

    @property
    def total(self) -> int:
        return self.hops + self.releases + self.rechecks + self.decommissions + self.expired


def _since(beat: Beat, max_age_s: float) -> str:
    """When a beat became too old, as a UTC time of day (its date too if not today)."""
    at = datetime.fromtimestamp(beat.beat_at + max_age_s, UTC)
    return at.strftime("%H:%M:%S" if at.date() == datetime.now(UTC).date() else "%Y-%m-%d %H:%M:%S")


class Reconciler:
    """Sweeps the projections; remembers what it sent for `resend_s` so that an
    outage of the workers does not turn every sweep into the same burst."""

    # The upstream audit of each parent on its slow schedule, on a thread of its own
    # while `run` sweeps (set by the runtime when the process calls the gateway).
    audit: AuditSchedule | None = None

    def __init__(
        self,
        views_url: str,
        *,
        overdue_s: float = OVERDUE_S,
        grace_s: float = GRACE_S,
        limit: int = 1000,
        interval_s: float = 30.0,
        resend_s: float = 300.0,
        # The settings' defaults (a process passes the settings in effect).
        orphan_window_s: float = default_of("inference_window_s"),
        stuck_after_s: float = default_of("health_stuck_after_s"),
        deadline_s: float = default_of("attempt_deadline_s"),
        service: ProvisioningService | None = None,
        heartbeat: Heartbeat | None = None,
        heartbeat_max_age_s: float = default_of("heartbeat_max_age_s"),
    ) -> None:
        self.views_url = views_url
        self.heartbeat_max_age_s = heartbeat_max_age_s
        self.overdue_s = overdue_s
        self.grace_s = grace_s
        self.limit = limit
        self.interval_s = interval_s
        self.resend_s = resend_s
        self.orphan_window_s = orphan_window_s
        self.stuck_after_s = stuck_after_s
        self.deadline_s = deadline_s
        self.service = service
        self._sent: dict[tuple[str, str, int], float] = {}
        self.heartbeat = heartbeat or Heartbeat(None, "reconciler")

    def _fresh(self, kind: str, key: str, hop: int = 0) -> bool:
        """True (and remembered) unless this message went out less than resend_s ago."""
        now = time.monotonic()
        if now - self._sent.get((kind, key, hop), -1e18) < self.resend_s:
            return False
        self._sent[(kind, key, hop)] = now
        return True

    def _send(self, broker: Broker, message: messages.Message, key: tuple[str, str, int]) -> None:
        """Publish; a message the broker did not take is not remembered as sent."""
        try:
            broker.publish(message)
        except BaseException:
            self._sent.pop(key, None)
            raise

    def sweep(
        self, store: SqlViewStore, broker: Broker, now: datetime | None = None
    ) -> SweepReport:
        now = now or datetime.now(UTC)
        horizon = time.monotonic() - self.resend_s
        self._sent = {k: t for k, t in self._sent.items() if t > horizon}
        report = SweepReport()
        expired = self._expire(store, self.service, now) if self.service else set()
        report.expired = len(expired)
        for row in self._stuck(store, now):
            if report.hops >= self.limit:
                break
            if row["attempt_id"] not in expired and self._fresh(
                "hop", row["attempt_id"], row["next_hop"]
            ):
                message = messages.hop(UUID(row["attempt_id"]), row["next_hop"])
                self._send(broker, message, ("hop", row["attempt_id"], row["next_hop"]))
                report.hops += 1
                report.hop_brands.append(str(row["brand_id"]))
        stuck_before = now - timedelta(seconds=self.stuck_after_s)
        for row in self._owing(store, now):
            if self._fresh("release", row["attempt_id"]):
                message = messages.release(UUID(row["attempt_id"]))
                self._send(broker, message, ("release", row["attempt_id"], 0))
                if not row["release_owed"]:
                    report.rechecks += 1
                    continue
                report.releases += 1
                finished = row["finished_at"]
                if finished is not None and finished < stuck_before:
                    report.stuck += 1
                    log.warning(
                        "release still owed %.0f s after the attempt ended brand=%s attempt=%s "
                        "owed=%d; re-published (`provisioner history %s` says what failed)",
                        (now - finished).total_seconds(),
                        row["brand_id"],
                        row["attempt_id"],
                        row["release_owed"],
                        row["brand_id"],
                        extra={"brand": row["brand_id"], "attempt": row["attempt_id"]},
                    )
        before = store.dialect.to_db("ts", now - timedelta(seconds=self.grace_s))
        bound = self._due(store, before)
        for row in bound:
            if self._fresh("decommission", row["brand_id"]):
                message = messages.decommission(row["brand_id"])
                self._send(broker, message, ("decommission", row["brand_id"], 0))
                report.decommissions += 1
        for kind, count in (
            ("hop", report.hops),
            ("release", report.releases),
            ("recheck", report.rechecks),
            ("decommission", report.decommissions),
            ("expired", report.expired),
        ):
            if count:
                REPUBLISHED.labels(kind).inc(count)
        if report.total:
            log.warning(
                "re-published %d hops, %d owed releases (%d stuck), %d orphan re-checks, "
                "%d decommissions; %d attempts expired%s",
                report.hops,
                report.releases,
                report.stuck,
                report.rechecks,
                report.decommissions,
                report.expired,
                self._why(report, store, now),
                extra={"brand": report.hop_brands[0]} if len(report.hop_brands) == 1 else {},
            )
        return report

    def _why(self, report: SweepReport, store: SqlViewStore, now: datetime) -> str:
        """Why hops were sent again, and whose: they were overdue, because the relay is
        silent (since when, from its beat), no worker is alive, or neither is known."""
        if not report.hop_brands:
            return ""
        shown = ", ".join(report.hop_brands[:5])
        more = f" (+{len(report.hop_brands) - 5} more)" if len(report.hop_brands) > 5 else ""
        return (
            f"; the hops were overdue by more than {self.overdue_s:g} s (brands {shown}"
            f"{more}): {self._cause(store, now)}"
        )

    def _cause(self, store: SqlViewStore, now: datetime) -> str:
        """What the beats say of the relay and the workers (infrastructure/views/heartbeats.py)."""
        try:
            beats = read_processes(store)
        except Exception:
            log.debug("the heartbeats could not be read", exc_info=True)
            beats = []
        at, max_age = now.timestamp(), self.heartbeat_max_age_s
        relays = [b for b in beats if b.component == "relay"]
        workers = [b for b in beats if b.component == "worker"]
        if not relays and not workers:
            return "is the relay running, and a worker? `provisioner health` says"
        said: list[str] = []
        for name, found in (("relay", relays), ("worker", workers)):
            last = max(found, key=lambda b: b.beat_at, default=None)
            if last is None:
                said.append(f"no {name} has ever beaten in this database")
            elif liveness(last, at, max_age) is Liveness.SILENT:
                whom = "the relay is" if name == "relay" else "every worker is"
                said.append(
                    f"{whom} silent since {_since(last, max_age)} (last beat in {last.process})"
                )
        if not said:
            return (
                "the relay and a worker are alive: the hops' messages were lost (a purged "
                "queue, a broker that lost them) or the workers are behind"
            )
        return "; ".join(said)

    def _due(self, store: SqlViewStore, before: object) -> list[Row]:
        """Deactivated brands still bound whose retention window ended before `before`,
        but not those whose emptying the gateway refused for good. A live copy built
        before `purge_at` and `emptying_refused` (versions 4, 5) gets every deactivated
        bound brand until its rebuild switches: the decommission re-checks both."""
        where = "lifecycle = 'deactivated' AND workspace_id IS NOT NULL AND updated_at < ?"
        params = [before]
        if not any(p.name == "brand_workspaces" for p in store.outdated()):
            where += " AND (purge_at IS NULL OR purge_at < ?) AND emptying_refused IS NULL"
            params.append(before)
        return store.rows(PROJECTIONS["brand_workspaces"], where, params, limit=self.limit)

    def _expire(self, store: SqlViewStore, service: ProvisioningService, now: datetime) -> set[str]:
        """Fail the pending attempts past their deadline (the service re-checks each)."""
        cutoff = now - timedelta(seconds=self.deadline_s)
        rows = store.rows(
            PROJECTIONS["attempts"],
            "state = 'pending' AND started_at < ?",
            [store.dialect.to_db("ts", cutoff)],
            order="started_at",
            limit=self.limit,
        )
        return {
            row["attempt_id"] for row in rows if service.expire(UUID(row["attempt_id"]), cutoff)
        }

    def _stuck(self, store: SqlViewStore, now: datetime) -> Iterator[Row]:
        """Every overdue pending attempt, most overdue first, a page at a time."""
        after: tuple[datetime, str] | None = None
        while page := list_attempts(
            store, stuck=True, overdue_s=self.overdue_s, limit=500, now=now, stuck_after=after
        ):
            yield from page
            after = (page[-1]["next_hop_due"], page[-1]["attempt_id"])

    def _owing(self, store: SqlViewStore, now: datetime) -> list[Row]:
        """Ended attempts that owe a release; and during `orphan_window_s`, those whose
        unresolved or lost create may still show up upstream, and exhausted ones."""
        before = store.dialect.to_db("ts", now - timedelta(seconds=self.grace_s))
        window = store.dialect.to_db("ts", now - timedelta(seconds=self.orphan_window_s))
        if any(p.name == "attempts" for p in store.outdated()):
            # The live copy predates `create_lost` (version 2) until its rebuild
            # switches: the rule its columns allow meanwhile.
            where = (
                "state NOT IN ('pending', 'promoted') AND updated_at < ? AND "
                "(release_owed > 0 OR (create_unresolved = 1 AND finished_at > ?))"
            )
        else:
            # A pending attempt's surplus is released when the attempt ends; a
            # promoted one's (a create that lost its race, a lost create found
            # late) until its release is on record. An exhausted attempt's
            # shells are re-checked. (OWING, the partial index's condition) AND
            # (owed, or within the window).
            where = (
                f"state <> 'pending' AND updated_at < ? AND ({OWING}) "
                "AND (release_owed > 0 OR finished_at > ?)"
            )
        return store.rows(PROJECTIONS["attempts"], where, [before, window], limit=self.limit)

    def run(self, stop: threading.Event, broker: Broker) -> None:
        """Sweep every `interval_s` until `stop` is set. A failed sweep is tried again
        after a backoff pause (at most `interval_s`), the outage logged once and its
        end once; a service that refuses us for good raises ServiceRefused."""
        if self.audit is not None:
            threading.Thread(target=self.audit.run, args=(stop,), name="audit", daemon=True).start()
        backoff = ReconnectPauses()
        outage = Outage(log, "reconciler", self.views_url, announce_start=False)
        urls = {"broker_url": broker.url, "database_url": self.views_url}
        while not stop.is_set():
            try:
                broker.declare()  # a refusal is known at start, not when work is overdue
                with SqlViewStore(self.views_url) as store:
                    store.check()
                    self.sweep(store, broker)
            except Exception as exc:  # noqa: BLE001 - a refusal ends the sweeps, the rest waits
                refused = refusal(exc, **urls)
                if refused is not None:
                    raise refused from None
                pause = min(backoff.next(), self.interval_s)
                outage.failed(which_service(exc, **urls), exc, pause)
                self.heartbeat.wait(stop, pause)
                continue
            self.heartbeat.beat()
            outage.up()
            backoff.reset()
            self.heartbeat.wait(stop, self.interval_s)
        self.heartbeat.close()
