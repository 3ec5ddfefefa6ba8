"""The TitleSlot aggregate: at most one create in flight per title under a parent.

Titles are not unique in an organisation, and the gateway has no idempotency
key: after a create that timed out, the provisioner recognises what it made by
title (a same-title child that was not there before). That is only sound if no
other attempt creates the same title under the same parent meanwhile. The slot
(id = uuid5 of parent and title) is reserved in the same save as
`CreateRequested`, freed in the save that records the candidate, and bumped by
an adoption (so an adoption that raced a create conflicts and decides again).
A reservation older than the grace period is abandoned and may be taken over.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.errors import CommandRefused
from domain.ids import slot_aggregate_id


class TitleSlot(Aggregate):
    class Opened(Aggregate.Created):
        parent_workspace_id: str
        title: str

    class Reserved(Aggregate.Event):
        attempt_id: UUID
        at: datetime

    class Freed(Aggregate.Event):
        attempt_id: UUID

    class AdoptionNoted(Aggregate.Event):
        attempt_id: UUID
        workspace_id: str

    def __init__(self, parent_workspace_id: str, title: str) -> None:
        self.parent_workspace_id = parent_workspace_id
        self.title = title
        self.holder: UUID | None = None
        self.reserved_at: datetime | None = None

    @classmethod
    def create_id(cls, parent_workspace_id: str, title: str) -> UUID:
        return slot_aggregate_id(parent_workspace_id, title)

    @classmethod
    def open(cls, parent_workspace_id: str, title: str) -> TitleSlot:
        return cls._create(cls.Opened, parent_workspace_id=parent_workspace_id, title=title)

    def busy_for(self, attempt_id: UUID, now: datetime, grace_s: float) -> bool:
        """Another attempt's create with this title may still be in flight."""
        if self.holder is None or self.holder == attempt_id or self.reserved_at is None:
            return False
        return (now - self.reserved_at).total_seconds() <= grace_s

    def reserve(self, attempt_id: UUID, now: datetime, grace_s: float) -> None:
        if self.busy_for(attempt_id, now, grace_s):
            raise CommandRefused(f"attempt {self.holder} is creating {self.title!r}")
        self._reserved(attempt_id, now)

    def free(self, attempt_id: UUID) -> None:
        if self.holder == attempt_id:
            self._freed(attempt_id)

    def note_adoption(self, attempt_id: UUID, workspace_id: str) -> None:
        self._adoption_noted(attempt_id, workspace_id)

    @event(Reserved)
    def _reserved(self, attempt_id: UUID, at: datetime) -> None:
        self.holder = attempt_id
        self.reserved_at = at

    @event(Freed)
    def _freed(self, attempt_id: UUID) -> None:
        self.holder = None
        self.reserved_at = None

    @event(AdoptionNoted)
    def _adoption_noted(self, attempt_id: UUID, workspace_id: str) -> None:
        pass
