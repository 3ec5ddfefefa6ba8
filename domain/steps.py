"""What a hop can do next: the steps its decisions return, as plain values.

    Stand(why, detail, outcome)   do nothing to the attempt: report why
    Wait(status)                  not yet: the next hop after the backoff, or failed
                                  `exhausted` when the settle budget is spent
    Defer(status, retry_after_s)  no answer (429, 5xx, timeout, refused, circuit open):
                                  the hop again later without spending the settle
                                  budget, or failed at the deadline
    Schedule(hop, not_before, delay_s, status, deferred)   what a Wait or Defer became
    Fail(reason, message)         fail the attempt (then release what it owes)
    Refused(detail, then)         record the create as refused, then `then`
    Accept(workspace_id, provenance)   make it the attempt's candidate, then poll
    Record(workspace_id)          record what the create made, then wait to poll it
                                  at the next hop (decision 049)
    Promote()                     bind the candidate to the brand; promote
    DropExisting(raw, then)       unbind the brand's terminal workspace; then `then`
    DropCandidate(raw, then)      the candidate's creation failed: drop it; then `then`
    Create()                      request a create (reserving the title), call it
    Recover(message, answered)    the create is unconfirmed: record why, then look for
                                  what it made in the family

and what a gateway fault means while a candidate is being acquired
(`acquire_faulted`, `unavailable`). The order in which a hop asks for them is
`domain.hop.decide`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from domain.outcomes import Outcome, StandDown
from domain.policies import FailureReason, Provenance
from domain.ports import FaultKind, GatewayFault


@dataclass(frozen=True, slots=True)
class Stand:
    why: StandDown
    detail: str
    outcome: Outcome = Outcome.STOOD_DOWN


@dataclass(frozen=True, slots=True)
class Wait:
    status: str
    # False: no "not yet" was answered (an unconfirmed create's grace, bounded by it;
    # the first wait after a create, before its workspace is asked): the wait does
    # not spend the settle budget.
    spends: bool = True


@dataclass(frozen=True, slots=True)
class Defer:
    status: str
    retry_after_s: float = 0.0
    paced: bool = False  # held for the fleet's own turn: due in `retry_after_s`
    # The gateway answered in this round (the family): only this call went unanswered,
    # so the deferrals' backoff starts again.
    gateway_up: bool = False


@dataclass(frozen=True, slots=True)
class Schedule:
    hop: int
    not_before: datetime
    delay_s: float
    status: str
    deferred: bool = False
    spends: bool = True  # spends a hop of the settle budget (never when deferred)
    paced: bool = False  # deferred for the fleet's own turn, not the gateway's silence


@dataclass(frozen=True, slots=True)
class Fail:
    reason: FailureReason
    message: str


@dataclass(frozen=True, slots=True)
class Refused:
    detail: str
    then: Fail | Defer


@dataclass(frozen=True, slots=True)
class CreateAgain:
    """A create answered 429 whose Retry-After its thread waited out: the refusal on
    record, then create again at once (`otherwise`: what to do if it cannot be now)."""

    detail: str
    otherwise: Refused


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
    | CreateAgain
    | Accept
    | Record
    | Promote
    | DropExisting
    | DropCandidate
    | Create
    | Recover
)


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
