"""Pure policies: status classification, attempt states, failure reasons, owed releases.

How long anything waits is domain/waits.py.

No I/O here: the service feeds these functions what the gateway said and acts
on what they decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum, StrEnum

READY_STATUSES = frozenset({"created", "active", "ready"})
# Terminal, and nothing usable was made: a new create is safe.
CREATION_FAILED_STATUSES = frozenset({"creation_failed", "creation failed"})
# Terminal, and a new create is not safe (it would meet the same fate, or worse).
TERMINAL_STATUSES = frozenset({"failed", "error", "invalid subscription"})


class StatusClass(Enum):
    READY = "ready"
    CREATION_FAILED = "creation_failed"  # terminal; creating again is safe
    TERMINAL = "terminal"  # terminal; creating again is not
    SETTLING = "settling"

    @property
    def is_terminal(self) -> bool:
        return self in (StatusClass.CREATION_FAILED, StatusClass.TERMINAL)


def normalise_status(raw: str | None) -> str:
    """Lower-case, trimmed, inner runs of whitespace collapsed to one space."""
    return " ".join((raw or "").split()).lower()


def classify_status(raw: str | None) -> StatusClass:
    """Map a gateway status onto ready / creation failed / terminal / settling
    (unknown = settling)."""
    status = normalise_status(raw)
    if status in READY_STATUSES:
        return StatusClass.READY
    if status in CREATION_FAILED_STATUSES:
        return StatusClass.CREATION_FAILED
    if status in TERMINAL_STATUSES:
        return StatusClass.TERMINAL
    return StatusClass.SETTLING


class Provenance(StrEnum):
    CREATED = "created"
    ADOPTED = "adopted"
    EXISTING = "existing"


class AttemptState(StrEnum):
    PENDING = "pending"
    PROMOTED = "promoted"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"

    @property
    def is_terminal(self) -> bool:
        return self is not AttemptState.PENDING


class FailureReason(StrEnum):
    """Reason codes of `ProvisioningAttempt.Failed`."""

    TERMINAL_STATUS = "terminal_status"
    EXHAUSTED = "exhausted"
    AMBIGUOUS = "ambiguous"
    REJECTED = "rejected"
    UNAUTHORIZED = "unauthorized"
    GATEWAY_BUG = "gateway_bug"
    DEADLINE = "deadline"  # still pending at its deadline (the gateway never answered)
    INTERNAL_ERROR = "internal_error"  # a hop kept raising an unexpected exception (a bug)


def owed_releases(
    created_ids: Sequence[str],
    released_ids: Sequence[str],
    candidate_id: str | None,
    state: AttemptState,
    failure_reason: FailureReason | None,
) -> tuple[str, ...]:
    """Workspaces an attempt's creates made that will not be used and are not released.

    The candidate is kept while the attempt is pending and once promoted; a
    candidate whose status went terminal is not released (it never came to
    exist in a usable form). A surplus workspace (created by a run that lost
    its race) is owed at once. The aggregate and the `attempts` projection
    both decide with this one rule.
    """
    keep_candidate = (
        state in (AttemptState.PENDING, AttemptState.PROMOTED)
        or failure_reason is FailureReason.TERMINAL_STATUS
    )
    return tuple(
        workspace_id
        for workspace_id in created_ids
        if workspace_id not in released_ids
        and not (workspace_id == candidate_id and keep_candidate)
    )


# Deferred hops count too: a day's deadline over a 15 s shortest capped wait is 5,760.
MAX_HOP = 1_000_000
