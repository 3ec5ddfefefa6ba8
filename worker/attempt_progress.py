"""An attempt's "why, and what next?" (`domain.progress`) from its aggregate, as the
fields `provisioner status` and the web view show (the JSON of `status` too)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from domain.attempt import ProvisioningAttempt
from domain.progress import AttemptFacts, Progress, progress
from infrastructure.service import EngineSettings

# What `progress_fields` adds to a record, in the order shown.
FIELDS = ("reason", "advice", "parent", "progress", "deferral", "hop", "settle_hops", "max_hop",
          "budget_left", "next_hop_at", "fails_after", "deferred_row", "down_since")  # fmt: skip


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


def progress_of(
    attempt: ProvisioningAttempt,
    engine: EngineSettings,
    now: datetime,
    parents: Collection[str] | None = None,
) -> Progress:
    return progress(facts(attempt, engine, parents), now, engine.backoff)


def progress_fields(
    attempt: ProvisioningAttempt | None,
    engine: EngineSettings,
    now: datetime,
    parents: Collection[str] | None = None,
) -> dict[str, Any]:
    """The FIELDS of an attempt (all None without one)."""
    if attempt is None:
        return dict.fromkeys(FIELDS)
    said = progress_of(attempt, engine, now, parents)
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
