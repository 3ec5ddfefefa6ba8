"""The heartbeat checks: is the relay, the projections runner, the reconciler alive,
and can the work waiting advance (some worker alive)?

Each reads the components' last beats from `StoredFacts` (infrastructure/
heartbeats.py writes them) and decides with `domain.liveness`: a beat older
than `PROVISIONER_HEARTBEAT_MAX_AGE_S` fails the check (the component stopped
or hangs), since the moment it became too old; a component never seen in this
database is degraded (a warning: not deployed, or not started yet), never
failing. The `workers` check fails when attempts are pending or messages wait
in the hop and command queues and no worker beat within the threshold.

Which process runs which (`fleet_checks`): docs/operations.md, "The fleet".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from domain.liveness import Beat, FleetVerdict, Liveness, age_s, liveness, workers_verdict
from worker.health.results import Check, Degraded, Unhealthy

COMPONENTS = ("relay", "projections", "reconciler")
# What to start when a component is missing.
_COMMANDS = {
    "relay": "provisioner relay",
    "projections": "provisioner projections run",
    "reconciler": "provisioner reconcile",
}


# The parts of the deployment whose silence slows a part's work without stopping it:
# their heartbeat checks degrade (never fail) the readiness of a process that runs it.
# A worker's next hops come from the relay, and the reconciler is its backstop; the
# reconciler reads the projections and re-publishes what the relay would have.
WAITS_ON = {
    "worker": ("relay", "reconciler"),
    "relay": (),
    "projections": (),
    "reconciler": ("relay", "projections"),
}


def check_name(component: str) -> str:
    return f"{component}_heartbeat"


def heartbeat_check(
    facts: Callable[[], dict[str, Any]],
    component: str,
    max_age_s: float,
    *,
    clock: Callable[[], float] = time.time,
) -> Callable[[], str]:
    def check() -> str:
        value = facts()["heartbeats"]
        if isinstance(value, Exception):
            raise value
        if value is None:
            return "not tracked in an in-process store"
        beats: dict[str, Beat] = value
        beat, now = beats.get(component), clock()
        state = liveness(beat, now, max_age_s)
        if beat is None:  # Liveness.NEVER_SEEN
            raise Degraded(
                f"no {component} has ever run against this database (not deployed, or not "
                f"started yet): `{_COMMANDS[component]}` or `provisioner run` starts one"
            )
        age = age_s(beat, now)
        if state is Liveness.SILENT:
            raise Unhealthy(
                f"the {component} has not beaten for {age:.0f} s (threshold {max_age_s:g} s; "
                f"last seen in {beat.process}): it stopped or hangs",
                datetime.fromtimestamp(beat.beat_at + max_age_s, UTC),
            )
        return f"beat {age:.0f} s ago in {beat.process}"

    return check


def as_warning(check: Callable[[], str]) -> Callable[[], str]:
    """The check, a failure of which only degrades (the detail and since kept)."""

    def warn() -> str:
        try:
            return check()
        except Degraded:
            raise
        except Unhealthy as exc:
            raise Degraded(str(exc), exc.since) from None

    return warn


def workers_check(
    facts: Callable[[], dict[str, Any]],
    max_age_s: float,
    queued: Callable[[], int | None] | None = None,
    *,
    clock: Callable[[], float] = time.time,
) -> Callable[[], str]:
    """Fails while work waits and no worker beat within `max_age_s` (`domain.liveness.
    workers_verdict`): pending attempts, and the messages in the hop and command
    queues (`queued`, read only then: one AMQP connection)."""

    def check() -> str:
        found = facts()
        processes = found["processes"]
        if isinstance(processes, Exception):
            raise processes
        if processes is None:
            return "not tracked in an in-process store"
        workers = [b for b in processes if b.component == "worker"]
        now = clock()
        if any(liveness(b, now, max_age_s) is Liveness.ALIVE for b in workers):
            return workers_verdict(workers, now, max_age_s, 0, 0).detail
        pending = found["pending"]
        pending = 0 if isinstance(pending, Exception) else int(pending or 0)
        waiting = None
        if queued is not None:
            try:
                waiting = queued()
            except Exception:  # noqa: BLE001 - the broker check says why; attempts still count
                waiting = None
        judged = workers_verdict(workers, now, max_age_s, pending, waiting)
        if judged.verdict is FleetVerdict.FAILING:
            since = datetime.fromtimestamp(judged.since, UTC) if judged.since else None
            raise Unhealthy(judged.detail, since)
        return judged.detail

    return check


def fleet_checks(
    facts: Callable[[], dict[str, Any]],
    parts: tuple[str, ...],
    max_age_s: float,
    queued: Callable[[], int | None] | None = None,
) -> list[Check]:
    """The liveness checks of a process running `parts` (all four: `health`): the
    heartbeat of each part it runs (failing), of each part those wait on (degraded
    only), and, but for the projections alone, `workers` (failing: nothing advances)."""
    checks: list[Check] = []
    waited = {c for part in parts for c in WAITS_ON.get(part, ())}
    for component in COMPONENTS:
        if component in parts:
            checks.append((check_name(component), heartbeat_check(facts, component, max_age_s)))
        elif component in waited:
            check = heartbeat_check(facts, component, max_age_s)
            checks.append((check_name(component), as_warning(check)))
    if parts != ("projections",):
        checks.append(("workers", workers_check(facts, max_age_s, queued)))
    return checks
