"""The audit trail, read straight from the event store: a brand's state, its attempts
and every event of each, oldest first. JSON shapes (other tools rely on them):

    status  -> {brand_id, lifecycle, status, workspace_id, attempt_id}
    history -> [{attempt_id, state, events: [{at, type, hop, workspace_id,
                 provenance, reason}, ...]}, ...]
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.policies import AttemptState
from infrastructure.service import ProvisioningService

STATUS_BY_STATE = {
    AttemptState.PENDING: "pending",
    AttemptState.PROMOTED: "ready",
    AttemptState.FAILED: "failed",
    AttemptState.CANCELLED: "cancelled",
    AttemptState.SUPERSEDED: "pending",
}


def brand_status(service: ProvisioningService, brand_id: str) -> dict[str, Any]:
    brand = service.brand(brand_id)
    attempt = service.attempt(brand.current_attempt_id) if brand.current_attempt_id else None
    status = STATUS_BY_STATE[attempt.state] if attempt else "none"
    if attempt and attempt.state is AttemptState.PROMOTED and brand.workspace_id is None:
        status = "none"  # decommissioned since
    return {
        "brand_id": brand.brand_id,
        "title": brand.title,
        "lifecycle": brand.lifecycle,
        "status": status,
        "workspace_id": brand.workspace_id,
        "attempt_id": str(attempt.id) if attempt else None,
    }


def attempt_ids(service: ProvisioningService, brand: Brand) -> list[UUID]:
    return [
        event.attempt_id
        for event in service.app.events.get(brand.id)
        if isinstance(event, Brand.AttemptBegun)
    ]


def attempt_story(service: ProvisioningService, attempt_id: UUID) -> dict[str, Any]:
    attempt: ProvisioningAttempt = service.attempt(attempt_id)
    events = []
    for event in service.attempt_history(attempt_id):
        fields = vars(event)
        provenance = fields.get("provenance")
        if isinstance(event, ProvisioningAttempt.Started) and event.existing_workspace_id:
            provenance = "existing"
        events.append(
            {
                "at": event.timestamp.isoformat(),
                "type": type(event).__name__,
                "hop": fields.get("hop"),
                "workspace_id": fields.get("workspace_id") or fields.get("existing_workspace_id"),
                "provenance": provenance,
                "reason": fields.get("reason") or fields.get("why") or fields.get("last_status"),
            }
        )
    return {
        "attempt_id": str(attempt.id),
        "brand_id": attempt.brand_id,
        "state": attempt.state.value,
        "events": events,
    }


def brand_history(service: ProvisioningService, brand_id: str) -> list[dict[str, Any]]:
    brand = service.brand(brand_id)
    return [attempt_story(service, attempt_id) for attempt_id in attempt_ids(service, brand)]
