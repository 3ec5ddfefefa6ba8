"""Heartbeats of the background components, in the database beside their positions.

One row per component in `provisioner_heartbeats` (component, process as
host:pid, started_at, beat_at; epoch seconds of the writer's clock), written
with one upsert at most every `every_s` while the component's loop turns. The
table is created on the first beat (under the schema lock on PostgreSQL), so a
database set up before heartbeats existed needs nothing done.

A beat that cannot be written is logged (once, until one succeeds again) and
never stops the component: the beat goes stale and the health checks say so.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from domain.liveness import Beat
from infrastructure.eventstore import SCHEMA_LOCK_KEY
from infrastructure.view_connection import ViewConnection

log = logging.getLogger("provisioner.heartbeat")
TABLE = "provisioner_heartbeats"


def process_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _create(conn: ViewConnection) -> None:
    number = "double precision" if conn.dialect.postgres else "real"
    with conn._tx() as cur:  # a table of its own, on the read models' connection
        if conn.dialect.postgres:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_KEY,))
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {TABLE} (component text PRIMARY KEY, "
            f"process text NOT NULL, started_at {number} NOT NULL, beat_at {number} NOT NULL)"
        )


def record(conn: ViewConnection, beat: Beat) -> None:
    """Upsert the component's row."""
    p = conn.dialect.p
    with conn._tx() as cur:
        cur.execute(
            f"INSERT INTO {TABLE} (component, process, started_at, beat_at) "  # noqa: S608
            f"VALUES ({p}, {p}, {p}, {p}) ON CONFLICT (component) DO UPDATE SET "
            "process = excluded.process, started_at = excluded.started_at, "
            "beat_at = excluded.beat_at",
            (beat.component, beat.process, beat.started_at, beat.beat_at),
        )


def read_beats(conn: ViewConnection) -> dict[str, Beat]:
    """Every component's last beat; none before the first beat made the table."""
    with conn._tx(immediate=False) as cur:
        if conn.dialect.postgres:
            exists = cur.execute("SELECT to_regclass(%s) AS n", (TABLE,)).fetchone()
            found = exists is not None and dict(exists)["n"] is not None
        else:
            found = (
                cur.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
                ).fetchone()
                is not None
            )
        if not found:
            return {}
        rows = cur.execute(
            f"SELECT component, process, started_at, beat_at FROM {TABLE} ORDER BY component"  # noqa: S608
        ).fetchall()
    beats = [dict(row) for row in rows]
    return {
        b["component"]: Beat(
            b["component"], b["process"], float(b["started_at"]), float(b["beat_at"])
        )
        for b in beats
    }


class Heartbeat:
    """Beats for one component of this process. `url` None: beats nothing (a
    component built outside a runtime, as in tests)."""

    def __init__(
        self,
        url: str | None,
        component: str,
        *,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.component = component
        self.every_s = every_s
        self.clock = clock
        self.process = process_identity()
        self.started_at = clock()
        self._conn: ViewConnection | None = None
        self._created = False
        self._last = -1e18  # monotonic time of the last beat written
        self._failing = False
        self._lock = threading.Lock()

    def beat(self, via: ViewConnection | None = None) -> bool:
        """Record a beat unless one was recorded less than `every_s` ago; True if written.
        `via`: the component's own open connection to that database, used instead of
        one of the heartbeat's (which is closed then: no connection more than needed)."""
        if self.url is None or time.monotonic() - self._last < self.every_s:
            return False
        with self._lock:
            try:
                self._write(via)
            except Exception as exc:  # noqa: BLE001 - a lost beat goes stale, the work goes on
                self._lost(exc, via)
                return False
        return True

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """`stop.wait(seconds)`, beating meanwhile; True if `stop` was set."""
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            stop.wait(min(left, self.every_s))
            if not stop.is_set():
                self.beat()
        return stop.is_set()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            self._created = False

    def _write(self, via: ViewConnection | None) -> None:
        assert self.url is not None
        if via is not None and self._conn is not None:
            self._drop()
        if via is None and self._conn is None:
            self._conn = ViewConnection(self.url, wait_s=0)
        conn = via or self._conn
        assert conn is not None
        if not self._created:
            _create(conn)
            self._created = True
        record(conn, Beat(self.component, self.process, self.started_at, self.clock()))
        self._last = time.monotonic()
        if self._failing:
            log.info("heartbeat of the %s recorded again", self.component)
            self._failing = False

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # a broken connection is dropped either way
                log.debug("closing the heartbeat connection failed", exc_info=True)
        self._conn = None

    def _lost(self, exc: Exception, via: ViewConnection | None) -> None:
        if via is None:
            self._drop()
        self._created = False
        self._last = time.monotonic()  # tried: the next try after every_s
        level = logging.DEBUG if self._failing else logging.WARNING
        log.log(level, "heartbeat of the %s not recorded: %s", self.component, exc)
        self._failing = True
