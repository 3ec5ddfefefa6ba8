"""The Brand aggregate: lifecycle, current attempt, and the confirmed pointer.

Public command methods validate and decide; the private `@event` methods only
mutate state (they re-run on every replay).

Command ordering: `provision` and `deactivate` carry their producer's time
(`requested_at`). The brand remembers the newest one it applied
(`last_command_at`) and its kind (`last_command_kind`), and ignores, on record
(`CommandIgnored`), any command that is older, a redelivery, or loses a tie
(`stale_because`): a late or redelivered command never undoes a later one, so
whatever order they run in, the brand ends as its producer's last command says.

Retention: a deactivation records when the still-bound workspace is to be
emptied (`purge_at`, the end of the retention window); the decommission waits
until then (`decommission_due`), and a reactivation before then cancels it.
A gateway that refuses for good to empty it (`DecommissionRefused`) stops the
decommission until a newer deactivation (`--purge-now`, once fixed upstream), a
reactivation or an unbind.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.errors import BrandDeactivated, CommandRefused, RetryLater
from domain.ids import brand_aggregate_id
from domain.stored import safe_message

ACTIVE = "active"
DEACTIVATED = "deactivated"
PROVISION = "provision"
DEACTIVATE = "deactivate"
# A command without a producer's time is ordered right after everything applied.
TICK = timedelta(microseconds=1)
# A delayed decommission may arrive a moment before its time (clocks, the wait ladder).
DUE_SLACK = timedelta(seconds=1)


def _requested_at_is_the_record_time(state: dict[str, Any]) -> None:
    """Upcaster: events stored before commands carried a time ordered by when they
    were recorded."""
    state["requested_at"] = state["timestamp"]


def _emptied_at_once(state: dict[str, Any]) -> None:
    """Upcaster: a deactivation stored before the retention window emptied the bound
    workspace at once."""
    state["purge_at"] = state["timestamp"]


class Brand(Aggregate):
    """One brand of the host platform; id = uuid5 of `brand_id`."""

    class Registered(Aggregate.Created):
        brand_id: str
        title: str
        parent_workspace_id: str

    class AttemptBegun(Aggregate.Event):
        class_version = 2
        attempt_id: UUID
        title: str
        parent_workspace_id: str
        requested_at: datetime  # the provision command's time

        upcast_v1_v2 = staticmethod(_requested_at_is_the_record_time)

    class WorkspaceBound(Aggregate.Event):
        workspace_id: str
        attempt_id: UUID

    class DecommissionStarted(Aggregate.Event):
        workspace_id: str

    class DecommissionRefused(Aggregate.Event):
        workspace_id: str
        message: str  # the gateway's words

    class WorkspaceUnbound(Aggregate.Event):
        workspace_id: str
        reason: str
        projects_deleted: int

    class Deactivated(Aggregate.Event):
        class_version = 3
        requested_at: datetime  # the deactivate command's time
        purge_at: datetime  # when a still-bound workspace is emptied (retention's end)

        upcast_v1_v2 = staticmethod(_requested_at_is_the_record_time)
        upcast_v2_v3 = staticmethod(_emptied_at_once)

    class ProvisionNoted(Aggregate.Event):
        attempt_id: UUID  # the pending attempt that serves it
        requested_at: datetime

    class CommandIgnored(Aggregate.Event):
        command: str  # provision | deactivate
        requested_at: datetime
        reason: str

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
        self.purge_at: datetime | None = None  # deactivated: when the workspace is emptied
        self.emptying_refused: str | None = None  # the gateway refused it for good: its words
        self.last_command_at: datetime | None = None  # newest command time applied
        self.last_command_kind: str | None = None  # provision | deactivate, at that time

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

    @classmethod
    def tombstone(cls, brand_id: str, requested_at: datetime) -> Brand:
        """A `deactivate` for a brand never seen: recorded (registered, then
        deactivated at `requested_at`) so that an older `provision` arriving
        after it is refused as stale."""
        brand = cls.register(brand_id, "", "")
        brand.deactivate(requested_at)
        return brand

    @property
    def is_active(self) -> bool:
        return self.lifecycle == ACTIVE

    @property
    def to_be_emptied_at(self) -> datetime | None:
        """When the deactivated brand's still-bound workspace is emptied; else None (also
        while its emptying is refused: not until an operator deactivates it again)."""
        if self.is_active or self.workspace_id is None or self.emptying_refused is not None:
            return None
        return self.purge_at

    def decommission_due(self, now: datetime) -> bool:
        """Deactivated, still bound, and its retention window over (or the emptying
        already begun): the decommission may empty the workspace now. Not while the
        gateway's refusal to empty it is on record: nobody retries that for ever."""
        if self.is_active or self.workspace_id is None or self.emptying_refused is not None:
            return False
        if self.decommissioning == self.workspace_id or self.purge_at is None:
            return True
        return self.purge_at <= now + DUE_SLACK

    # Command ordering.

    def command_time(self, requested_at: datetime | None, now: datetime) -> datetime:
        """The time a command is ordered by: its producer's, else `now` (but never
        before a command already applied: a command without a time is the newest)."""
        if requested_at is not None:
            return requested_at
        if self.last_command_at is not None and now <= self.last_command_at:
            return self.last_command_at + TICK
        return now

    def stale_because(
        self, command: str, requested_at: datetime, title: str = "", parent: str = ""
    ) -> str | None:
        """Why the command is stale (not applied), or None if it is newer than the
        last command the brand applied or wins a tie with it.

        Ties (equal times): the same command again is a redelivery; a `deactivate`
        wins over a `provision` whichever runs first; of two provisions with
        different titles or parents, the greater (title, parent) wins. So every
        order of a producer's commands ends the same way.
        """
        last, kind = self.last_command_at, self.last_command_kind
        if last is None or requested_at > last:
            return None
        if requested_at < last:
            what = "older than"
        elif command == DEACTIVATE and kind == PROVISION:
            return None  # a deactivate wins a tie
        elif command == PROVISION and kind == PROVISION:
            key, applied = (title, parent), (self.title, self.parent_workspace_id)
            if key > applied:
                return None
            what = "a redelivery of" if key == applied else "a tie it loses with"
        elif command == kind:
            what = "a redelivery of"
        else:
            what = "a tie it loses with (a deactivate wins)"
        return (
            f"{command} requested at {requested_at.isoformat()} is {what} the brand's "
            f"last applied command ({kind} at {last.isoformat()})"
        )

    def ignore_if_stale(
        self, command: str, requested_at: datetime, title: str = "", parent: str = ""
    ) -> str | None:
        """Record and return why the command is ignored, if it is stale (a late or
        redelivered one, or the loser of a tie); else None."""
        reason = self.stale_because(command, requested_at, title, parent)
        if reason is not None:
            self._command_ignored(command, requested_at, reason)
        return reason

    # Commands.

    def check_provision_possible(self, parent_workspace_id: str | None = None) -> None:
        """Raise RetryLater while the workspace is being emptied after a deactivation,
        and while a deactivated brand is still bound under another parent than the
        provision's (its decommission, already owed, unbinds it)."""
        if self.decommissioning is not None:
            raise RetryLater(
                f"brand {self.brand_id}'s workspace {self.decommissioning} is being emptied "
                "after its deactivation; retry in a moment"
            )
        moving = parent_workspace_id not in (None, self.parent_workspace_id)
        if not self.is_active and self.workspace_id is not None and moving:
            when = f" at {self.purge_at.isoformat()}" if self.purge_at else ""
            if self.emptying_refused is not None:
                when = f" (its emptying was refused: {self.emptying_refused}; fix it upstream)"
            raise RetryLater(
                f"brand {self.brand_id} is deactivated and still bound to {self.workspace_id} "
                f"under parent {self.parent_workspace_id}; it moves to {parent_workspace_id} "
                f"once that workspace is decommissioned{when} (`provisioner deactivate "
                "--purge-now` empties it now): retry then"
            )

    def note_provision(self, attempt_id: UUID, requested_at: datetime) -> None:
        """A newer provision that the pending current attempt already serves (same
        title and parent): its time counts as applied, so an older deactivate that
        arrives later is stale."""
        if attempt_id != self.current_attempt_id:
            raise CommandRefused(f"attempt {attempt_id} is not brand {self.brand_id}'s current")
        if self.stale_because(PROVISION, requested_at, self.title, self.parent_workspace_id):
            raise CommandRefused(f"brand {self.brand_id}: provision at {requested_at} is stale")
        self._provision_noted(attempt_id, requested_at)

    def begin_attempt(
        self, attempt_id: UUID, title: str, parent_workspace_id: str, requested_at: datetime
    ) -> None:
        if not self.is_active:
            raise BrandDeactivated(f"brand {self.brand_id} is deactivated; reactivate it first")
        self.check_provision_possible(parent_workspace_id)
        if self.workspace_id is not None and parent_workspace_id != self.parent_workspace_id:
            # Refused for now, not for good: the deactivate that must come first
            # may have been sent before this provision and not have run yet.
            raise RetryLater(
                f"brand {self.brand_id} is bound to a workspace under parent "
                f"{self.parent_workspace_id}; deactivate it before moving it to "
                f"{parent_workspace_id} (retried for a while in case a deactivate is on its way)"
            )
        self._attempt_begun(attempt_id, title, parent_workspace_id, requested_at)

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

    def refuse_decommission(self, message: str) -> None:
        """The gateway refused for good to empty the bound workspace (a 4xx on its
        projects): on record, not retried, the workspace kept and still bound. A
        newer deactivation (`--purge-now` once fixed upstream), a reactivation or an
        unbind clears it."""
        if self.workspace_id is None or self.decommissioning != self.workspace_id:
            raise CommandRefused(f"brand {self.brand_id} has no decommission under way")
        self._decommission_refused(self.workspace_id, safe_message(message))

    def deactivate(self, requested_at: datetime, purge_at: datetime | None = None) -> None:
        """Deactivate, or (already deactivated) record the newer deactivation's time.

        A bound workspace is emptied at `purge_at` (default: at once); a later
        deactivation never puts off one already set (the earlier time stays)."""
        if self.stale_because(DEACTIVATE, requested_at) is not None:
            raise CommandRefused(
                f"brand {self.brand_id}: deactivate at {requested_at.isoformat()} is stale"
            )
        purge_at = requested_at if purge_at is None else purge_at
        if not self.is_active and self.purge_at is not None:
            purge_at = min(purge_at, self.purge_at)
        self._deactivated(requested_at, purge_at)

    def reactivate(self) -> None:
        if self.is_active:
            raise CommandRefused(f"brand {self.brand_id} is already active")
        self._reactivated()

    # Events: mutation only.

    @event(AttemptBegun)
    def _attempt_begun(
        self, attempt_id: UUID, title: str, parent_workspace_id: str, requested_at: datetime
    ) -> None:
        self.current_attempt_id = attempt_id
        self.title = title
        self.parent_workspace_id = parent_workspace_id
        self._applied(PROVISION, requested_at)

    @event(WorkspaceBound)
    def _workspace_bound(self, workspace_id: str, attempt_id: UUID) -> None:
        self.workspace_id = workspace_id

    @event(DecommissionStarted)
    def _decommission_started(self, workspace_id: str) -> None:
        self.decommissioning = workspace_id

    @event(DecommissionRefused)
    def _decommission_refused(self, workspace_id: str, message: str) -> None:
        self.emptying_refused = message
        self.decommissioning = None  # nothing under way: a provision is not held back

    @event(WorkspaceUnbound)
    def _workspace_unbound(self, workspace_id: str, reason: str, projects_deleted: int) -> None:
        self.workspace_id = None
        self.decommissioning = None
        self.purge_at = None
        self.emptying_refused = None

    @event(Deactivated)
    def _deactivated(self, requested_at: datetime, purge_at: datetime) -> None:
        self.lifecycle = DEACTIVATED
        self.purge_at = purge_at
        self.emptying_refused = None  # an operator's retry, once fixed upstream
        self._applied(DEACTIVATE, requested_at)

    @event(ProvisionNoted)
    def _provision_noted(self, attempt_id: UUID, requested_at: datetime) -> None:
        self._applied(PROVISION, requested_at)

    @event(CommandIgnored)
    def _command_ignored(self, command: str, requested_at: datetime, reason: str) -> None:
        pass

    def _applied(self, kind: str, requested_at: datetime) -> None:
        """Remember the newest command applied and its kind (derived from the events
        alone, so a log written before kinds were remembered loads the same way)."""
        if self.last_command_at is None or requested_at >= self.last_command_at:
            self.last_command_at = requested_at
            self.last_command_kind = kind

    @event(Reactivated)
    def _reactivated(self) -> None:
        self.lifecycle = ACTIVE
        self.purge_at = None  # the pending emptying is cancelled
        self.emptying_refused = None
