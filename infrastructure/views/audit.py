"""The audit trail, read straight from the event store: a brand's state, its attempts
and every event of each, oldest first. JSON shapes (other tools rely on them):

    status  -> {brand_id, title, lifecycle, status, workspace_id, attempt_id, attempt_state,
                to_be_emptied_at (a deactivated brand's bound workspace: when; else null),
                emptying_refused (the gateway refused for good to empty it: its words,
                until a newer deactivate, a reactivation or the unbind; else null)}
    pointer -> {brand_id, at, workspace_id, attempt_id (the one that bound it), lifecycle}
    attempt -> {attempt_id, brand_id, state, failure_reason, failure_message,
                settle_hops, max_hop, deferrals,
                events: [{at, type, hop, workspace_id, provenance, reason, message,
                          deferred}, ...]}
    history -> [item, ...] in the brand's own order, where an item is either
               {kind: "attempt", at, <attempt>} (placed where the brand began it) or
               {kind: "brand", at, type, workspace_id, attempt_id, reason}, one of the
               brand's own events (registered, deactivated, unbound, ignored command...)

`reason` is an event's reason code (or why, or the status a hop saw, or the attempt
that took over from a superseded one); `message` is
the text that came with it (a failure's or a refusal's message, a dropped status).
Deferred hops in a row (`HopScheduled` with `deferred`: the gateway did not
answer) are one entry: `deferred` is how many, `at` the first, `until` the last,
and `reason` says so: "deferred ×7: gateway unavailable: ... since 10:02:11".
`settle_hops` of `max_hop` is the settle budget used; `deferrals` every deferral.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.application import project_aggregate

from domain.attempt import ProvisioningAttempt
from domain.brand import ACTIVE, DEACTIVATED, Brand
from domain.errors import ProvisionerError, UnknownAttempt, UnknownBrand
from domain.ids import brand_aggregate_id
from infrastructure.service import ProvisioningService
from infrastructure.usecases.reads import is_unicode_text
from projections.brand_workspaces import brand_status as status_of


def brand_status(service: ProvisioningService, brand_id: str) -> dict[str, Any]:
    brand = service.brand(brand_id)
    attempt = service.attempt(brand.current_attempt_id) if brand.current_attempt_id else None
    failure = attempt.failure_reason if attempt else None
    status = status_of(
        brand.lifecycle,
        attempt.state.value if attempt else None,
        brand.workspace_id,
        failure.value if failure else None,
    )
    return {
        "brand_id": brand.brand_id,
        "title": brand.title,
        "lifecycle": brand.lifecycle,
        "status": status,
        "workspace_id": brand.workspace_id,
        "attempt_id": str(attempt.id) if attempt else None,
        "attempt_state": attempt.state.value if attempt else None,
        "to_be_emptied_at": _iso(brand.to_be_emptied_at),
        "emptying_refused": brand.emptying_refused,
    }


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _replayed(service: ProvisioningService, aggregate_id: UUID) -> tuple[Any, list[Any]]:
    """The aggregate and its events from ONE read of its stream (None if it has none)."""
    events: list[Any] = list(service.app.events.get(aggregate_id))
    return project_aggregate(None, events), events


def _brand_stream(service: ProvisioningService, brand_id: str) -> tuple[Brand, list[Any]]:
    """The brand and its events, or UnknownBrand (an id no request could register,
    such as one holding a lone surrogate from undecodable bytes, included)."""
    if is_unicode_text(brand_id):
        brand, events = _replayed(service, brand_aggregate_id(brand_id))
        if isinstance(brand, Brand):
            return brand, events
    raise UnknownBrand(f"no brand {brand_id!r} is registered")


def _other_attempt(event: Any) -> str | None:
    """The attempt that took over from this one, as the reason it stood down."""
    if isinstance(event, ProvisioningAttempt.Superseded):
        return f"superseded by attempt {event.by_attempt_id}"
    if isinstance(event, ProvisioningAttempt.CandidateHandedOver):
        return f"handed over to attempt {event.to_attempt_id}"
    return None


def attempt_story(service: ProvisioningService, attempt_id: UUID) -> dict[str, Any]:
    attempt, history = _replayed(service, attempt_id)
    if not isinstance(attempt, ProvisioningAttempt):
        raise UnknownAttempt(f"no attempt {attempt_id} exists")
    events: list[dict[str, Any]] = []
    for event in history:
        fields = vars(event)
        if getattr(event, "deferred", False):
            _fold_deferral(events, event)
            continue
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
                "reason": fields.get("reason")
                or fields.get("why")
                or fields.get("last_status")
                or _other_attempt(event),
                "message": fields.get("message") or fields.get("status") or fields.get("evidence"),
                "deferred": 0,
                # A wait that spent the settle budget (a "not yet"), or not (the first
                # after a create, a busy slot, a create not yet seen): None, no wait.
                "spent": fields.get("spent"),
            }
        )
    failure = attempt.failure_reason
    return {
        "attempt_id": str(attempt.id),
        "brand_id": attempt.brand_id,
        "state": attempt.state.value,
        "failure_reason": failure.value if failure is not None else None,
        "failure_message": attempt.last_status if failure is not None else None,
        "settle_hops": attempt.settle_hops,
        "max_hop": attempt.max_hop,
        "deferrals": attempt.deferrals,
        "events": events,
    }


def _fold_deferral(events: list[dict[str, Any]], event: Any) -> None:
    """A deferred hop: a new entry, or one more of the deferrals just before it."""
    last = events[-1] if events else None
    if last is None or not last["deferred"]:
        last = {
            "at": event.timestamp.isoformat(),
            "type": "HopScheduled",
            "workspace_id": None,
            "provenance": None,
            "message": None,
            "deferred": 0,
            "spent": False,  # a deferral never spends the settle budget
        }
        events.append(last)
    last["deferred"] += 1
    last["hop"] = event.hop
    last["until"] = event.timestamp.isoformat()
    since = last["at"][11:19]
    last["reason"] = f"deferred ×{last['deferred']}: {event.last_status} since {since}"


def _brand_event(event: Any, bound: bool = False) -> dict[str, Any]:
    fields = vars(event)
    reason = fields.get("reason")
    if isinstance(event, Brand.Deactivated) and bound and event.purge_at > event.timestamp:
        # A retention window (none: emptied at once, nothing to say).
        reason = f"to be emptied at {event.purge_at.isoformat(timespec='seconds')}"
    elif isinstance(event, Brand.Reactivated) and bound:
        reason = "the emptying is cancelled: the workspace is kept"
    elif isinstance(event, Brand.DecommissionRefused):
        refused = event.message.startswith("not emptied:")  # ownership's, not the gateway's
        reason = (
            f"kept, {event.message}"
            if refused
            else (f"the gateway refused to empty it, kept: {event.message}")
        )
    elif isinstance(event, Brand.CommandIgnored):
        reason = f"{event.command}: {event.reason}"
    elif isinstance(event, Brand.WorkspaceUnbound) and event.projects_deleted:
        reason = f"{event.reason} ({event.projects_deleted} projects deleted)"
    attempt_id = fields.get("attempt_id")
    return {
        "kind": "brand",
        "at": event.timestamp.isoformat(),
        "type": type(event).__name__,
        "workspace_id": fields.get("workspace_id"),
        "attempt_id": str(attempt_id) if attempt_id else None,
        "reason": reason,
    }


def brand_history(service: ProvisioningService, brand_id: str) -> list[dict[str, Any]]:
    """The brand's own events and its attempts, in the brand's order (an attempt where
    the brand began it, with all its events): one read per stream."""
    _, events = _brand_stream(service, brand_id)
    items: list[dict[str, Any]] = []
    bound = False
    for event in events:
        if isinstance(event, Brand.AttemptBegun):
            story = attempt_story(service, event.attempt_id)
            items.append({"kind": "attempt", "at": event.timestamp.isoformat(), **story})
        else:
            bound = isinstance(event, Brand.WorkspaceBound) or (
                bound and not isinstance(event, Brand.WorkspaceUnbound)
            )
            items.append(_brand_event(event, bound))
    return items


class NotYetRegistered(ProvisionerError):
    pass


def pointer_at(service: ProvisioningService, brand_id: str, at: datetime) -> dict[str, Any]:
    """The workspace the brand was bound to at `at` (its stream replayed up to then),
    and the attempt that bound it."""
    brand, events = _brand_stream(service, brand_id)
    workspace_id: str | None = None
    bound_by: UUID | None = None
    lifecycle = ACTIVE
    seen = False
    for event in events:
        if event.timestamp > at:
            break
        seen = True
        if isinstance(event, Brand.WorkspaceBound):
            workspace_id, bound_by = event.workspace_id, event.attempt_id
        elif isinstance(event, Brand.WorkspaceUnbound):
            workspace_id = bound_by = None
        elif isinstance(event, Brand.Deactivated):
            lifecycle = DEACTIVATED
        elif isinstance(event, Brand.Reactivated):
            lifecycle = ACTIVE
    if not seen:
        raise NotYetRegistered(
            f"brand {brand_id} was not registered yet at {at.isoformat()} "
            f"(registered {brand.created_on.isoformat()})"
        )
    return {
        "brand_id": brand_id,
        "at": at.isoformat(),
        "workspace_id": workspace_id,
        "attempt_id": str(bound_by) if bound_by else None,
        "lifecycle": lifecycle,
    }
