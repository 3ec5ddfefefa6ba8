"""What one hop decides, and in what order: `decide(view, seen)`, a pure function.

A hop is one short step of one attempt. Its runner
(`infrastructure.usecases.hop`) loops: build the `HopView` of the attempt as it
stands, ask `decide` what comes next, perform it (an `Effect`: a read, a call,
a change recorded on the aggregates), note what came back in `Seen`, and ask
again, until `decide` answers an `Ending`. So the order below is the whole
order of a hop, top to bottom:

1. put on record what an earlier round of this run created (`RecordLate`), and
   empty what the attempt owes (`ReleaseOwed`);
2. the gate: a terminal attempt, a stale, duplicate or future hop stands down;
3. a candidate: poll it (`Poll`), and its status decides (`status_answered`);
   one this round's create has just made is not polled: the hop waits the first
   settle wait, spending no budget (decision 049);
4. an unconfirmed create: read the title slot, then what our lost creates made
   (`CreditLostCreates`); accept it, wait for it, or go on as if it never happened;
5. adopt (`FindAdoptable`, `TakeCandidate`) or create (`RequestCreate`), and what
   the create answered (`RecordCreated`, `NoteUnconfirmed`, a refusal, a failure;
   a 429 whose Retry-After its thread waited out: `RecordRefusal`, then create
   again, once a round).

No I/O, no clock reads, no exceptions for control flow: a gateway fault reaches
here as a `GatewayFault` value, the time as the view's `now`. The steps are
`domain.steps`'s; what a create means, `domain.creates`'s; whose a workspace is,
`domain.ownership`'s; how long a `Wait` or a `Defer` lasts, `domain.waits`'s. The
table of situations and decisions is docs/hop-table.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from domain import creates
from domain.outcomes import Outcome, StandDown
from domain.ownership import Made
from domain.policies import (
    AttemptState,
    FailureReason,
    Provenance,
    StatusClass,
)
from domain.policies import classify_status as _classify
from domain.ports import FaultKind, GatewayFault
from domain.steps import (
    Accept,
    Create,
    CreateAgain,
    Defer,
    DropCandidate,
    DropExisting,
    Fail,
    Promote,
    Record,
    Recover,
    Refused,
    Schedule,
    Stand,
    Wait,
    acquire_faulted,
    unavailable,
)

# What the runner is asked to perform, and what it notes of each.


# Why the create's own hop ends in a wait, on record as the hop's last status.
CREATED_WAIT = "created; first poll after the first settle wait"


@dataclass(frozen=True, slots=True)
class RecordLate:
    """Put on record what an earlier round of this run created (saved at once);
    notes `record_failed` if it cannot be ours."""

    workspace_id: str


@dataclass(frozen=True, slots=True)
class ReleaseOwed:
    """Empty what the attempt owes now: its surplus creates, or an ended attempt's all."""


@dataclass(frozen=True, slots=True)
class ReadSlot:
    """Read the title slot (with the brand, in one query); notes `slot_busy`."""


@dataclass(frozen=True, slots=True)
class CreditLostCreates:
    """Read the family, and what ownership credits our lost creates with; notes `made`."""


@dataclass(frozen=True, slots=True)
class FindAdoptable:
    """Read the family's same-title children and those ownership judges adoptable;
    notes `eligible` and `known` (every same-title child listed)."""


@dataclass(frozen=True, slots=True)
class TakeCandidate:
    """Make it the candidate (claimed, its slot freed), on record with what inference
    credited (`inferred`) and the rest our creates made (`shells`: owed a release)."""

    workspace_id: str
    provenance: Provenance
    inferred: tuple[str, ...] = ()
    shells: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RequestCreate:
    """Record the create (the title reserved, saved first), then call it; notes
    `created` (its answer), or `create_conflict` when the save lost a race."""


@dataclass(frozen=True, slots=True)
class RecordRefusal:
    """Put on record the create the gateway refused for now (a 429 whose Retry-After
    its thread waited out), so that the create made again next is on record as its
    own; notes `created_again`."""

    message: str


@dataclass(frozen=True, slots=True)
class RecordCreated:
    """Put on record what the create made: the candidate, else a surplus owed a
    release; notes `record_failed` if it cannot be ours."""

    workspace_id: str


@dataclass(frozen=True, slots=True)
class NoteUnconfirmed:
    """Record the create as unconfirmed, and forget the family read before it: what it
    made is then looked for as a lost create's."""

    message: str
    answered: bool


@dataclass(frozen=True, slots=True)
class Poll:
    """Ask the candidate's status; notes `status`."""

    workspace_id: str


@dataclass(frozen=True, slots=True)
class Race:
    """A save lost a race that is not this hop's to settle: decide again afresh."""


Effect = (
    RecordLate
    | ReleaseOwed
    | ReadSlot
    | CreditLostCreates
    | FindAdoptable
    | TakeCandidate
    | RequestCreate
    | RecordRefusal
    | RecordCreated
    | NoteUnconfirmed
    | Poll
)
Ending = Stand | Wait | Defer | Fail | Refused | Promote | DropExisting | DropCandidate | Race


@dataclass(frozen=True, slots=True)
class HopView:
    """The attempt as the hop sees it, in plain values (rebuilt after every effect)."""

    hop: int
    now: datetime
    state: AttemptState
    expected_hop: int
    title: str
    parent_id: str
    parents: tuple[str, ...]  # every parent the service acts under
    candidate_id: str | None
    provenance: Provenance | None
    late_created: str | None  # what this run created and has not yet seen on record
    created_ids: tuple[str, ...]
    create_unresolved: bool
    create_requested_hop: int | None
    create_requested_at: datetime | None
    create_answered: bool
    deferred_until: datetime | None
    creates_given_up: int
    grace_s: float


@dataclass(slots=True)
class Seen:
    """What this round has performed and what came back, so far: the runner notes each
    effect's answer here (`decide` only reads it)."""

    placed_late: bool = False
    released: bool = False
    record_failed: Fail | None = None
    fault: GatewayFault | None = None  # a read while acquiring got no usable answer
    slot_busy: bool | None = None
    made: Made | None = None
    eligible: tuple[str, ...] | None = None
    known: tuple[str, ...] = ()
    creating: bool = False  # this round requested a create whose answer it has not dealt with
    family_answered: bool = False  # a family read answered (and has not been forgotten)
    created: str | GatewayFault | None = None
    created_again: bool = False  # a create refused for now was recorded, and made again
    create_conflict: tuple[int | None, str | None] | None = None
    status: str | GatewayFault | None = None


def decide(v: HopView, seen: Seen) -> Effect | Ending:
    """The next thing this hop does, given the attempt and what the round has seen."""
    step = _next(v, seen)
    if not seen.family_answered:
        return step
    # The family answered in this round: only the call that deferred went unanswered.
    if isinstance(step, Defer):
        return replace(step, gateway_up=True)
    if isinstance(step, Refused) and isinstance(step.then, Defer):  # a create refused for now
        return replace(step, then=replace(step.then, gateway_up=True))
    return step


def _next(v: HopView, seen: Seen) -> Effect | Ending:
    if v.late_created is not None and not seen.placed_late:
        return RecordLate(v.late_created)
    if seen.record_failed is not None:
        return seen.record_failed
    if not seen.released:  # at each round's start, whatever is owed (maybe nothing)
        return ReleaseOwed()
    stand = gate(v.state, v.expected_hop, v.hop, seen.placed_late)
    if stand is not None:
        return stand
    if seen.fault is not None:
        return acquire_faulted(seen.fault)
    if v.candidate_id is not None:
        return candidate(v.candidate_id, v.provenance, seen.status, seen.created)
    if seen.slot_busy is None:
        return ReadSlot()
    waiting = slot_gate(seen.slot_busy, v.title)
    if waiting is not None:
        return waiting
    if v.create_unresolved and not seen.creating:
        if seen.made is None:
            return CreditLostCreates()
        recovered = recover(v, seen.made)
        if recovered is not None:  # else that create did not happen: adopt or create afresh
            return recovered
    return acquire(v, seen)


def candidate(
    workspace_id: str,
    provenance: Provenance | None,
    status: str | GatewayFault | None,
    created: str | GatewayFault | None,
) -> Poll | Wait | Promote | Defer | DropExisting | DropCandidate | Fail:
    """Poll the candidate and let its status decide; one this round's create has
    just made (`created`) is not asked yet: no gateway has it ready at once, so the
    hop waits the first settle wait, spending no budget (decision 049)."""
    if status is not None:
        return status_answered(status, provenance, workspace_id)
    if created == workspace_id:
        return Wait(CREATED_WAIT, spends=False)
    return Poll(workspace_id)


def recover(v: HopView, made: Made) -> TakeCandidate | Wait | Fail | None:
    """An unconfirmed create: take what our creates made, wait for it, or None."""
    waited_s = 0.0
    if v.create_requested_at is not None:
        since = creates.grace_start(v.create_requested_at, v.deferred_until, v.create_answered)
        waited_s = (v.now - since).total_seconds()
    step = creates.recover(
        made,
        v.title,
        requested_hop=v.create_requested_hop,
        hop=v.hop,
        waited_s=waited_s,
        grace_s=v.grace_s,
    )
    if isinstance(step, Accept):
        return TakeCandidate(step.workspace_id, step.provenance, made.ours, made.ours)
    return step


def acquire(v: HopView, seen: Seen) -> Effect | Ending:
    """Adopt the one adoptable same-title child, else create, and what the create said."""
    if seen.create_conflict is not None:  # first: the view holds a create never saved
        return lost_create_race(*seen.create_conflict, v.hop) or Race()
    if seen.eligible is None:
        return FindAdoptable()
    step = adopt_or_create(seen.eligible, v.title)
    if isinstance(step, Accept):
        return TakeCandidate(step.workspace_id, step.provenance)
    if isinstance(step, Fail):
        return step
    refused = creates.may_create(v.creates_given_up, v.title)
    if refused and v.create_unresolved:  # an unconfirmed create given up
        return refused
    if seen.created is None:
        return RequestCreate()
    answered = creates.create_answered(seen.created, v.parent_id, v.parents)
    if isinstance(answered, CreateAgain):  # once a round; a second is deferred as any 429
        return answered.otherwise if seen.created_again else RecordRefusal(answered.detail)
    if isinstance(answered, Record):
        if answered.workspace_id in (*seen.known, *v.created_ids):
            return creates.created_again(answered.workspace_id)
        return RecordCreated(answered.workspace_id)
    if isinstance(answered, Recover):
        return NoteUnconfirmed(answered.message, answered.answered)
    assert isinstance(answered, Refused | Fail | Wait | Defer), answered
    return answered


STAND_DOWN_BY_STATE = {
    AttemptState.PROMOTED: StandDown.REDELIVERY_OF_PROMOTED,
    AttemptState.CANCELLED: StandDown.CANCELLED,
    AttemptState.SUPERSEDED: StandDown.SUPERSEDED,
    AttemptState.FAILED: StandDown.FAILED,
}


# The gate: terminal, duplicate and out-of-order deliveries.


def gate(state: AttemptState, expected_hop: int, hop: int, placed_late: bool) -> Stand | None:
    """Why this delivery of `hop` may not act on the attempt, if it may not.

    `placed_late`: this run has just recorded a create an earlier round of it
    made; a duplicate then means a concurrent delivery moved the attempt on.
    """
    if state.is_terminal:
        return Stand(STAND_DOWN_BY_STATE[state], f"attempt is {state.value}")
    if hop < expected_hop:
        if placed_late:
            return Stand(StandDown.CONCURRENT_DELIVERY, "next hop polls")
        return Stand(
            StandDown.STALE_HOP,
            f"hop {hop} already done; attempt expects hop {expected_hop}",
            Outcome.DUPLICATE,
        )
    if hop > expected_hop:
        return Stand(StandDown.FUTURE_HOP, f"attempt expects hop {expected_hop}")
    return None


def lost_create_race(requested_hop: int | None, candidate_id: str | None, hop: int) -> Stand | None:
    """Our `CreateRequested` save conflicted: is another delivery of this hop creating?"""
    if requested_hop == hop and candidate_id is None:
        return Stand(StandDown.CONCURRENT_DELIVERY, "another delivery is creating")
    return None


# Acquiring a candidate.


def slot_gate(busy: bool, title: str) -> Wait | None:
    """Before reading the family: another attempt's create of this title may be in flight."""
    if busy:
        return Wait(f"another create titled {title!r} in flight")
    return None


def adopt_or_create(eligible_ids: Sequence[str], title: str) -> Accept | Fail | Create:
    """Exactly one adoptable workspace (ready, empty, not another brand's): adopt it."""
    if len(eligible_ids) == 1:
        return Accept(eligible_ids[0], Provenance.ADOPTED)
    if len(eligible_ids) > 1:
        return Fail(
            FailureReason.AMBIGUOUS,
            f"{len(eligible_ids)} adoptable workspaces titled {title!r}: "
            + ", ".join(sorted(eligible_ids)),
        )
    return Create()


# Polling the candidate.


def status_answered(
    answer: str | GatewayFault, provenance: Provenance | None, workspace_id: str
) -> Promote | Wait | Defer | DropExisting | DropCandidate | Fail:
    """What the candidate's status says: promote, wait, drop it, or fail.

    `creation failed` means nothing usable was made: a new create is safe, so
    the candidate is dropped and the next hop creates (or adopts) afresh.
    `failed`, `error`, `invalid subscription` mean a new create is not safe:
    the attempt fails naming the status and creates nothing more.
    """
    if isinstance(answer, GatewayFault):
        if answer.kind is FaultKind.UNAUTHORIZED:
            return Fail(FailureReason.UNAUTHORIZED, f"gateway refused: {answer.message}")
        if answer.kind is FaultKind.TRANSIENT:
            return unavailable(answer)
        if answer.kind is not FaultKind.GONE:  # malformed: counted as still settling
            return Wait(f"unknown ({answer.message})")
        # Gone: a bound workspace stays bound (the brand reads degraded) for an operator.
        return _terminal(workspace_id, "gone (404)")
    status_class = _classify(answer)
    if status_class is StatusClass.READY:
        return Promote()
    if status_class is StatusClass.SETTLING:
        return Wait(answer)
    if status_class is StatusClass.CREATION_FAILED:
        if provenance is Provenance.EXISTING:  # nothing usable was made: replace it
            return DropExisting(answer, Wait(f"bound workspace reported {answer!r}"))
        return DropCandidate(answer, Wait(f"candidate reported {answer!r}; creating again"))
    return _terminal(workspace_id, answer)


def _terminal(workspace_id: str, raw: str) -> Fail:
    return Fail(FailureReason.TERMINAL_STATUS, f"workspace {workspace_id} reported status {raw!r}")


# Endings: how long a Wait or a Defer lasts is domain.waits's.


def ended(step: Fail | Schedule) -> tuple[Outcome, str]:
    """The outcome a hop reports for its last step."""
    if isinstance(step, Fail):
        return Outcome.FAILED, f"{step.reason.value}: {step.message}"
    if step.deferred:
        return Outcome.DEFERRED, step.status
    return Outcome.SCHEDULED, step.status
