"""What a hop (or a release) did, as returned to the caller and logged."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID


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
