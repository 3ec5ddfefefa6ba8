"""The service's reads and settings: what every use case loads its aggregates with."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import StoredEvent

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.claim import WorkspaceClaim
from domain.errors import UnknownAttempt, UnknownBrand
from domain.ids import brand_aggregate_id, claim_aggregate_id, slot_aggregate_id
from domain.ownership import is_parent, without_parents
from domain.ports import Clock, FamilyMember, Gateway
from domain.slot import TitleSlot
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import ProvisionerApplication

FACTS_KEPT = 50_000  # attempts whose brand, parent and title a service remembers
MIN_SECRET_CHARS = 8


def is_unicode_text(text: str) -> bool:
    """Whether `text` can be stored (as UTF-8): no lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ServiceReads:
    """The ports and stores a use case works with, and how it reads aggregates."""

    def __init__(
        self,
        app: ProvisionerApplication,
        gateway: Gateway,
        clock: Clock | None = None,
        settings: EngineSettings | None = None,
        secrets: tuple[str, ...] = (),
        *,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.app = app
        self.jitter = jitter  # a number in [0, 1): spreads deferred hops apart
        self.gateway = gateway
        # Texts that must never reach an event or a log line (the gateway token);
        # one shorter than MIN_SECRET_CHARS would refuse ordinary ids, so it is not
        # looked for (a real bearer token is far longer).
        self.secrets = tuple(s for s in secrets if len(s) >= MIN_SECRET_CHARS)
        self.clock: Clock = clock or SystemClock()
        self.settings = settings or EngineSettings()
        # What an attempt started with (brand, parent, title) never changes: once
        # known here, a hop reads the attempt, its title slot and its brand in
        # one query instead of two. Bounded: forgotten wholesale when full.
        self._facts: dict[UUID, tuple[str, str, str]] = {}

    # Reads.

    def load(self, *aggregate_ids: UUID) -> list[object | None]:
        """The current state of each aggregate (None if it has no events).

        Without a cache or snapshots (this project configures neither) the events
        are read and applied here, several aggregates in one query when the
        recorder offers it (`select_events_of` on PostgreSQL); otherwise through
        the repository. Same state either way: an aggregate is its events applied
        in order.
        """
        repository = self.app.repository
        if repository.cache is not None or repository.snapshot_store is not None:
            return [self._get(aggregate_id) for aggregate_id in aggregate_ids]
        select_many = getattr(self.app.recorder, "select_events_of", None)
        if select_many is None:
            return [self._get(aggregate_id) for aggregate_id in aggregate_ids]
        by_id: dict[object, list[StoredEvent]] = {}
        for stored in select_many(aggregate_ids):
            # Keyed as UUIDs whatever the driver returns (or the caller passed).
            by_id.setdefault(UUID(str(stored.originator_id)), []).append(stored)
        to_domain_event = self.app.mapper.to_domain_event
        found: list[object | None] = []
        for aggregate_id in aggregate_ids:
            aggregate: Any = None
            for stored in by_id.get(UUID(str(aggregate_id)), ()):
                event: Any = to_domain_event(stored)
                aggregate = event.mutate(aggregate)
            found.append(aggregate)
        return found

    def _get(self, aggregate_id: UUID) -> object | None:
        try:
            aggregate: object = self.app.repository.get(aggregate_id)
        except AggregateNotFoundError:
            return None
        return aggregate

    def brand(self, brand_id: str) -> Brand:
        if not is_unicode_text(brand_id):  # never registered: requests refuse such ids
            raise UnknownBrand(f"no brand {brand_id!r} is registered")
        (brand,) = self.load(brand_aggregate_id(brand_id))
        return self.as_brand(brand, brand_id)

    @staticmethod
    def as_brand(brand: object | None, brand_id: str) -> Brand:
        if brand is None:
            raise UnknownBrand(f"no brand {brand_id!r} is registered")
        assert isinstance(brand, Brand)
        return brand

    def attempt(self, attempt_id: UUID) -> ProvisioningAttempt:
        (attempt,) = self.load(attempt_id)
        return self.as_attempt(attempt, attempt_id)

    def as_attempt(self, attempt: object | None, attempt_id: UUID) -> ProvisioningAttempt:
        if attempt is None:
            raise UnknownAttempt(f"no attempt {attempt_id} exists")
        if not isinstance(attempt, ProvisioningAttempt):
            raise UnknownAttempt(f"{attempt_id} is not a provisioning attempt")
        self.remember(attempt)
        return attempt

    def remember(self, attempt: ProvisioningAttempt) -> None:
        if attempt.id not in self._facts:
            if len(self._facts) >= FACTS_KEPT:
                self._facts.clear()
            self._facts[attempt.id] = (
                attempt.brand_id,
                attempt.parent_workspace_id,
                attempt.title,
            )

    def attempt_in_context(
        self, attempt_id: UUID
    ) -> tuple[ProvisioningAttempt, tuple[TitleSlot, Brand] | None]:
        """The attempt and, when its facts are known here, its title slot and its
        brand read in the same query (else None: read them when needed)."""
        facts = self._facts.get(attempt_id)
        if facts is None:
            return self.attempt(attempt_id), None
        brand_id, parent, title = facts
        attempt, slot, brand = self.load(
            attempt_id, slot_aggregate_id(parent, title), brand_aggregate_id(brand_id)
        )
        return self.as_attempt(attempt, attempt_id), (
            self.as_slot(slot, parent, title),
            self.as_brand(brand, brand_id),
        )

    def attempt_history(self, attempt_id: UUID) -> list[Aggregate.Event]:
        """The attempt's events, oldest first: its audit trail."""
        return [
            event for event in self.app.events.get(attempt_id) if isinstance(event, Aggregate.Event)
        ]

    def slot(self, parent_workspace_id: str, title: str) -> TitleSlot:
        """The title slot, opened (unsaved) if it does not exist yet."""
        (slot,) = self.load(slot_aggregate_id(parent_workspace_id, title))
        return self.as_slot(slot, parent_workspace_id, title)

    @staticmethod
    def as_slot(slot: object | None, parent_workspace_id: str, title: str) -> TitleSlot:
        if slot is None:
            return TitleSlot.open(parent_workspace_id, title)
        assert isinstance(slot, TitleSlot)
        return slot

    def slot_and_brand(self, attempt: ProvisioningAttempt) -> tuple[TitleSlot, Brand]:
        """The attempt's title slot and its brand, in one read."""
        parent, title = attempt.parent_workspace_id, attempt.title
        slot, brand = self.load(
            slot_aggregate_id(parent, title), brand_aggregate_id(attempt.brand_id)
        )
        return self.as_slot(slot, parent, title), self.as_brand(brand, attempt.brand_id)

    @property
    def parents(self) -> tuple[str, ...]:
        """The parents the service acts under (none known: a service embedded in a test)."""
        return tuple(sorted(self.settings.parent_ids or ()))

    def is_parent(self, workspace_id: str) -> bool:
        """A configured parent, or an id a gateway may take for one (`domain.ownership`):
        never a candidate, adopted, bound, claimed or emptied."""
        return is_parent(workspace_id, self.parents)

    def parent_allowed(self, parent_id: str) -> bool:
        """Whether the service acts under this parent (PROVISIONER_PARENT_IDS; with none
        known, any): an attempt or brand from before the allowlist may name another."""
        allowed = self.settings.parent_ids
        return allowed is None or parent_id in allowed

    def family(self, parent_id: str, title: str | None = None) -> list[FamilyMember]:
        """The parent's family as the gateway lists it, without any configured parent:
        whichever family lists one, it is never ours."""
        return without_parents(self.gateway.family(parent_id, title), self.settings.parent_ids)

    def claim(self, workspace_id: str) -> WorkspaceClaim | None:
        (claim,) = self.load(claim_aggregate_id(workspace_id))
        if claim is None:
            return None
        assert isinstance(claim, WorkspaceClaim)
        return claim
