"""What one hop decides, as pure functions of plain values.

The service observes (the attempt, its title slot, the gateway's answers) and
asks these functions what to do; it then records and performs the step they
return. No I/O, no clock reads, no exceptions for control flow: a gateway
fault reaches here as a `GatewayFault` value, the time as an argument.

Steps (what the service does next):
    Stand(why, detail, outcome)   do nothing to the attempt: report why
    Wait(status)                  not yet: schedule the next hop, or fail exhausted
                                  when the settle budget is spent (`schedule_or_exhaust`)
    Defer(status, retry_after_s)  no answer (429, 5xx, timeout, refused, circuit open):
                                  run the hop again later without using the settle
                                  budget, or fail at the deadline (`defer_or_expire`)
    Schedule(hop, not_before, delay_s, status, deferred)   record it, and stop
    Fail(reason, message)         fail the attempt (then release what it owes)
    Refused(detail, then)         record the create as refused, then `then`
    Accept(workspace_id, provenance)   make it the attempt's candidate, then poll
    Record(workspace_id)          record what the create made, then poll
    Promote()                     bind the candidate to the brand; promote
    DropExisting(raw, then)       unbind the brand's terminal workspace; then `then` (Wait)
    DropCandidate(raw, then)      the candidate's creation failed: drop it (a created one
                                  is then owed a release); then Wait: the next hop creates
    Create()                      request a create (reserving the title), call it
    Recover(message, answered)    the create is unconfirmed: record why, then look for it
                                  in the family (`domain.creates`: what our creates made)

A guard (`gate`, `lost_create_race`, `slot_gate`, `creates.may_create`) returns its
objection, or None when it has none.

The table of situations and decisions is docs/hop-table.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from domain.outcomes import Outcome, StandDown
from domain.policies import (
    AttemptState,
    Backoff,
    Deferral,
    FailureReason,
    Provenance,
    StatusClass,
)
from domain.policies import classify_status as _classify
from domain.ports import FaultKind, GatewayFault

# Steps.


@dataclass(frozen=True, slots=True)
class Stand:
    why: StandDown
    detail: str
    outcome: Outcome = Outcome.STOOD_DOWN


@dataclass(frozen=True, slots=True)
class Wait:
    status: str
    # False: not a workspace settling (an unconfirmed create's grace, bounded by it):
    # the wait does not spend the settle budget.
    spends: bool = True


@dataclass(frozen=True, slots=True)
class Defer:
    status: str
    retry_after_s: float = 0.0
    paced: bool = False  # held for the fleet's own turn: due in `retry_after_s`


@dataclass(frozen=True, slots=True)
class Schedule:
    hop: int
    not_before: datetime
    delay_s: float
    status: str
    deferred: bool = False
    spends: bool = True  # spends a hop of the settle budget (never when deferred)


@dataclass(frozen=True, slots=True)
class Fail:
    reason: FailureReason
    message: str


@dataclass(frozen=True, slots=True)
class Refused:
    detail: str
    then: Fail | Defer


@dataclass(frozen=True, slots=True)
class Accept:
    workspace_id: str
    provenance: Provenance


@dataclass(frozen=True, slots=True)
class Record:
    workspace_id: str


@dataclass(frozen=True, slots=True)
class Promote:
    pass


@dataclass(frozen=True, slots=True)
class DropExisting:
    raw: str
    then: Wait


@dataclass(frozen=True, slots=True)
class DropCandidate:
    raw: str
    then: Wait


@dataclass(frozen=True, slots=True)
class Create:
    pass


@dataclass(frozen=True, slots=True)
class Recover:
    message: str = ""
    answered: bool = False  # the gateway answered the create (a 5xx): it holds it no longer


Step = (
    Stand
    | Wait
    | Defer
    | Schedule
    | Fail
    | Refused
    | Accept
    | Record
    | Promote
    | DropExisting
    | DropCandidate
    | Create
    | Recover
)

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


def acquire_faulted(fault: GatewayFault) -> Fail | Wait | Defer:
    """A gateway call while acquiring a candidate failed (family, list projects, create).

    No answer defers the hop; an answer we cannot use (malformed, a refused read)
    counts against the settle budget, as a workspace still settling does."""
    if fault.kind is FaultKind.UNAUTHORIZED:
        return Fail(FailureReason.UNAUTHORIZED, f"gateway refused: {fault.message}")
    if fault.kind is FaultKind.GONE:
        return Fail(FailureReason.REJECTED, f"parent workspace not found: {fault.message}")
    if fault.kind is FaultKind.TRANSIENT:
        return unavailable(fault)
    return Wait(f"gateway answered badly: {fault.message}")  # malformed, a refused read


def unavailable(fault: GatewayFault) -> Defer:
    """The gateway did not answer: defer, after its Retry-After if it gave one."""
    return Defer(f"gateway unavailable: {fault.message}", fault.retry_after_s, fault.paced)


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


# Endings.


def schedule_or_exhaust(
    hop: int,
    max_hop: int,
    backoff: Backoff,
    now: datetime,
    status: str,
    *,
    settled: int,
    spends: bool = True,
) -> Schedule | Fail:
    """Not yet: the next hop after the backoff, or failed when the settle budget is
    spent. `settled`: the settle waits used so far (deferred hops are not counted).
    A wait that does not spend the budget (`spends=False`: an unconfirmed create's
    grace) comes after the first step of the backoff, whatever is left of it."""
    if not spends:
        delay = backoff.delay_after(0)
        return Schedule(hop + 1, now + timedelta(seconds=delay), delay, status, spends=False)
    if settled < max_hop and backoff.can_requeue(settled):
        delay = backoff.delay_after(settled)
        return Schedule(hop + 1, now + timedelta(seconds=delay), delay, status)
    return Fail(
        FailureReason.EXHAUSTED, f"not confirmed after {settled + 1} answered hops; last: {status}"
    )


def defer_or_expire(
    hop: int,
    step: Defer,
    *,
    in_row: int,
    unavailable_since: datetime | None,
    deadline_at: datetime,
    now: datetime,
    deferral: Deferral,
    jitter: float,
) -> Schedule | Fail:
    """No answer: the same question again later, without using the settle budget.

    Later means after the shared Retry-After and the jittered backoff of the
    `in_row`-th deferral in a row, and no later than the deadline; at the
    deadline the attempt fails (`deadline`), naming since when nothing answered.
    """
    since = unavailable_since or now
    if now >= deadline_at:
        return Fail(
            FailureReason.DEADLINE,
            f"no answer from the gateway since {since.isoformat(timespec='seconds')}; "
            f"last: {step.status}",
        )
    silent_s = (now - since).total_seconds()
    delay = deferral.delay(in_row, step.retry_after_s, jitter, silent_s, paced=step.paced)
    not_before = min(now + timedelta(seconds=delay), deadline_at)
    delay_s = (not_before - now).total_seconds()
    return Schedule(hop + 1, not_before, delay_s, step.status, deferred=True, spends=False)


def ended(step: Fail | Schedule) -> tuple[Outcome, str]:
    """The outcome a hop reports for its last step."""
    if isinstance(step, Fail):
        return Outcome.FAILED, f"{step.reason.value}: {step.message}"
    if step.deferred:
        return Outcome.DEFERRED, step.status
    return Outcome.SCHEDULED, step.status
