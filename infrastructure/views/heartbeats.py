"""Heartbeats of each process's components, in the database beside their positions.

One row per process and component in `provisioner_processes` (component, process
as host:pid, host, pid, version, concurrency, in_flight, handled, started_at,
beat_at, gateway_answered_at; times in epoch seconds of the writer's clock),
written with one upsert at most every `every_s` while the component's loop turns.
A component's liveness is its newest beat among the processes (`read_beats`). The
table is created on a process's first beat (under the schema lock on PostgreSQL),
so a database set up before it existed needs nothing done; rows not beaten for a
day are deleted then (`PRUNE_AFTER_S`).

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
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from domain.liveness import Beat, newest
from infrastructure.store.eventstore import SCHEMA_LOCK_KEY
from infrastructure.views.connection import ViewConnection

log = logging.getLogger("provisioner.heartbeat")
TABLE = "provisioner_processes"
PRUNE_AFTER_S = 86_400.0  # a row not beaten for this long goes at a process's start
COLUMNS = (
    "component",
    "process",
    "host",
    "pid",
    "version",
    "concurrency",
    "in_flight",
    "handled",
    "started_at",
    "beat_at",
    "gateway_answered_at",
)
# What a component says of its work at each beat: (concurrency, in flight, handled).
Gauges = Callable[[], tuple[int | None, int | None, int | None]]


def package_version() -> str:
    try:
        return version("workspace-provisioner")
    except PackageNotFoundError:  # run from a tree that was not installed
        return "unknown"


def _create(conn: ViewConnection, now: float) -> None:
    number = "double precision" if conn.dialect.postgres else "real"
    with conn._tx() as cur:  # a table of its own, on the read models' connection
        if conn.dialect.postgres:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_KEY,))
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {TABLE} (component text NOT NULL, "
            "process text NOT NULL, host text NOT NULL, pid integer NOT NULL, "
            "version text NOT NULL, concurrency integer, in_flight integer, handled bigint, "
            f"started_at {number} NOT NULL, beat_at {number} NOT NULL, "
            f"gateway_answered_at {number}, PRIMARY KEY (component, process))"
        )
        p = conn.dialect.p
        cur.execute(f"DELETE FROM {TABLE} WHERE beat_at < {p}", (now - PRUNE_AFTER_S,))


def record(conn: ViewConnection, beat: Beat) -> None:
    """Upsert the row of the beat's process and component."""
    p = conn.dialect.p
    updated = ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[2:])
    with conn._tx() as cur:
        cur.execute(
            f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) "
            f"VALUES ({', '.join([p] * len(COLUMNS))}) "
            f"ON CONFLICT (component, process) DO UPDATE SET {updated}",
            tuple(getattr(beat, c) for c in COLUMNS),
        )


def _exists(conn: ViewConnection, cur: Any) -> bool:
    if conn.dialect.postgres:
        exists = cur.execute("SELECT to_regclass(%s) AS n", (TABLE,)).fetchone()
        return exists is not None and dict(exists)["n"] is not None
    found = "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?"
    return cur.execute(found, (TABLE,)).fetchone() is not None


def read_processes(conn: ViewConnection) -> list[Beat]:
    """Every process's last beat of each component, newest first; none before the
    first beat made the table."""
    with conn._tx(immediate=False) as cur:
        if not _exists(conn, cur):
            return []
        rows = cur.execute(
            f"SELECT {', '.join(COLUMNS)} FROM {TABLE} ORDER BY beat_at DESC"
        ).fetchall()
    return [_beat(dict(row)) for row in rows]


def _beat(row: dict[str, Any]) -> Beat:
    def number(key: str) -> float | None:
        return None if row[key] is None else float(row[key])

    def count(key: str) -> int | None:
        return None if row[key] is None else int(row[key])

    return Beat(
        str(row["component"]),
        str(row["process"]),
        float(row["started_at"]),
        float(row["beat_at"]),
        str(row["host"]),
        int(row["pid"]),
        str(row["version"]),
        count("concurrency"),
        count("in_flight"),
        count("handled"),
        number("gateway_answered_at"),
    )


def read_beats(conn: ViewConnection) -> dict[str, Beat]:
    """Each component's newest beat among every process's (its liveness)."""
    return newest(read_processes(conn))


class Heartbeat:
    """Beats for one component of this process. `url` None: beats nothing (a
    component built outside a runtime, as in tests). `gauges`: what the component
    says of its work at each beat (a worker: threads, in flight, handled);
    `answered_at`: when this process last had an HTTP answer from the gateway."""

    def __init__(
        self,
        url: str | None,
        component: str,
        *,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        gauges: Gauges | None = None,
        answered_at: Callable[[], float | None] | None = None,
    ) -> None:
        self.url = url
        self.component = component
        self.every_s = every_s
        self.clock = clock
        self.gauges = gauges
        self.answered_at = answered_at
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.process = f"{self.host}:{self.pid}"
        self.version = package_version()
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
        now = self.clock()
        if not self._created:
            _create(conn, now)
            self._created = True
        record(conn, self.current(now))
        self._last = time.monotonic()
        if self._failing:
            log.info("heartbeat of the %s recorded again", self.component)
            self._failing = False

    def current(self, now: float) -> Beat:
        """The beat this process would record now."""
        threads, in_flight, handled = self.gauges() if self.gauges else (None, None, None)
        answered = self.answered_at() if self.answered_at else None
        return Beat(
            self.component,
            self.process,
            self.started_at,
            now,
            self.host,
            self.pid,
            self.version,
            threads,
            in_flight,
            handled,
            answered,
        )

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
