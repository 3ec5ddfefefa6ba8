"""Whether a background component is alive, from its last heartbeat (pure).

Each process records a beat per component it runs (the worker, the relay, the
projections runner, the reconciler) in the database at most every few seconds
while the component's loop turns; a component's liveness is its newest beat
among every process's. Read back:

- no beat on record: it has never run against this database (a new
  deployment, or one that does not run it): `NEVER_SEEN`, a warning;
- its last beat at most `max_age_s` old: `ALIVE`;
- older: it ran and stopped, or hangs: `SILENT`, a failure, since the moment
  the beat became too old.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum


class Liveness(Enum):
    ALIVE = "alive"
    NEVER_SEEN = "never_seen"
    SILENT = "silent"


@dataclass(frozen=True, slots=True)
class Beat:
    """A component's last heartbeat in one process: who beat (host:pid) and when
    (epoch seconds); what the process says of itself (its package version, and for a
    worker its threads, deliveries in flight and handled); and when the process last
    had any HTTP answer from the gateway (None: never, or it does not call it)."""

    component: str
    process: str
    started_at: float
    beat_at: float
    host: str = ""
    pid: int = 0
    version: str = ""
    concurrency: int | None = None
    in_flight: int | None = None
    handled: int | None = None
    gateway_answered_at: float | None = None


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


def newest(beats: Iterable[Beat]) -> dict[str, Beat]:
    """Each component's newest beat among every process's: the component's liveness."""
    found: dict[str, Beat] = {}
    for beat in beats:
        if beat.component not in found or beat.beat_at > found[beat.component].beat_at:
            found[beat.component] = beat
    return found


# -- what the deployment comes to ------------------------------------------------


class FleetVerdict(Enum):
    OK = "ok"
    DEGRADED = "degraded"  # a warning: the work goes on, slower or by a backstop
    FAILING = "failing"


@dataclass(frozen=True, slots=True)
class Judged:
    verdict: FleetVerdict
    detail: str
    since: float | None = None  # epoch seconds, when the verdict became true if known


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def workers_verdict(
    workers: Sequence[Beat], now: float, max_age_s: float, pending: int, queued: int | None
) -> Judged:
    """Whether the work waiting can advance: some worker beat within `max_age_s`, or
    there is nothing to do (`pending` attempts, `queued` messages in the hop and
    command queues; None: not known). No worker alive while work waits fails: nothing
    advances, whatever else runs."""
    alive = [b for b in workers if liveness(b, now, max_age_s) is Liveness.ALIVE]
    if alive:
        threads = sum(b.concurrency or 0 for b in alive)
        busy = sum(b.in_flight or 0 for b in alive)
        return Judged(FleetVerdict.OK, f"{len(alive)} alive ({threads} threads, {busy} in flight)")
    last = max(workers, key=lambda b: b.beat_at, default=None)
    seen = (
        "no worker has ever beaten in this database"
        if last is None
        else f"last worker beat {_ago(age_s(last, now))} ago ({last.process})"
    )
    work = [_count(pending, "attempt") + " pending"] if pending else []
    if queued:
        work.append(_count(queued, "message") + " queued")
    if not work:
        return Judged(FleetVerdict.OK, f"no worker alive, and no work waits ({seen})")
    since = None if last is None else last.beat_at + max_age_s
    return Judged(
        FleetVerdict.FAILING,
        f"no worker alive: {', '.join(work)}, {seen}; start `provisioner worker`",
        since,
    )


def gateway_silence(ever_answered: bool) -> FleetVerdict:
    """A gateway that gives no answer: an outage (hops deferred, degraded) once any
    process of the deployment had an answer from it; until then a configuration error
    (a wrong PROVISIONER_GATEWAY_URL waits for nothing): failing."""
    return FleetVerdict.DEGRADED if ever_answered else FleetVerdict.FAILING
