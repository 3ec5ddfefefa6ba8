"""What the web view reads, and only reads: the read models (brands, attempts, lag),
the event store (a brand's audit trail) and the dead-letter queue (looked at, never
consumed). Each page opens what it needs and closes it before it renders."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from domain.errors import UnknownAttempt
from domain.progress import BrandStanding, Progress
from infrastructure.broker.dead_letters import PAGE, DeadLetters, EmbeddedBroker, NotFound, now
from infrastructure.broker.failures import broker_failure
from infrastructure.broker.outbox import TOPICS
from infrastructure.broker.topology import Topology
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.model import Settings
from infrastructure.store.eventstore import open_event_store
from infrastructure.usecases.reads import is_unicode_text
from infrastructure.views.audit import attempt_story, brand_history, brand_status
from infrastructure.views.audit_findings import read_audits
from infrastructure.views.log_source import LogSource
from infrastructure.views.queries import list_attempts, relay_position
from infrastructure.views.store import PROJECTIONS, SqlViewStore
from projections.core import TS
from worker.attempt_progress import brand_facts, fleet, progress_of
from worker.health.report import check_once, gateway_check
from worker.health.results import CheckResult
from worker.web.timeline import hop_strip, with_durations

STATUSES = ("ready", "degraded", "pending", "failed", "cancelled", "none", "deactivated")
BRANDS_SHOWN = 100  # a page of the brand list (`?after=` the last one for the next)
LINKED_SHOWN = 100  # attempts a workspace page lists


GATEWAY_NOT_CALLED = (
    "not checked: this page calls the gateway only when PROVISIONER_WEB_TOKEN is set "
    "(then with Authorization: Bearer <token>); `provisioner health` checks it"
)


class GatewayProbe:
    """The health page's gateway check, kept for the server's life: its answer serves
    every request for a minute, and its call waits for the fleet's pace. Without a web
    token no page calls the gateway: the check says how to allow it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._check: Callable[[], str] | None = None

    def __call__(self) -> str:
        s = self.settings
        if not s.web_token and s.gateway_url is not None and not s.fake_gateway:
            return GATEWAY_NOT_CALLED
        with self._lock:
            if self._check is None:
                self._check = gateway_check(s)
            check = self._check
        return check()


def _like(text: str) -> str:
    escaped = text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _attempts_by_id(store: SqlViewStore, ids: list[str]) -> dict[str, dict[str, Any]]:
    if not ids:
        return {}
    marks = ", ".join("?" * len(ids))
    found = store.rows(PROJECTIONS["attempts"], f"attempt_id IN ({marks})", ids)
    return {row["attempt_id"]: row for row in found}


def _utc(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)


@dataclass(frozen=True)
class Reads:
    settings: Settings

    @contextmanager
    def store(self) -> Iterator[SqlViewStore]:
        s = self.settings
        with SqlViewStore(s.database_url, read_only=True, wait_s=s.connect_wait_s) as store:
            store.check()
            yield store

    @contextmanager
    def service(self) -> Iterator[ProvisioningService]:
        s = self.settings
        app = open_event_store(
            s.database_url, one_shot=True, read_only=True, wait_s=s.connect_wait_s
        )
        try:
            # The audit trail only replays streams: no gateway call is ever made.
            gateway = HttpGateway("http://127.0.0.1:9", "read-only")
            yield ProvisioningService(app, gateway, settings=s.engine())
        finally:
            app.close()

    def brands(
        self,
        status: str | None,
        search: str | None,
        after: str | None = None,
        *,
        reason: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> dict[str, Any]:
        """A page of brands by id (after the id `after`), the counts by status of all,
        how many match, and each row's current attempt from `attempts` (its failure).
        `reason`: the current attempt failed for it; `since`, `until`: the brand's row
        last changed (its status: when it failed, for a failed one) in that span."""
        where: list[str] = []
        params: list[Any] = []
        if status:
            where.append("status = ?")
            params.append(status)
        if reason:
            where.append("failure_reason = ?")
            params.append(reason)
        if search:
            where.append("(lower(brand_id) LIKE ? ESCAPE '\\' OR lower(title) LIKE ? ESCAPE '\\')")
            params += [_like(search), _like(search)]
        table = PROJECTIONS["brand_workspaces"]
        with self.store() as store:
            for column, op, at in (("updated_at", ">=", since), ("updated_at", "<=", until)):
                if at is not None:
                    where.append(f"{column} {op} ?")
                    params.append(store.dialect.to_db(TS, at))
            matching = " AND ".join(where)
            paged = " AND ".join([*where, "brand_id > ?"]) if after else matching
            rows = store.rows(
                table,
                paged,
                [*params, *([after] if after else [])],
                order="brand_id",
                limit=BRANDS_SHOWN + 1,
            )
            count = f"SELECT count(*) AS n FROM {table.name}"  # noqa: S608 - values bound
            matched = int(store.scalar(f"{count} WHERE {matching}" if matching else count, *params))
            counts = {s: int(store.scalar(f"{count} WHERE status = ?", s)) for s in STATUSES}
            ids = [r["attempt_id"] for r in rows[:BRANDS_SHOWN] if r["attempt_id"]]
            attempts = _attempts_by_id(store, ids)
        shown = rows[:BRANDS_SHOWN]
        for row in shown:
            row["attempt"] = attempts.get(row["attempt_id"] or "")
        more = len(rows) > BRANDS_SHOWN
        return {
            "rows": shown,
            "counts": counts,
            "matched": matched,
            "next_after": shown[-1]["brand_id"] if more else None,
        }

    def brand(self, brand_id: str) -> dict[str, Any]:
        """The brand's state, its current attempt's "why, and what next?", and its
        history newest first (UnknownBrand if it was never registered), each attempt
        with its row of `attempts` (what it still owes) when projected."""
        with self.service() as service:
            status = brand_status(service, brand_id)
            history = brand_history(service, brand_id)
            current = status["attempt_id"]
            brand = brand_facts(service.brand(brand_id))
            said = self._progress(service, current, brand) if current else None
        with self.store() as store:
            rows = {r["attempt_id"]: r for r in list_attempts(store, brand_id=brand_id, limit=1000)}
        for item in history:
            if item["kind"] == "attempt":
                item["row"] = rows.get(item["attempt_id"])
                due = said.next_hop_at if said and item["attempt_id"] == current else None
                item["strip"] = hop_strip(item["events"], due)
                item["events"] = with_durations(item["events"])[::-1]  # newest first, too
        return {"status": status, "history": history[::-1], "progress": said}

    def attempt(self, attempt_id: UUID) -> dict[str, Any]:
        """One attempt: its story, its row of `attempts`, its "why, and what next?" and
        its hops on a strip (UnknownAttempt if there is none)."""
        with self.service() as service:
            story = attempt_story(service, attempt_id)
            said = self._progress(service, str(attempt_id))
        with self.store() as store:
            row = _attempts_by_id(store, [str(attempt_id)]).get(str(attempt_id))
        strip = hop_strip(story["events"], said.next_hop_at if said else None)
        story["events"] = with_durations(story["events"])
        return {"story": story, "row": row, "progress": said, "strip": strip}

    def workspace(self, workspace_id: str) -> dict[str, Any]:
        """Who a workspace belongs to: the brand bound to it, the brand its claim names,
        and the attempts that had it as a candidate or created it."""
        with self.service() as service:
            claim = service.claim(workspace_id) if is_unicode_text(workspace_id) else None
        literal = workspace_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        pattern = f'%"{literal}"%'  # as the JSON list holds it
        with self.store() as store:
            bound = store.rows(PROJECTIONS["brand_workspaces"], "workspace_id = ?", [workspace_id])
            attempts = store.rows(
                PROJECTIONS["attempts"],
                "candidate_id = ? OR created_ids LIKE ? ESCAPE '\\'",
                [workspace_id, pattern],
                order="started_at DESC",
                limit=LINKED_SHOWN,
            )
        claimed = None
        if claim is not None and claim.brand_id is not None:
            claimed = {
                "brand_id": claim.brand_id,
                "attempt_id": str(claim.attempt_id),
                "releasing": claim.releasing_by is not None,
            }
        return {"bound": bound, "attempts": attempts, "claim": claimed}

    def _progress(
        self, service: ProvisioningService, attempt_id: str, brand: BrandStanding | None = None
    ) -> Progress | None:
        try:
            attempt = service.attempt(UUID(attempt_id))
        except (ValueError, UnknownAttempt):
            return None
        now = datetime.now(UTC)
        deployment = fleet(self.settings.database_url, self.settings.heartbeat_max_age_s, now)
        return progress_of(
            attempt,
            service.settings,
            now,
            self.settings.parent_ids,
            brand=brand,
            deployment=deployment,
        )

    def stuck(self, overdue_s: float) -> list[dict[str, Any]]:
        with self.store() as store:
            return list_attempts(store, stuck=True, overdue_s=overdue_s, limit=500)

    def dead_letters(self, after: str | None = None) -> dict[str, Any]:
        """A page of dead letters (`PAGE` of them), from the one after `after`."""
        url = self.settings.broker_url
        topology = Topology(queue_type=self.settings.queue_type)
        try:
            with DeadLetters(url, topology, tls=self.settings.broker_tls()) as letters:
                page = letters.page(PAGE, after)
        except EmbeddedBroker as exc:
            return {"notice": str(exc), "letters": []}
        except NotFound as exc:
            return {"notice": str(exc), "letters": [], "paged": True}
        except Exception as exc:
            failure = broker_failure(exc, url)
            if failure is None:
                raise
            return {"error": str(failure), "letters": []}
        at = now()
        letters_shown = [letter.summary(at) for letter in page.letters]
        return {"letters": letters_shown, "next_after": page.after, "paged": after is not None}

    def dead_letter(self, letter_id: str) -> dict[str, Any]:
        """One dead letter in full: its summary, headers and body (as text, undecodable
        bytes replaced); `missing` when no letter has this id (or a unique prefix)."""
        url = self.settings.broker_url
        topology = Topology(queue_type=self.settings.queue_type)
        try:
            with DeadLetters(url, topology, tls=self.settings.broker_tls()) as letters:
                letter = letters.show(letter_id)
        except EmbeddedBroker as exc:
            return {"notice": str(exc)}
        except LookupError as exc:  # no such id, or a prefix of several
            return {"missing": str(exc)}
        except Exception as exc:
            failure = broker_failure(exc, url)
            if failure is None:
                raise
            return {"error": str(failure)}
        return {
            "letter": letter.summary(now()),
            "headers": sorted(letter.headers.items()),
            "body": letter.body.decode("utf-8", "replace"),
        }

    def audit(self) -> list[dict[str, Any]]:
        """Each parent's last recorded upstream audit (the reconciler's), by parent id,
        and every configured parent never audited yet (`audit` None); no gateway call."""
        with self.store() as store:
            recorded = {a.parent_id: a for a in read_audits(store)}
        parents = sorted({*recorded, *(self.settings.parent_ids or ())})
        return [
            {
                "parent_id": p,
                "audit": recorded.get(p),
                "at": _utc(recorded[p].audited_at) if p in recorded else None,
            }
            for p in parents
        ]

    def health(self, gateway: Callable[[], str]) -> list[CheckResult]:
        """Every check, once, as `provisioner health` runs them; the gateway's by
        `gateway` (a `GatewayProbe`)."""
        return check_once(self.settings, gateway)

    def lag(self) -> dict[str, Any]:
        s = self.settings
        in_process = urlsplit(s.database_url).scheme == "memory"
        app = open_event_store(
            s.database_url, one_shot=True, read_only=True, wait_s=s.connect_wait_s
        )
        try:
            with self.store() as store:
                projections = store.status(LogSource(app, None if in_process else store))
                relay: dict[str, Any] | None = None
                if not in_process:
                    position = relay_position(store)
                    table = app.recorder.events_table_name  # type: ignore[attr-defined]
                    relay = {
                        "position": position,
                        "behind": int(store.count_events(table, position, TOPICS)),
                    }
        finally:
            app.close()
        return {"projections": projections, "relay": relay, "at": datetime.now(UTC)}
