"""The heartbeat checks: is the relay, the projections runner, the reconciler alive?

Each reads the components' last beats from `StoredFacts` (infrastructure/
heartbeats.py writes them) and decides with `domain.liveness`: a beat older
than `PROVISIONER_HEARTBEAT_MAX_AGE_S` fails the check (the component stopped
or hangs), since the moment it became too old; a component never seen in this
database is degraded (a warning: not deployed, or not started yet), never
failing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from domain.liveness import Beat, Liveness, age_s, liveness
from worker.health_results import Degraded, Unhealthy

COMPONENTS = ("relay", "projections", "reconciler")
# What to start when a component is missing.
_COMMANDS = {
    "relay": "provisioner relay",
    "projections": "provisioner projections run",
    "reconciler": "provisioner reconcile",
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
