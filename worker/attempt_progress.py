"""An attempt's "why, and what next?" (`domain.progress`) from its aggregate, as the
fields `provisioner status` and the web view show (the JSON of `status` too)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.liveness import Liveness, liveness
from domain.progress import AttemptFacts, BrandStanding, Fleet, Progress, progress
from infrastructure.settings.engine import EngineSettings
from infrastructure.views.connection import ViewConnection
from infrastructure.views.heartbeats import read_beats

# What `progress_fields` adds to a record, in the order shown.
FIELDS = (
    "reason",
    "advice",
    "parent",
    "progress",
    "deferral",
    "hop",
    "settle_hops",
    "max_hop",
    "budget_left",
    "next_hop_at",
    "fails_after",
    "deferred_row",
    "down_since",
)


def facts(
    attempt: ProvisioningAttempt, engine: EngineSettings, parents: Collection[str] | None
) -> AttemptFacts:
    """The plain values of an attempt that `domain.progress` decides on. `parents`: those
    this service acts under (None: not configured here, so not judged)."""
    pending = not attempt.is_terminal
    return AttemptFacts(
        state=attempt.state,
        hop=attempt.expected_hop,
        settle_hops=attempt.settle_hops,
        max_hop=attempt.max_hop,
        parent_id=attempt.parent_workspace_id,
        failure_reason=attempt.failure_reason,
        failure_message=attempt.last_status if attempt.failure_reason else None,
        last_status=attempt.last_status,
        # Hop 0 is due when the attempt started (nothing scheduled it).
        next_hop_at=(attempt.not_before or attempt.created_on) if pending else None,
        deadline_at=attempt.created_on + timedelta(seconds=engine.deferral.deadline_s)
        if pending
        else None,
        deferred_in_row=attempt.deferred_in_row,
        unavailable_since=attempt.unavailable_since,
        parent_allowed=None if parents is None else attempt.parent_workspace_id in parents,
    )


def brand_facts(brand: Brand) -> BrandStanding:
    return BrandStanding(
        brand.is_active,
        brand.workspace_id is not None,
        brand.to_be_emptied_at,
        brand.emptying_refused,
    )


def fleet(database_url: str, max_age_s: float, now: datetime) -> Fleet | None:
    """The relay's liveness from its heartbeat (None when it cannot be read: an
    in-process store, or the database does not answer; never seen: not judged)."""
    if database_url.startswith("memory:"):
        return None
    try:
        with ViewConnection(database_url, wait_s=0) as conn:
            beat = read_beats(conn).get("relay")
    except Exception:  # noqa: BLE001 - the advice goes on without it
        return None
    if beat is None or liveness(beat, now.timestamp(), max_age_s) is not Liveness.SILENT:
        return Fleet()
    return Fleet(relay_silent_since=datetime.fromtimestamp(beat.beat_at + max_age_s, now.tzinfo))


def progress_of(
    attempt: ProvisioningAttempt,
    engine: EngineSettings,
    now: datetime,
    parents: Collection[str] | None = None,
    *,
    brand: BrandStanding | None = None,
    deployment: Fleet | None = None,
) -> Progress:
    return progress(facts(attempt, engine, parents), now, engine.backoff, brand, deployment)


def progress_fields(
    attempt: ProvisioningAttempt | None,
    engine: EngineSettings,
    now: datetime,
    parents: Collection[str] | None = None,
    *,
    brand: BrandStanding | None = None,
    deployment: Fleet | None = None,
) -> dict[str, Any]:
    """The FIELDS of an attempt (all None without one)."""
    if attempt is None:
        return dict.fromkeys(FIELDS)
    said = progress_of(attempt, engine, now, parents, brand=brand, deployment=deployment)
    pending = not attempt.is_terminal
    return {
        "reason": said.reason,
        "advice": said.advice,
        "parent": attempt.parent_workspace_id,
        "progress": said.step,
        "deferral": said.deferral,
        "hop": attempt.expected_hop if pending else None,
        "settle_hops": attempt.settle_hops,
        "max_hop": attempt.max_hop,
        "budget_left": said.budget_left,
        "next_hop_at": said.next_hop_at,
        "fails_after": said.fails_after,
        "deferred_row": attempt.deferred_in_row if pending else None,
        "down_since": attempt.unavailable_since if attempt.deferred_in_row else None,
    }
