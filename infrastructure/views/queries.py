"""What readers ask the read models (docs/read-models.md, "Queries"): a brand's
pointer, and attempts by state, brand, age or overdue hop."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from infrastructure.store.eventstore import APP_NAME, RELAY_NAME
from infrastructure.views.store import PROJECTIONS, SqlViewStore
from projections.core import TS, Row


def brand_workspace(store: SqlViewStore, brand_id: str) -> Row | None:
    """The brand's row of `brand_workspaces` (the pointer the host platform reads)."""
    found = store.rows(PROJECTIONS["brand_workspaces"], "brand_id = ?", [brand_id])
    return found[0] if found else None


def list_attempts(
    store: SqlViewStore,
    *,
    state: str | None = None,
    stuck: bool = False,
    overdue_s: float = 60.0,
    since: datetime | None = None,
    brand_id: str | None = None,
    limit: int = 100,
    now: datetime | None = None,
    stuck_after: tuple[datetime, str] | None = None,
) -> list[Row]:
    """Rows of `attempts`, newest first. Stuck = pending with the next hop overdue
    by more than `overdue_s`, most overdue first; `stuck_after` (the last row's
    next_hop_due and attempt_id) pages through them."""
    where: list[str] = []
    params: list[Any] = []
    to_db = store.dialect.to_db
    if stuck:
        cutoff = (now or datetime.now(UTC)) - timedelta(seconds=overdue_s)
        where += ["state = 'pending'", "next_hop_due < ?"]
        params.append(to_db(TS, cutoff))
        if stuck_after is not None:
            due = to_db(TS, stuck_after[0])
            where.append("(next_hop_due > ? OR (next_hop_due = ? AND attempt_id > ?))")
            params += [due, due, stuck_after[1]]
    elif state:
        where.append("state = ?")
        params.append(state)
    if since is not None:
        where.append("started_at >= ?")
        params.append(to_db(TS, since))
    if brand_id is not None:
        where.append("brand_id = ?")
        params.append(brand_id)
    order = "next_hop_due, attempt_id" if stuck else "started_at DESC"
    return store.rows(
        PROJECTIONS["attempts"], " AND ".join(where), params, order=order, limit=limit
    )


def list_brands(
    store: SqlViewStore,
    *,
    status: str | None = None,
    reason: str | None = None,
    after: str | None = None,
    limit: int = 100,
) -> list[Row]:
    """Rows of `brand_workspaces` by brand id (after the id `after`): those with this
    status, and those whose current attempt failed for this reason."""
    where: list[str] = []
    params: list[Any] = []
    for column, value in (("status", status), ("failure_reason", reason)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if after is not None:
        where.append("brand_id > ?")
        params.append(after)
    table = PROJECTIONS["brand_workspaces"]
    return store.rows(table, " AND ".join(where), params, order="brand_id", limit=limit)


def count_attempts(
    store: SqlViewStore, *, stuck_overdue_s: float, now: datetime | None = None
) -> dict[str, int]:
    """Pending attempts, those overdue by more than `stuck_overdue_s`, ended attempts
    that owe a release, and those still owing one `stuck_overdue_s` after they ended
    (the health checks' and the gauges' figures)."""
    name = PROJECTIONS["attempts"].name
    since = (now or datetime.now(UTC)) - timedelta(seconds=stuck_overdue_s)
    cutoff = store.dialect.to_db(TS, since)
    pending = f"SELECT count(*) AS n FROM {name} WHERE state = 'pending'"
    owed = f"SELECT count(*) AS n FROM {name} WHERE state <> 'pending' AND release_owed > 0"
    return {
        "pending": int(store.scalar(pending)),
        "stuck": int(store.scalar(f"{pending} AND next_hop_due < ?", cutoff)),
        "releases_owed": int(store.scalar(owed)),
        "releases_stuck": int(store.scalar(f"{owed} AND finished_at < ?", cutoff)),
    }


def count_degraded(store: SqlViewStore) -> int:
    """Brands bound to a workspace the gateway reported terminal on re-confirm."""
    name = PROJECTIONS["brand_workspaces"].name
    return int(store.scalar(f"SELECT count(*) AS n FROM {name} WHERE status = 'degraded'"))


def relay_position(store: SqlViewStore) -> int:
    """The relay's tracked position in the log (0 before its first batch)."""
    table = f"{RELAY_NAME}_tracking" if store.dialect.postgres else "tracking"
    sql = f"SELECT max(notification_id) AS n FROM {table} WHERE application_name = ?"
    return int(store.scalar(sql, APP_NAME) or 0)
