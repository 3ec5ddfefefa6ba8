"""The peer's one row per brand (bench/peer.py): the request sets a fresh attempt id,
and a provision binds its workspace only by compare-and-set on that attempt id.

No driver is imported here: every function takes a DB-API connection whose
`execute` returns a cursor (psycopg 3 and sqlite3 both do) and the driver's
placeholder ("%s" for psycopg, "?" for sqlite3), so that a unit test can run the
same statements on SQLite.
"""

from __future__ import annotations

from typing import Any, Protocol

SCHEMA = """
CREATE TABLE IF NOT EXISTS brands (
    brand_id     TEXT PRIMARY KEY,
    attempt_id   TEXT NOT NULL,
    state        TEXT NOT NULL,
    workspace_id TEXT,
    reason       TEXT,
    requested_at DOUBLE PRECISION NOT NULL,
    ready_at     DOUBLE PRECISION
)
"""

# A new request replaces the attempt id, whatever the row held: a provision still
# running for the old attempt can no longer bind.
_REQUEST = (
    "INSERT INTO brands (brand_id, attempt_id, state, requested_at) VALUES ({p}, {p}, "
    "'requested', {p}) ON CONFLICT (brand_id) DO UPDATE SET attempt_id = excluded.attempt_id, "
    "state = 'requested', workspace_id = NULL, reason = NULL, "
    "requested_at = excluded.requested_at, ready_at = NULL"
)
# The compare-and-set: the row is bound only while it still names this attempt.
_BIND = (
    "UPDATE brands SET workspace_id = {p}, state = 'ready', ready_at = {p} "
    "WHERE brand_id = {p} AND attempt_id = {p}"
)
# A failure is recorded the same way, and never over a binding.
_FAIL = (
    "UPDATE brands SET state = 'failed', reason = {p} "
    "WHERE brand_id = {p} AND attempt_id = {p} AND state <> 'ready'"
)
_TALLY = (
    "SELECT count(*) FILTER (WHERE state = 'ready'), count(*) FILTER (WHERE state = 'failed'), "
    "count(*), max(ready_at) FROM brands"
)


class Connection(Protocol):
    def execute(self, sql: Any, params: Any = ...) -> Any: ...


def statement(template: str, placeholder: str = "%s") -> str:
    return template.format(p=placeholder)


def create_table(conn: Connection) -> None:
    conn.execute(SCHEMA)


def request(conn: Connection, brand: str, attempt: str, at: float, placeholder: str = "%s") -> None:
    """Record a request for `brand` as attempt `attempt` (a new id per request)."""
    conn.execute(statement(_REQUEST, placeholder), (brand, attempt, at))


def bind(
    conn: Connection,
    brand: str,
    attempt: str,
    workspace: str,
    at: float,
    placeholder: str = "%s",
) -> bool:
    """Bind `workspace` to `brand` if `attempt` is still its attempt: True when bound,
    False when a later request superseded it (the workspace is then left unbound)."""
    cursor = conn.execute(statement(_BIND, placeholder), (workspace, at, brand, attempt))
    return bool(cursor.rowcount == 1)


def fail(conn: Connection, brand: str, attempt: str, reason: str, placeholder: str = "%s") -> bool:
    """Mark the attempt failed if it is still the brand's and not bound: True if marked."""
    cursor = conn.execute(statement(_FAIL, placeholder), (reason, brand, attempt))
    return bool(cursor.rowcount == 1)


def tally(conn: Connection) -> tuple[int, int, int, float | None]:
    """(ready, failed, rows, latest ready_at) over the table."""
    ready, failed, rows, last = conn.execute(_TALLY).fetchone()
    return int(ready), int(failed), int(rows), None if last is None else float(last)


def poll_delay(poll: int, base_s: float, cap_s: float) -> float:
    """Seconds before status poll `poll` (1 = the first after the one right after the
    create): `base_s` doubled each time, at most `cap_s`."""
    return float(min(cap_s, base_s * 2.0 ** max(0, poll - 1)))
