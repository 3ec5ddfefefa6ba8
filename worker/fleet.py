"""The workers view: each process of the deployment and each part it runs, from its
heartbeat row (`provisioner workers`, the web view's /workers)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from domain.liveness import Beat, Liveness, age_s, liveness
from infrastructure.views.connection import ViewConnection
from infrastructure.views.heartbeats import read_processes

COLUMNS = (
    "kind",
    "host",
    "pid",
    "version",
    "concurrency",
    "in_flight",
    "handled",
    "last_beat_s",
    "state",
    "gateway_answered_s",
)


def _at(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat()


def fleet_rows(beats: Sequence[Beat], now: float, max_age_s: float) -> list[dict[str, Any]]:
    """One row per process and part (`kind`), by kind and newest beat first: alive, or
    silent once its beat is older than `max_age_s` (PROVISIONER_HEARTBEAT_MAX_AGE_S,
    as the health checks judge)."""
    rows = []
    for beat in sorted(beats, key=lambda b: (b.component, -b.beat_at)):
        answered = beat.gateway_answered_at
        alive = liveness(beat, now, max_age_s) is Liveness.ALIVE
        rows.append(
            {
                "kind": beat.component,
                "process": beat.process,
                "host": beat.host,
                "pid": beat.pid,
                "version": beat.version,
                "concurrency": beat.concurrency,
                "in_flight": beat.in_flight,
                "handled": beat.handled,
                "last_beat_s": round(age_s(beat, now)),
                "state": "alive" if alive else "silent",
                "started_at": _at(beat.started_at),
                "beat_at": _at(beat.beat_at),
                "gateway_answered_s": None if answered is None else round(max(0.0, now - answered)),
            }
        )
    return rows


def read_fleet(url: str, max_age_s: float, *, wait_s: float = 0) -> list[dict[str, Any]]:
    """The rows of the database at `url`, read on one short connection."""
    with ViewConnection(url, read_only=True, wait_s=wait_s) as conn:
        beats = read_processes(conn)
    return fleet_rows(beats, time.time(), max_age_s)


def ago(seconds: int | None) -> str:
    """An age as a person reads it: 4 s, 12 min, 3.5 h; "never" for None."""
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"
