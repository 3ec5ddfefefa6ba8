"""The WorkspaceClaim aggregate: one workspace belongs to at most one brand.

Its id is uuid5 of the workspace id, so two writers that both try to open a
claim for the same workspace collide in the event store; a claim that exists
is version-checked when it changes hands. Saved together with the event that
accepts or binds the workspace, it makes "one workspace, one brand" an
invariant of the event store rather than of a read model.

While an attempt empties a workspace it created (a release), the claim is
marked `Releasing` first, in its own version-checked save: nobody can adopt
the workspace between the check and the deletes. The claim is released when
the emptying is recorded; the empty shell may then be adopted again.
"""

from __future__ import annotations

from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.errors import AlreadyClaimed
from domain.ids import claim_aggregate_id


class WorkspaceClaim(Aggregate):
    class Opened(Aggregate.Created):
        workspace_id: str

    class Claimed(Aggregate.Event):
        brand_id: str
        attempt_id: UUID

    class Releasing(Aggregate.Event):
        brand_id: str
        attempt_id: UUID

    class Released(Aggregate.Event):
        brand_id: str
        reason: str

    def __init__(self, workspace_id: str) -> None:
        self.workspace_id = workspace_id
        self.brand_id: str | None = None
        self.attempt_id: UUID | None = None
        # Set while an attempt empties the workspace: nobody may claim it meanwhile.
        self.releasing_by: UUID | None = None
        self.attempts_named: frozenset[UUID] = frozenset()  # every attempt it ever named

    @classmethod
    def create_id(cls, workspace_id: str) -> UUID:
        return claim_aggregate_id(workspace_id)

    @classmethod
    def open(cls, workspace_id: str) -> WorkspaceClaim:
        return cls._create(cls.Opened, workspace_id=workspace_id)

    def held_by_other_than(self, brand_id: str) -> bool:
        """Not available to this brand: another brand holds it, or it is being emptied."""
        return self.releasing_by is not None or (
            self.brand_id is not None and self.brand_id != brand_id
        )

    def claim(self, brand_id: str, attempt_id: UUID) -> None:
        if self.releasing_by is not None:
            raise AlreadyClaimed(f"workspace {self.workspace_id} is being emptied")
        if self.held_by_other_than(brand_id):
            raise AlreadyClaimed(
                f"workspace {self.workspace_id} is claimed by brand {self.brand_id}"
            )
        if self.brand_id == brand_id and self.attempt_id == attempt_id:
            return
        self._claimed(brand_id, attempt_id)

    def begin_release(self, brand_id: str, attempt_id: UUID) -> None:
        """Reserve the workspace for emptying by this attempt (saved before any delete)."""
        if self.releasing_by == attempt_id:
            return
        if self.releasing_by is not None or (
            self.brand_id is not None and self.attempt_id != attempt_id
        ):
            raise AlreadyClaimed(
                f"workspace {self.workspace_id} is held by attempt {self.attempt_id}"
            )
        self._releasing(brand_id, attempt_id)

    def release(self, reason: str) -> None:
        if self.brand_id is None:
            return
        self._released(self.brand_id, reason)

    @event(Claimed)
    def _claimed(self, brand_id: str, attempt_id: UUID) -> None:
        self.brand_id = brand_id
        self.attempt_id = attempt_id
        self.attempts_named |= {attempt_id}

    @event(Releasing)
    def _releasing(self, brand_id: str, attempt_id: UUID) -> None:
        self.brand_id = brand_id
        self.attempt_id = attempt_id
        self.releasing_by = attempt_id
        self.attempts_named |= {attempt_id}

    @event(Released)
    def _released(self, brand_id: str, reason: str) -> None:
        self.brand_id = None
        self.attempt_id = None
        self.releasing_by = None
