"""The ProvisioningAttempt aggregate: one try at giving a brand its workspace.

Its stream is the attempt's audit trail and its record of ownership: what our
creates made is ours to release unless the attempt ends promoted with it. One
`HopScheduled` per hop bounds the stream by the settle budget and, for hops the
gateway did not answer, by the deadline over the deferral cap.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID, uuid4

from eventsourcing.domain import Aggregate, event

from domain.creates import grace_start
from domain.errors import CommandRefused
from domain.ownership import Creates, is_parent
from domain.policies import AttemptState, FailureReason, Provenance, owed_releases
from domain.stored import deferred_false, paced_false, safe_message, spent_unless_deferred


class ProvisioningAttempt(Aggregate):
    class Started(Aggregate.Created):
        brand_id: str
        title: str
        parent_workspace_id: str
        existing_workspace_id: str | None
        max_hop: int

    class CreateRequested(Aggregate.Event):
        hop: int
        known_ids: list[str]
        requested_at: datetime

    class CreateRefused(Aggregate.Event):
        hop: int
        message: str

    class CreateUnconfirmed(Aggregate.Event):
        hop: int
        message: str
        answered: bool  # the gateway answered (a 5xx): it holds the create no longer

    class SurplusCreated(Aggregate.Event):
        workspace_id: str
        hop: int

    class CandidateAccepted(Aggregate.Event):
        workspace_id: str
        provenance: str
        hop: int

    class CandidateDropped(Aggregate.Event):
        workspace_id: str
        status: str
        hop: int

    class HopScheduled(Aggregate.Event):
        class_version = 4
        hop: int
        not_before: datetime
        last_status: str
        # The gateway did not answer (429, 5xx, timeout, refused, circuit open): the
        # hop asks again later; it does not use up the settle budget.
        deferred: bool
        # It spent a hop of the settle budget: a workspace still settling (not a
        # deferral, the wait for an unconfirmed create within its grace, nor the
        # first wait after a create, before the workspace was asked).
        spent: bool
        # A deferral for the fleet's own turn (its rate, a shared Retry-After): the
        # gateway was not asked, so it is no deferral "in a row" for the backoff.
        paced: bool

        upcast_v1_v2 = staticmethod(deferred_false)
        upcast_v2_v3 = staticmethod(spent_unless_deferred)
        upcast_v3_v4 = staticmethod(paced_false)

    class Promoted(Aggregate.Event):
        workspace_id: str
        hop: int

    class Failed(Aggregate.Event):
        reason: str
        message: str
        hop: int

    class Cancelled(Aggregate.Event):
        why: str

    class Superseded(Aggregate.Event):
        by_attempt_id: UUID

    class CandidateReleased(Aggregate.Event):
        workspace_id: str
        projects_deleted: int

    class CandidateHandedOver(Aggregate.Event):
        workspace_id: str
        to_attempt_id: UUID

    class ReleaseRefused(Aggregate.Event):
        workspace_id: str
        message: str

    class CreditedByInference(Aggregate.Event):
        """A lost create of ours is credited with this workspace, not by proof: recorded
        next (as the candidate, or a surplus owed a release that deletes nothing)."""

        workspace_id: str
        evidence: str

    def __init__(
        self,
        brand_id: str,
        title: str,
        parent_workspace_id: str,
        existing_workspace_id: str | None,
        max_hop: int,
    ) -> None:
        self.brand_id = brand_id
        self.title = title
        self.parent_workspace_id = parent_workspace_id
        self.max_hop = max_hop
        self.state = AttemptState.PENDING
        self.expected_hop = 0
        self.not_before: datetime | None = None
        self.last_status = ""
        self.candidate_id: str | None = existing_workspace_id
        self.provenance: Provenance | None = Provenance.EXISTING if existing_workspace_id else None
        self.create_requested_hop: int | None = None
        self.create_requested_at: datetime | None = None
        self.create_answered = False  # the gateway answered it without an id (a 5xx)
        # Same-title children before the first create that may still show up (kept while
        # an earlier one is unresolved or lost): what appears beside them may be ours.
        self.create_known_ids: tuple[str, ...] = ()
        self.failure_reason: FailureReason | None = None
        self.created_ids: tuple[str, ...] = ()  # every workspace our creates made
        # Creates given up unconfirmed (for a new create or an adoption): what they made
        # may still appear upstream, so the search goes on after the attempt ends.
        self.creates_lost = 0
        self.creates_given_up = 0  # ... for a new create (at most MAX_CREATES - 1)
        # No longer owed: emptied, handed to a later attempt, or refused for good (below).
        self.released_ids: tuple[str, ...] = ()
        self.refused_ids: tuple[str, ...] = ()  # the gateway refused to empty: left as is
        # Credited to a lost create by inference (`domain.ownership`), not by proof.
        self.inferred_ids: tuple[str, ...] = ()
        self.settle_hops = 0  # hops the gateway answered "not yet" (the settle budget)
        self.deferrals = 0  # hops the gateway did not answer, in all
        self.deferred_in_row = 0  # ... since the last hop it answered
        self.unanswered_in_row = 0  # ... of them, the gateway's (not the fleet's pace)
        # When the gateway last answered: the event before the first of those deferrals.
        self.unavailable_since: datetime | None = None
        # When the last deferral ended: an unconfirmed create's grace restarts then.
        self.deferred_until: datetime | None = None

    @classmethod
    def create_id(cls, **_: object) -> UUID:
        return uuid4()

    @classmethod
    def start(
        cls,
        brand_id: str,
        title: str,
        parent_workspace_id: str,
        existing_workspace_id: str | None,
        max_hop: int,
    ) -> ProvisioningAttempt:
        return cls._create(
            cls.Started,
            brand_id=brand_id,
            title=title,
            max_hop=max_hop,
            parent_workspace_id=parent_workspace_id,
            existing_workspace_id=existing_workspace_id,
        )

    # Queries.

    @property
    def is_terminal(self) -> bool:
        return self.state.is_terminal

    @property
    def create_unresolved(self) -> bool:
        """A create was requested and no candidate came of it yet."""
        return self.create_requested_hop is not None

    @property
    def create_lost(self) -> bool:
        """An earlier create was given up unconfirmed."""
        return self.creates_lost > 0

    @property
    def creates(self) -> Creates:
        """Its creates, as the rule of what they made needs them (`domain.creates`)."""
        candidate = () if self.candidate_id is None else (self.candidate_id,)
        on_record = frozenset((*self.created_ids, *candidate))
        at = self.create_requested_at
        since = None if at is None else grace_start(at, self.deferred_until, self.create_answered)
        return Creates(
            frozenset(self.create_known_ids),
            on_record,
            self.creates_lost,
            since,
            frozenset(self.inferred_ids),
        )

    @property
    def orphan_search(self) -> bool:
        """Whether a create's workspace may still appear upstream: ours to find and release."""
        unresolved = self.create_unresolved and self.state is not AttemptState.PROMOTED
        return unresolved or self.create_lost

    @property
    def owed_releases(self) -> tuple[str, ...]:
        """Workspaces our creates made that will not be used and are not released yet."""
        return owed_releases(
            self.created_ids, self.released_ids, self.candidate_id, self.state, self.failure_reason
        )

    @property
    def release_owed(self) -> bool:
        return bool(self.owed_releases)

    def is_stale(self, now: datetime, stale_after_s: float) -> bool:
        return not self.is_terminal and (now - self.modified_on).total_seconds() > stale_after_s

    # Commands.

    def _require_pending(self, what: str) -> None:
        if self.is_terminal:
            raise CommandRefused(f"attempt {self.id} is {self.state.value}; cannot {what}")

    def _require_owed(self, workspace_id: str) -> None:
        if workspace_id not in self.owed_releases:
            raise CommandRefused(f"attempt {self.id} owes no release of {workspace_id}")

    def request_create(self, hop: int, known_ids: list[str], now: datetime) -> None:
        self._require_pending("request a create")
        if self.candidate_id is not None:
            raise CommandRefused(f"attempt {self.id} already has candidate {self.candidate_id}")
        # The first create's baseline is kept while an earlier create may still show up:
        # what appeared since may be what it made. Once every earlier create was resolved,
        # what appeared since is someone else's: the baseline is what is there now.
        earlier_may_appear = self.create_unresolved or self.create_lost
        baseline = self.create_known_ids if earlier_may_appear else tuple(known_ids)
        self._create_requested(hop, sorted(baseline), now)

    def record_create_refused(self, hop: int, message: str) -> None:
        """The gateway answered the create with a refusal: nothing was made, so there
        is nothing to find in the family or to release for it."""
        if self.create_requested_hop is None:
            raise CommandRefused(f"attempt {self.id} has no create in flight")
        self._create_refused(hop, safe_message(message))

    def record_create_unconfirmed(self, hop: int, message: str, answered: bool) -> None:
        """The create came back without an id and may have made one (a timeout, a 5xx)."""
        if self.create_requested_hop is None:
            raise CommandRefused(f"attempt {self.id} has no create in flight")
        self._create_unconfirmed(hop, safe_message(message), answered)

    def accept_candidate(self, workspace_id: str, provenance: Provenance, hop: int) -> None:
        self._require_pending("accept a candidate")
        if not workspace_id:
            raise CommandRefused("a candidate needs a workspace id")
        if is_parent(workspace_id, (self.parent_workspace_id,)):
            raise CommandRefused("the parent workspace is never a candidate")
        if self.candidate_id is not None:
            raise CommandRefused(f"attempt {self.id} already has candidate {self.candidate_id}")
        self._candidate_accepted(workspace_id, provenance.value, hop)

    def record_created(self, workspace_id: str, hop: int) -> None:
        """Record a workspace our create made, whatever happened concurrently: the
        candidate if the attempt can still take one, else a surplus owed a release."""
        if not workspace_id or is_parent(workspace_id, (self.parent_workspace_id,)):
            raise CommandRefused("a created workspace needs its own id, never the parent's")
        if workspace_id in self.created_ids:
            return
        if self.candidate_id is None and self.state is not AttemptState.PROMOTED:
            self._candidate_accepted(workspace_id, Provenance.CREATED.value, hop)
        else:
            self._surplus_created(workspace_id, hop)

    def note_inferred(self, workspace_id: str, evidence: str) -> None:
        """Mark a workspace a lost create of ours is credited with by inference
        (`domain.ownership.credit`), before it is accepted or recorded as created:
        what is on record by inference is never emptied of projects."""
        if workspace_id not in (*self.created_ids, *self.inferred_ids):
            self._credited_by_inference(workspace_id, safe_message(evidence))

    def drop_candidate(self, status: str, hop: int) -> None:
        self._require_pending("drop its candidate")
        if self.candidate_id is None:
            raise CommandRefused(f"attempt {self.id} has no candidate to drop")
        self._candidate_dropped(self.candidate_id, safe_message(status), hop)

    def schedule_hop(
        self,
        hop: int,
        not_before: datetime,
        last_status: str,
        *,
        deferred: bool = False,
        spends: bool = True,
        paced: bool = False,
    ) -> None:
        """The next hop: a settle wait (at most `max_hop`), one that spends none, or a
        deferral (`paced`: held for the fleet's own turn)."""
        self._require_pending("schedule a hop")
        spent = spends and not deferred
        if hop != self.expected_hop + 1 or (spent and self.settle_hops >= self.max_hop):
            raise CommandRefused(f"attempt {self.id} cannot schedule hop {hop}")
        paced = paced and deferred
        self._hop_scheduled(
            hop, not_before, safe_message(last_status), deferred=deferred, spent=spent, paced=paced
        )

    def promote(self, hop: int) -> None:
        self._require_pending("be promoted")
        if self.candidate_id is None:
            raise CommandRefused(f"attempt {self.id} has no candidate to promote")
        self._promoted(self.candidate_id, hop)

    def fail(self, reason: FailureReason, message: str, hop: int) -> None:
        self._require_pending("fail")
        self._failed(reason.value, safe_message(message), hop)

    def cancel(self, why: str) -> None:
        self._require_pending("be cancelled")
        self._cancelled(safe_message(why))

    def supersede(self, by_attempt_id: UUID) -> None:
        self._require_pending("be superseded")
        self._superseded(by_attempt_id)

    def record_release(self, workspace_id: str, projects_deleted: int) -> None:
        """Record that a workspace we created was emptied and will not be used."""
        if workspace_id not in self.released_ids:
            self._require_owed(workspace_id)
            self._candidate_released(workspace_id, projects_deleted)

    def record_hand_over(self, workspace_id: str, to_attempt_id: UUID) -> None:
        """A later attempt of the same brand took the workspace on: nothing to empty."""
        self._require_owed(workspace_id)
        self._candidate_handed_over(workspace_id, to_attempt_id)

    def record_release_refused(self, workspace_id: str, message: str) -> None:
        """The gateway refused for good to empty a workspace we owe (a 4xx on its
        projects): a decision on record, left to an operator, not retried forever."""
        self._require_owed(workspace_id)
        self._release_refused(workspace_id, safe_message(message))

    # Events: mutation only.

    @event(CreateRequested)
    def _create_requested(self, hop: int, known_ids: list[str], requested_at: datetime) -> None:
        if self.create_requested_hop is not None:  # the one before was given up unconfirmed
            self.creates_lost += 1
            self.creates_given_up += 1
        self.create_requested_hop = hop
        self.create_requested_at = requested_at
        self.create_answered = False
        self.create_known_ids = tuple(known_ids)

    @event(CreateRefused)
    def _create_refused(self, hop: int, message: str) -> None:
        self.create_requested_hop = None

    @event(CreateUnconfirmed)
    def _create_unconfirmed(self, hop: int, message: str, answered: bool) -> None:
        self.create_answered = answered

    @event(SurplusCreated)
    def _surplus_created(self, workspace_id: str, hop: int) -> None:
        self.created_ids = (*self.created_ids, workspace_id)
        self.create_requested_hop = None

    @event(CandidateAccepted)
    def _candidate_accepted(self, workspace_id: str, provenance: str, hop: int) -> None:
        if provenance == Provenance.ADOPTED.value and self.create_requested_hop is not None:
            self.creates_lost += 1  # adopted after giving an unconfirmed create up
        self.candidate_id = workspace_id
        self.provenance = Provenance(provenance)
        if self.provenance is Provenance.CREATED:
            self.created_ids = (*self.created_ids, workspace_id)
        self.create_requested_hop = None

    @event(CandidateDropped)
    def _candidate_dropped(self, workspace_id: str, status: str, hop: int) -> None:
        self.candidate_id = None
        self.provenance = None
        self.last_status = status

    @event(HopScheduled)
    def _hop_scheduled(
        self,
        hop: int,
        not_before: datetime,
        last_status: str,
        *,
        deferred: bool,
        spent: bool,
        paced: bool,
    ) -> None:
        self.expected_hop = hop
        self.not_before = not_before
        self.last_status = last_status
        if deferred:
            self.deferred_until = not_before
            if not self.deferred_in_row:
                self.unavailable_since = self.modified_on  # the event before this one
            self.deferrals += 1
            self.deferred_in_row += 1
            self.unanswered_in_row += not paced
        else:
            self.settle_hops += spent
            self.deferred_in_row = 0
            self.unanswered_in_row = 0
            self.unavailable_since = None

    @event(Promoted)
    def _promoted(self, workspace_id: str, hop: int) -> None:
        self.state = AttemptState.PROMOTED

    @event(Failed)
    def _failed(self, reason: str, message: str, hop: int) -> None:
        self.state = AttemptState.FAILED
        self.failure_reason = FailureReason(reason)
        self.last_status = message

    @event(Cancelled)
    def _cancelled(self, why: str) -> None:
        self.state = AttemptState.CANCELLED

    @event(Superseded)
    def _superseded(self, by_attempt_id: UUID) -> None:
        self.state = AttemptState.SUPERSEDED

    @event(CandidateReleased)
    def _candidate_released(self, workspace_id: str, projects_deleted: int) -> None:
        self.released_ids = (*self.released_ids, workspace_id)
        self.create_requested_hop = None

    @event(CandidateHandedOver)
    def _candidate_handed_over(self, workspace_id: str, to_attempt_id: UUID) -> None:
        self.released_ids = (*self.released_ids, workspace_id)

    @event(CreditedByInference)
    def _credited_by_inference(self, workspace_id: str, evidence: str) -> None:
        self.inferred_ids = (*self.inferred_ids, workspace_id)

    @event(ReleaseRefused)
    def _release_refused(self, workspace_id: str, message: str) -> None:
        self.released_ids = (*self.released_ids, workspace_id)
        self.refused_ids = (*self.refused_ids, workspace_id)


# The events that end an attempt, and the state each leaves it in (read models use it).
ENDED_BY: dict[type, AttemptState] = {
    ProvisioningAttempt.Promoted: AttemptState.PROMOTED,
    ProvisioningAttempt.Failed: AttemptState.FAILED,
    ProvisioningAttempt.Cancelled: AttemptState.CANCELLED,
    ProvisioningAttempt.Superseded: AttemptState.SUPERSEDED,
}
