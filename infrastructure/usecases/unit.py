"""One round of a hop as a unit of work: what it loaded, read and touched.

The attempt is read with its title slot and brand when its facts are known (one
query); any other aggregate, and the family, at most once. What the round changes
is saved with the attempt, version-checked, at each save point. A round that lost
a race is not repaired: the next one starts a fresh unit (`retry_on_conflict`).
"""

from __future__ import annotations

from uuid import UUID

from eventsourcing.domain import Aggregate
from eventsourcing.persistence import IntegrityError

from domain.brand import Brand
from domain.claim import WorkspaceClaim
from domain.ports import FamilyMember
from domain.slot import TitleSlot
from infrastructure.usecases.reads import ServiceReads


class HopUnit:
    """The aggregates one round loaded, the facts it read, and what it touched."""

    def __init__(self, service: ServiceReads, attempt_id: UUID) -> None:
        self.svc = service
        self.attempt, context = service.attempt_in_context(attempt_id)
        self._slot: TitleSlot | None = context[0] if context else None
        self._brand: Brand | None = context[1] if context else None
        self._claims: dict[str, WorkspaceClaim | None] = {}
        # The family as listed in this round; None: not read (or stale after our create).
        self.family_read: list[FamilyMember] | None = None
        self._touched: list[Aggregate] = []
        self._lost = False  # a save failed: these aggregates hold events never stored

    def slot(self) -> TitleSlot:
        if self._slot is None:
            self._slot = self.svc.slot(self.attempt.parent_workspace_id, self.attempt.title)
        return self._slot

    def slot_and_brand(self) -> tuple[TitleSlot, Brand]:
        """The title slot and the brand: those loaded, else read in one query."""
        if self._slot is None and self._brand is None:
            self._slot, self._brand = self.svc.slot_and_brand(self.attempt)
        return self.slot(), self.brand()

    def brand(self) -> Brand:
        if self._brand is None:
            self._brand = self.svc.brand(self.attempt.brand_id)
        return self._brand

    def claim(self, workspace_id: str) -> WorkspaceClaim | None:
        if workspace_id not in self._claims:
            self._claims[workspace_id] = self.svc.claim(workspace_id)
        return self._claims[workspace_id]

    def open_claim(self, workspace_id: str, *, read: bool = True) -> WorkspaceClaim:
        """The workspace's claim, opened if it has none (`read=False`: known to be new)."""
        claim = self.claim(workspace_id) if read else None
        if claim is None:
            claim = self._claims[workspace_id] = WorkspaceClaim.open(workspace_id)
        return claim

    def family(self) -> list[FamilyMember]:
        if self.family_read is None:
            self.family_read = self.svc.family(self.attempt.parent_workspace_id, self.attempt.title)
        return self.family_read

    def touch(self, *aggregates: Aggregate | None) -> None:
        """Save these with the attempt at the next save point (each once, in order)."""
        self._touched += [a for a in aggregates if a is not None and a not in self._touched]

    def save(self) -> None:
        """The save point: the attempt and everything touched since, in one transaction.

        A save that failed took its events from the aggregates and stored none, and
        their versions moved on in memory: a later save of them would leave a gap in
        the log that no one could load. So after one, every save of this unit is a
        conflict: the round starts afresh from the store (`retry_on_conflict`)."""
        if self._lost:
            raise IntegrityError("an earlier save of this hop's state failed: decide again")
        try:
            self.svc.app.save(self.attempt, *self._touched)
        except BaseException:
            self._lost = True
            raise
        self._touched = []
