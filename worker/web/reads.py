"""What the web view reads, and only reads: the read models (brands, attempts, lag),
the event store (a brand's audit trail) and the dead-letter queue (looked at, never
consumed). Each page opens what it needs and closes it before it renders."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from infrastructure.audit import brand_history, brand_status
from infrastructure.broker import Topology
from infrastructure.broker_failures import broker_failure
from infrastructure.dead_letters import PAGE, DeadLetters, EmbeddedBroker, NotFound, now
from infrastructure.eventstore import open_event_store
from infrastructure.gateway import HttpGateway
from infrastructure.outbox import TOPICS
from infrastructure.service import ProvisioningService
from infrastructure.settings import Settings
from infrastructure.view_queries import list_attempts, relay_position
from infrastructure.views import PROJECTIONS, LogSource, SqlViewStore

STATUSES = ("ready", "degraded", "pending", "failed", "cancelled", "none", "deactivated")
BRANDS_SHOWN = 500


def _like(text: str) -> str:
    escaped = text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


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

    def brands(self, status: str | None, search: str | None) -> list[dict[str, Any]]:
        where: list[str] = []
        params: list[Any] = []
        if status:
            where.append("status = ?")
            params.append(status)
        if search:
            where.append("(lower(brand_id) LIKE ? ESCAPE '\\' OR lower(title) LIKE ? ESCAPE '\\')")
            params += [_like(search), _like(search)]
        with self.store() as store:
            return store.rows(
                PROJECTIONS["brand_workspaces"],
                " AND ".join(where),
                params,
                order="brand_id",
                limit=BRANDS_SHOWN + 1,
            )

    def brand(self, brand_id: str) -> dict[str, Any]:
        """The brand's state and its history (UnknownBrand if it was never registered),
        each attempt with its row of `attempts` (what it still owes) when projected."""
        with self.service() as service:
            status = brand_status(service, brand_id)
            history = brand_history(service, brand_id)
        with self.store() as store:
            rows = {r["attempt_id"]: r for r in list_attempts(store, brand_id=brand_id, limit=1000)}
        for item in history:
            if item["kind"] == "attempt":
                item["row"] = rows.get(item["attempt_id"])
        return {"status": status, "history": history}

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
