"""Our creates: what one answered, and what the hop does about one whose answer
was lost, as pure functions of plain values.

A create whose answer was lost (a timeout, a killed worker) may still have made
a workspace. Which children of the family it is credited with is ownership's
rule (`domain.ownership.credit`: new beside it, within its window, nobody
else's, empty); here:

    recover(made, ...)         what the hop of an unconfirmed create does about it
    grace_start(...)           when the grace of an unconfirmed create began

and, around a create call: whether another may be made (`may_create`), what its
answer means (`create_answered`), and where what it made goes.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from datetime import datetime

from domain.ownership import Made, is_parent
from domain.policies import AttemptState, FailureReason, Provenance
from domain.ports import FaultKind, GatewayFault
from domain.steps import (
    Accept,
    CreateAgain,
    Fail,
    Record,
    Recover,
    Refused,
    Step,
    Wait,
    acquire_faulted,
    unavailable,
)


def recover(
    made: Made,
    title: str,
    *,
    requested_hop: int | None,
    hop: int,
    waited_s: float,
    grace_s: float,
) -> Accept | Fail | Wait | None:
    """An unconfirmed create: accept what our creates are credited with, first the
    live one (a shell's status then decides: `creation failed` drops it and creates
    again, `failed` fails), so what a create made is on record either way.

    New workspaces that cannot be told apart: ambiguous. Nothing yet, or only
    shells after a create was given up: wait while the create may still appear
    (the hop that requested it, or within the grace); after that it did not
    happen (None: adopt or create afresh).
    """
    if made.unclear:
        return Fail(
            FailureReason.AMBIGUOUS,
            f"{made.unclear} new workspaces titled {title!r} after an unconfirmed create",
        )
    may_still_appear = requested_hop == hop or waited_s <= grace_s
    if made.ours and (made.settled or not may_still_appear):
        return Accept(made.ours[0], Provenance.CREATED)
    if may_still_appear:
        return Wait("create unconfirmed; not in the family yet", spends=False)
    return None


def grace_start(
    requested_at: datetime, deferred_until: datetime | None, answered: bool
) -> datetime:
    """When the grace of an unconfirmed create began: at the create, if the gateway
    answered it (a 5xx): its handling is over, so whatever it made shows in the
    family within the grace, however long the gateway was away since. A create it
    did not answer (a timeout, a dropped connection, a proxy's 502 or 504) it may
    still hold and carry out when it is back: the grace begins again when the last
    deferral after the create ends."""
    if answered or deferred_until is None:
        return requested_at
    return max(requested_at, deferred_until)


# Creates an attempt makes while none is confirmed: a create that times out is
# tried again after its grace (its wait spends no settle budget), at most this often.
MAX_CREATES = 3


def may_create(given_up: int, title: str) -> Fail | None:
    """Before a create: have too many of this attempt's creates gone unconfirmed?"""
    if given_up + 1 >= MAX_CREATES:
        return Fail(
            FailureReason.EXHAUSTED,
            f"{given_up + 1} creates titled {title!r} were never confirmed",
        )
    return None


def create_answered(
    answer: str | GatewayFault, parent_id: str, parents: Collection[str] = ()
) -> Step:
    """What a create call answered: an id to record, or a failure. An id that is the
    attempt's parent, or any parent the service acts under (`parents`), is a gateway
    bug: a parent is never ours."""
    if isinstance(answer, str):
        if not answer:
            return Fail(FailureReason.GATEWAY_BUG, "create answered no id")
        if is_parent(answer, (parent_id, *parents)):
            whose = "the parent's" if is_parent(answer, (parent_id,)) else "another parent's"
            return Fail(FailureReason.GATEWAY_BUG, f"create answered {whose} id")
        return Record(answer)
    kind, message = answer.kind, answer.message
    if kind is FaultKind.AMBIGUOUS:
        return Recover(message, answer.answered)
    if kind is FaultKind.REJECTED:  # refused outright: nothing was made
        return Refused(message, Fail(FailureReason.REJECTED, f"create rejected: {message}"))
    if kind is FaultKind.UNAUTHORIZED:
        return Refused(message, Fail(FailureReason.UNAUTHORIZED, f"gateway refused: {message}"))
    if kind is FaultKind.TRANSIENT:  # throttled (429) or never sent: nothing was made
        if answer.waited:  # a 429 its thread waited out under the fleet's pace: go again
            waited_out = replace(answer, retry_after_s=0.0)  # its Retry-After is over
            return CreateAgain(message, Refused(message, unavailable(waited_out)))
        return Refused(message, unavailable(answer))
    if kind is FaultKind.MALFORMED:
        return Fail(FailureReason.GATEWAY_BUG, f"create answer: {message}")
    return acquire_faulted(answer)  # GONE: the parent


def created_takes_candidate(candidate_id: str | None, state: AttemptState) -> bool:
    """What this run created becomes the candidate; else it is a surplus, owed a release."""
    return candidate_id is None and state is not AttemptState.PROMOTED


def created_is_claimed(claimed_because: str) -> Fail:
    """The create answered an id another brand holds: a gateway bug; never bind it,
    and it is not ours to release."""
    return Fail(FailureReason.GATEWAY_BUG, f"create answered {claimed_because}")


def created_again(workspace_id: str) -> Fail:
    """The create answered an id that existed before it (listed in the family read
    just before, or made by an earlier create of this attempt): a gateway bug. Never
    recorded as ours (it would be owed a release: emptied); what the create made, if
    anything, is looked for as an unconfirmed create's."""
    return Fail(FailureReason.GATEWAY_BUG, f"create answered {workspace_id}, which existed before")
