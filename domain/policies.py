"""Pure policies: status classification, backoff, adoption and release rules.

No I/O here: the service feeds these functions what the gateway said and acts
on what they decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import ClassVar

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


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before hop n+1 is base * 2**n; at most `max_requeues` hops after the first.
    No defaults: PROVISIONER_BACKOFF_BASE_S and PROVISIONER_MAX_REQUEUES give them."""

    base_s: float
    max_requeues: int

    def __post_init__(self) -> None:
        if self.base_s < 0:
            raise ValueError("backoff base must be >= 0 seconds")
        if not 0 <= self.max_requeues <= 30:
            raise ValueError("max requeues must be between 0 and 30")

    def delay_after(self, hop: int) -> float:
        return self.base_s * 2.0**hop

    def can_requeue(self, hop: int) -> bool:
        return hop < self.max_requeues

    def total_s(self) -> float:
        return sum(self.delay_after(h) for h in range(self.max_requeues))


@dataclass(frozen=True, slots=True)
class Deferral:
    """How long a hop that got no answer waits before it runs again.

    The n-th deferral in a row waits `min(cap, base_s * 2**n)`, jittered down to
    half of that at random, or until the gateway's shared `Retry-After` (at most
    `retry_after_max_s`, as the fleet's pace holds it), whichever is later. The
    cap is `max_s` in the first hour of silence and doubles with each further
    hour, up to `LONGEST_S`: brands resume within
    `max_s` of a short outage, and a day-long one records a few hundred
    deferrals per attempt, not thousands. Deferred hops never use up the settle
    budget (`Backoff`); they go on until the attempt's deadline, `deadline_s`
    after it started.
    """

    LONGEST_S: ClassVar[float] = 600.0

    base_s: float = 2.0
    # Settings, with no defaults here: PROVISIONER_DEFER_MAX_S,
    # PROVISIONER_ATTEMPT_DEADLINE_S and PROVISIONER_RETRY_AFTER_MAX_S.
    max_s: float = field(kw_only=True)
    deadline_s: float = field(kw_only=True)
    retry_after_max_s: float = field(kw_only=True)

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.max_s:
            raise ValueError("deferral base must be > 0 and at most the maximum")
        if self.deadline_s <= 0:
            raise ValueError("the attempt deadline must be > 0 seconds")

    def delay(
        self,
        in_row: int,
        retry_after_s: float,
        jitter: float,
        silent_s: float = 0.0,
        *,
        paced: bool = False,
    ) -> float:
        """`jitter` in [0, 1): where between half and all of the backoff this one waits;
        `silent_s`: how long the gateway has not answered this attempt. A call held for
        the fleet's own turn (`paced`) waits for that turn, up to a quarter more (the
        held hops spread out), not the backoff: the gateway is answering."""
        retry_after_s = min(retry_after_s, self.retry_after_max_s)
        if paced:
            return max(retry_after_s, 0.1) * (1.0 + 0.25 * jitter)
        hours = min(int(max(silent_s, 0.0) // 3600), 10)
        cap = max(self.max_s, min(self.LONGEST_S, self.max_s * 2.0**hours))
        backoff = min(cap, self.base_s * 2.0 ** min(in_row, 30))
        return max(retry_after_s, backoff * (0.5 + 0.5 * jitter))


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
