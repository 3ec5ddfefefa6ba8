"""Whether a background component is alive, from its last heartbeat (pure).

A component (the relay, the projections runner, the reconciler) records a beat
in the database at most every few seconds while its loop turns. Read back:

- no beat on record: it has never run against this database (a new
  deployment, or one that does not run it): `NEVER_SEEN`, a warning;
- its last beat at most `max_age_s` old: `ALIVE`;
- older: it ran and stopped, or hangs: `SILENT`, a failure, since the moment
  the beat became too old.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Liveness(Enum):
    ALIVE = "alive"
    NEVER_SEEN = "never_seen"
    SILENT = "silent"


@dataclass(frozen=True, slots=True)
class Beat:
    """A component's last heartbeat: who beat (host:pid) and when (epoch seconds)."""

    component: str
    process: str
    started_at: float
    beat_at: float


def liveness(beat: Beat | None, now: float, max_age_s: float) -> Liveness:
    if beat is None:
        return Liveness.NEVER_SEEN
    if now - beat.beat_at > max_age_s:
        return Liveness.SILENT
    return Liveness.ALIVE


def age_s(beat: Beat, now: float) -> float:
    """Seconds since the beat (never negative: the writer's clock may run ahead)."""
    return max(0.0, now - beat.beat_at)


def beat_interval_s(max_age_s: float) -> float:
    """How often a component beats: four beats per allowed age, at most every 5 s."""
    return max(0.05, min(5.0, max_age_s / 4))
