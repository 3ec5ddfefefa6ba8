"""The worker's message handlers: one per message type, selected by `HANDLERS`.

Each handler takes the service and the message's typed fields
(`messages.Hop`, ...), runs one use case and returns a short description of
what happened. What a handler may raise is what `retry_policy` has a rule for:
`DeadLetter` for a message that can never succeed (an unknown attempt or
brand, a refused command), `RetryLater` and `TransientGatewayError` for a
refusal for now, or an infrastructure failure. A stale command is not a
failure: it is recorded on the brand and acked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from domain.errors import (
    AttemptInProgress,
    BrandDeactivated,
    CommandRefused,
    InvalidRequest,
    StaleCommand,
    UnknownAttempt,
    UnknownBrand,
)
from domain.releases import Decommissioned, DecommissionKind
from infrastructure.broker import messages
from infrastructure.broker.messages import (
    Body,
    Deactivate,
    Decommission,
    Hop,
    InvalidMessage,
    Message,
    Provision,
    Release,
)
from infrastructure.service import ProvisioningService
from worker.health import metrics
from worker.retry_policy import DeadLetter

# What the service refuses for good: the message is dead-lettered with the error's name.
REFUSED = (UnknownAttempt, UnknownBrand, InvalidRequest, BrandDeactivated, CommandRefused)


def hop(service: ProvisioningService, message: Hop) -> str:
    outcome = service.run_hop(message.attempt_id, message.hop)
    metrics.count_hop(outcome.outcome.value)
    return f"{outcome.outcome.value} {outcome.detail}"


def release(service: ProvisioningService, message: Release) -> str:
    emptied = service.release(message.attempt_id)
    return f"released {', '.join(emptied)}" if emptied else "nothing emptied"


def decommission(service: ProvisioningService, message: Decommission) -> str:
    return said(service.decommission(message.brand_id))


# What a decommission's outcome is said as, by its kind.
DECOMMISSION_SAID: Mapping[DecommissionKind, str] = MappingProxyType(
    {
        DecommissionKind.EMPTIED: "decommissioned ({projects} projects)",
        DecommissionKind.NOTHING_BOUND: "not decommissioned: nothing bound",
        DecommissionKind.NOT_DUE: "not decommissioned yet: {why}",
        DecommissionKind.REFUSED: "not decommissioned, refused: {why}",
        DecommissionKind.UNBOUND_NOT_EMPTIED: "unbound, not emptied: {why}",
    }
)


def said(outcome: Decommissioned) -> str:
    """A decommission's outcome in words, for the log and the operator."""
    return DECOMMISSION_SAID[outcome.kind].format(
        projects=outcome.projects_deleted, why=outcome.why
    )


def provision(service: ProvisioningService, message: Provision) -> str:
    try:
        attempt_id = service.request_provisioning(
            message.brand_id, message.title, message.parent_workspace_id, message.requested_at
        )
    except AttemptInProgress as exc:
        return f"not started: {exc}"
    return f"attempt {attempt_id} started"


def deactivate(service: ProvisioningService, message: Deactivate) -> str:
    result = service.deactivate(message.brand_id, message.requested_at)
    return f"deactivated (cancelled {result.cancelled_attempt_id})"


B = TypeVar("B", bound=Body)


@dataclass(frozen=True, slots=True)
class Route(Generic[B]):
    """A message type's handler and the typed fields it takes."""

    body: type[B]
    run: Callable[[ProvisioningService, B], str]

    def __call__(self, service: ProvisioningService, message: Message) -> str:
        try:
            body = messages.body(message)
        except InvalidMessage as exc:
            raise DeadLetter(exc.reason, exc.errors) from None
        assert isinstance(body, self.body)
        return self.run(service, body)


HANDLERS: Mapping[str, Route[Any]] = MappingProxyType(
    {
        "hop": Route(Hop, hop),
        "release": Route(Release, release),
        "decommission": Route(Decommission, decommission),
        "provision": Route(Provision, provision),
        "deactivate": Route(Deactivate, deactivate),
    }
)


def handle(service: ProvisioningService, message: Message) -> str:
    """Run the message's handler, timed by type; a stale command is acked (recorded on
    the brand), a refused one dead-lettered. RetryLater propagates: the settler
    re-publishes it on its own, longer schedule (worker/retry_policy.py)."""
    with metrics.HOP_SECONDS.labels(message.type).time():
        route = HANDLERS.get(message.type)
        if route is None:
            raise DeadLetter("unhandled type", {"type": message.type})
        try:
            return route(service, message)
        except StaleCommand as exc:
            return f"ignored: {exc}"
        except REFUSED as exc:
            raise DeadLetter(type(exc).__name__, {"error": str(exc)}) from None


def give_up(service: ProvisioningService, message: Message, exc: BaseException) -> None:
    """A hop that raised a bug on every retry fails its attempt `internal_error`
    (naming the exception's type) rather than sit pending until its deadline."""
    body = messages.body(message)
    if isinstance(body, Hop):
        service.fail_internal(body.attempt_id, body.hop, type(exc).__name__)
