"""The Brand aggregate: lifecycle, current attempt, and the confirmed pointer.

Public command methods validate and decide; the private `@event` methods only
mutate state (they re-run on every replay).
"""

from __future__ import annotations

from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.errors import BrandDeactivated, CommandRefused
from domain.ids import brand_aggregate_id

ACTIVE = "active"
DEACTIVATED = "deactivated"


class Brand(Aggregate):
    """One brand of the host platform; id = uuid5 of `brand_id`."""

    class Registered(Aggregate.Created):
        brand_id: str
        title: str
        parent_workspace_id: str

    class AttemptBegun(Aggregate.Event):
        attempt_id: UUID
        title: str
        parent_workspace_id: str

    class WorkspaceBound(Aggregate.Event):
        workspace_id: str
        attempt_id: UUID

    class DecommissionStarted(Aggregate.Event):
        workspace_id: str

    class WorkspaceUnbound(Aggregate.Event):
        workspace_id: str
        reason: str
        projects_deleted: int

    class Deactivated(Aggregate.Event):
        pass

    class Reactivated(Aggregate.Event):
        pass

    def __init__(self, brand_id: str, title: str, parent_workspace_id: str) -> None:
        self.brand_id = brand_id
        self.title = title
        self.parent_workspace_id = parent_workspace_id
        self.lifecycle = ACTIVE
        self.current_attempt_id: UUID | None = None
        self.workspace_id: str | None = None
        self.decommissioning: str | None = None

    @classmethod
    def create_id(cls, brand_id: str) -> UUID:
        return brand_aggregate_id(brand_id)

    @classmethod
    def register(cls, brand_id: str, title: str, parent_workspace_id: str) -> Brand:
        return cls._create(
            cls.Registered,
            brand_id=brand_id,
            title=title,
            parent_workspace_id=parent_workspace_id,
        )

    @property
    def is_active(self) -> bool:
        return self.lifecycle == ACTIVE

    # Commands.

    def begin_attempt(self, attempt_id: UUID, title: str, parent_workspace_id: str) -> None:
        if not self.is_active:
            raise BrandDeactivated(f"brand {self.brand_id} is deactivated; reactivate it first")
        if self.decommissioning is not None:
            raise CommandRefused(
                f"brand {self.brand_id}'s workspace {self.decommissioning} is being emptied "
                "after its deactivation; retry in a moment"
            )
        if self.workspace_id is not None and parent_workspace_id != self.parent_workspace_id:
            raise CommandRefused(
                f"brand {self.brand_id} is bound to a workspace under parent "
                f"{self.parent_workspace_id}; deactivate it before moving it to "
                f"{parent_workspace_id}"
            )
        self._attempt_begun(attempt_id, title, parent_workspace_id)

    def bind(self, workspace_id: str, attempt_id: UUID) -> None:
        if not self.is_active:
            raise BrandDeactivated(f"brand {self.brand_id} is deactivated")
        if attempt_id != self.current_attempt_id:
            raise CommandRefused(f"attempt {attempt_id} is not brand {self.brand_id}'s current")
        if workspace_id == self.parent_workspace_id:
            raise CommandRefused("the parent workspace is never bound to a brand")
        if self.workspace_id not in (None, workspace_id):
            raise CommandRefused(
                f"brand {self.brand_id} is bound to {self.workspace_id}; unbind it first"
            )
        self._workspace_bound(workspace_id, attempt_id)

    def unbind(self, reason: str, projects_deleted: int = 0) -> None:
        if self.workspace_id is None:
            raise CommandRefused(f"brand {self.brand_id} has no bound workspace")
        self._workspace_unbound(self.workspace_id, reason, projects_deleted)

    def start_decommission(self) -> None:
        if self.is_active or self.workspace_id is None:
            raise CommandRefused(f"brand {self.brand_id} has nothing to decommission")
        if self.decommissioning != self.workspace_id:
            self._decommission_started(self.workspace_id)

    def deactivate(self) -> None:
        if not self.is_active:
            raise CommandRefused(f"brand {self.brand_id} is already deactivated")
        self._deactivated()

    def reactivate(self) -> None:
        if self.is_active:
            raise CommandRefused(f"brand {self.brand_id} is already active")
        self._reactivated()

    # Events: mutation only.

    @event(AttemptBegun)
    def _attempt_begun(self, attempt_id: UUID, title: str, parent_workspace_id: str) -> None:
        self.current_attempt_id = attempt_id
        self.title = title
        self.parent_workspace_id = parent_workspace_id

    @event(WorkspaceBound)
    def _workspace_bound(self, workspace_id: str, attempt_id: UUID) -> None:
        self.workspace_id = workspace_id

    @event(DecommissionStarted)
    def _decommission_started(self, workspace_id: str) -> None:
        self.decommissioning = workspace_id

    @event(WorkspaceUnbound)
    def _workspace_unbound(self, workspace_id: str, reason: str, projects_deleted: int) -> None:
        self.workspace_id = None
        self.decommissioning = None

    @event(Deactivated)
    def _deactivated(self) -> None:
        self.lifecycle = DEACTIVATED

    @event(Reactivated)
    def _reactivated(self) -> None:
        self.lifecycle = ACTIVE
