"""The transactional outbox: what each stored event implies on the broker, and the
relay's tracked position in the notification log.

The event log is the outbox: an event is committed once, and the relay derives
the messages from it afterwards. Work messages:

| event                                   | message                               |
|-----------------------------------------|---------------------------------------|
| ProvisioningAttempt.Started             | hop 0, now                            |
| ProvisioningAttempt.HopScheduled        | hop n, after its backoff delay        |
| ProvisioningAttempt.Cancelled/Superseded/Failed | release (a no-op if nothing is owed) |
| Brand.Deactivated                       | decommission, at its `purge_at`       |

Integration events (topic exchange `provisioning.events`), each with `event_id`
(stable across re-publishes, for deduplication downstream), `brand_id`,
`attempt_id`, `workspace_id` and `at`:
`workspace.ready`, `provisioning.failed`, `provisioning.cancelled`,
`provisioning.superseded`, `workspace.released`, `workspace.unbound`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import DomainEventProtocol
from eventsourcing.persistence import Tracking, TrackingRecorder

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from infrastructure.broker import messages
from infrastructure.broker.messages import Message
from infrastructure.store.eventstore import APP_NAME, ProvisionerApplication


@dataclass(frozen=True, slots=True)
class Work:
    message: Message
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class IntegrationEvent:
    routing_key: str
    payload: dict[str, Any]


Implied = tuple[list[Work], list[IntegrationEvent]]


class UnpublishedEvent(LookupError):
    """The outbox was handed an event it has no rule for: `PUBLISH` lacks its class."""


def _topic(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


# What the integration event of each attempt's ending (or release) is called.
ENDED_KINDS: dict[type, str] = {
    ProvisioningAttempt.Promoted: "workspace.ready",
    ProvisioningAttempt.Failed: "provisioning.failed",
    ProvisioningAttempt.Cancelled: "provisioning.cancelled",
    ProvisioningAttempt.Superseded: "provisioning.superseded",
    ProvisioningAttempt.CandidateReleased: "workspace.released",
}


class OutboxMapper:
    """Turns stored events into work and integration events, by the event's class
    (`PUBLISH`); a class it has no rule for is refused (`UnpublishedEvent`).

    Remembers which brand each recent attempt belongs to (from `Started`), so
    it seldom has to read an attempt to name its brand.
    """

    def __init__(self, app: ProvisionerApplication, cache_size: int = 100_000) -> None:
        self.app = app
        self._brands: OrderedDict[UUID, str] = OrderedDict()
        self._cache_size = cache_size

    def map(self, event: DomainEventProtocol[Any]) -> Implied:
        rule = PUBLISH.get(type(event))
        if rule is None:
            raise UnpublishedEvent(
                f"the outbox has no rule for {_topic(type(event))}: "
                "add one to PUBLISH (infrastructure/broker/outbox.py)"
            )
        return rule(self, event)

    def _remember(self, attempt_id: UUID, brand_id: str) -> None:
        self._brands[attempt_id] = brand_id
        if len(self._brands) > self._cache_size:
            self._brands.popitem(last=False)

    def _brand_of(self, attempt_id: UUID) -> str:
        brand_id = self._brands.get(attempt_id)
        if brand_id is None:
            attempt: Any = self.app.repository.get(attempt_id)
            brand_id = str(attempt.brand_id)
            self._remember(attempt_id, brand_id)
        return brand_id

    def started(self, event: ProvisioningAttempt.Started) -> Implied:
        attempt_id = _attempt_id(event)
        self._remember(attempt_id, event.brand_id)
        return [Work(messages.hop(attempt_id, 0))], []

    def hop_scheduled(self, event: ProvisioningAttempt.HopScheduled) -> Implied:
        delay = max(0.0, (event.not_before - _timestamp(event)).total_seconds())
        return [Work(messages.hop(_attempt_id(event), event.hop), delay)], []

    def attempt_ended(self, event: DomainEventProtocol[Any]) -> Implied:
        """An ending (or a release): its integration event, and a release of what an
        ending other than a promotion may still owe."""
        attempt_id = _attempt_id(event)
        kind = ENDED_KINDS[type(event)]
        payload = self._payload(event, kind, self._brand_of(attempt_id), attempt_id)
        payload["workspace_id"] = getattr(event, "workspace_id", None)
        if isinstance(event, ProvisioningAttempt.Failed):
            payload["reason"] = event.reason
            payload["message"] = event.message
        if isinstance(event, ProvisioningAttempt.Superseded):
            payload["by_attempt_id"] = str(event.by_attempt_id)
        work = (
            []
            if kind in ("workspace.ready", "workspace.released")
            else [Work(messages.release(attempt_id))]
        )
        return work, [IntegrationEvent(kind, payload)]

    def deactivated(self, event: Brand.Deactivated) -> Implied:
        brand: Any = self.app.repository.get(event.originator_id)
        delay = max(0.0, (event.purge_at - _timestamp(event)).total_seconds())
        return [Work(messages.decommission(brand.brand_id), delay)], []

    def unbound(self, event: Brand.WorkspaceUnbound) -> Implied:
        brand: Any = self.app.repository.get(event.originator_id)
        payload = self._payload(event, "workspace.unbound", brand.brand_id, None)
        payload["workspace_id"] = event.workspace_id
        payload["reason"] = event.reason
        return [], [IntegrationEvent("workspace.unbound", payload)]

    @staticmethod
    def _payload(
        event: DomainEventProtocol[Any], kind: str, brand_id: str, attempt_id: UUID | None
    ) -> dict[str, Any]:
        event_id = uuid5(NAMESPACE_URL, f"{event.originator_id}/{event.originator_version}")
        return {
            "event_id": str(event_id),
            "type": kind,
            "brand_id": brand_id,
            "attempt_id": str(attempt_id) if attempt_id else None,
            "at": _timestamp(event).isoformat(),
        }


def _timestamp(event: DomainEventProtocol[Any]) -> datetime:
    value = getattr(event, "timestamp", None)
    assert isinstance(value, datetime)
    return value


def _attempt_id(event: DomainEventProtocol[Any]) -> UUID:
    attempt_id = event.originator_id
    assert isinstance(attempt_id, UUID)
    return attempt_id


# What each event the relay reads publishes, by its class: the one place to add a rule.
PUBLISH: Mapping[type, Callable[[OutboxMapper, Any], Implied]] = MappingProxyType(
    {
        ProvisioningAttempt.Started: OutboxMapper.started,
        ProvisioningAttempt.HopScheduled: OutboxMapper.hop_scheduled,
        **dict.fromkeys(ENDED_KINDS, OutboxMapper.attempt_ended),
        Brand.Deactivated: OutboxMapper.deactivated,
        Brand.WorkspaceUnbound: OutboxMapper.unbound,
    }
)

# The only events the relay reads; anything else in the log is skipped unread.
TOPICS = tuple(_topic(cls) for cls in PUBLISH)


def save_position(store: TrackingRecorder, notification_id: int) -> None:
    store.insert_tracking(Tracking(notification_id=notification_id, application_name=APP_NAME))


def load_position(store: TrackingRecorder) -> int:
    return store.max_tracking_id(APP_NAME) or 0
