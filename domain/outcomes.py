"""What a hop (or a release) did, as returned to the caller and logged."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID

from domain.policies import FailureReason


class Outcome(StrEnum):
    PROMOTED = "promoted"
    SCHEDULED = "scheduled"
    DEFERRED = "deferred"  # no answer from the gateway: the hop runs again later
    FAILED = "failed"
    STOOD_DOWN = "stood_down"
    DUPLICATE = "duplicate"


class StandDown(StrEnum):
    """Why a hop did nothing to an attempt."""

    REDELIVERY_OF_PROMOTED = "redelivery_of_promoted"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"
    FAILED = "failed"
    STALE_HOP = "stale_hop"
    FUTURE_HOP = "future_hop"
    CONCURRENT_DELIVERY = "concurrent_delivery"


@dataclass(frozen=True, slots=True)
class HopOutcome:
    """What one hop did: its kind (`outcome`), and why where the kind has reasons: a
    failure's `failure`, a stand-down's `stand_down` (a duplicate's is `stale_hop`).
    `detail` is for people: nothing is decided on its text."""

    outcome: Outcome
    attempt_id: UUID
    brand_id: str
    hop: int
    detail: str = ""
    workspace_id: str | None = None
    next_hop: int | None = None
    delay_s: float | None = None
    stand_down: StandDown | None = None
    released: tuple[str, ...] = ()
    failure: FailureReason | None = None  # why the attempt failed (outcome FAILED)

    @property
    def reason(self) -> str | None:
        """The reason code of the kind: the failure's, "deferred", the stand-down's;
        None for a promotion or a scheduled hop (and a failure whose reason is unknown)."""
        if self.outcome is Outcome.FAILED:
            return None if self.failure is None else self.failure.value
        if self.outcome is Outcome.DEFERRED:
            return "deferred"
        if self.stand_down is not None:
            return self.stand_down.value
        return None
