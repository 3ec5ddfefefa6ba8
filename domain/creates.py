"""Our creates: what one answered, and what they made, as pure functions of plain values.

A create whose answer was lost (a timeout, a killed worker) may still have made
a workspace; so may a create given up unconfirmed, long after. What they made is
looked for in the parent's family: same-title children that were not there
before the first create still counted (its baseline), that are not on record
already, and that nothing else has taken (another brand's claim, another
attempt's create on record: read by the use case, passed in as `taken`).

    made_by_our_creates(...)   which of those our creates are credited with
    recover(made, ...)         what the hop of an unconfirmed create does about it
    grace_start(...)           when the grace of an unconfirmed create began

and, around a create call: whether another may be made (`may_create`), what its
answer means (`create_answered`), and where what it made goes.

The hop (`infrastructure.usecases.hop`) and the orphan search of an ended
attempt (`infrastructure.usecases.releases`) both ask `made_by_our_creates`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime

from domain.hop import (
    Accept,
    Fail,
    Record,
    Recover,
    Refused,
    Step,
    Wait,
    acquire_faulted,
    unavailable,
)
from domain.policies import AttemptState, FailureReason, Provenance, classify_status, same_title
from domain.ports import FamilyMember, FaultKind, GatewayFault


@dataclass(frozen=True, slots=True)
class Creates:
    """An attempt's creates, as the rule needs them (`ProvisioningAttempt.creates`)."""

    baseline: frozenset[str]  # same-title children before the first create still counted
    on_record: frozenset[str]  # what they made that is on record (and the candidate)
    given_up: int = 0  # creates given up unconfirmed: what they made may appear any time


@dataclass(frozen=True, slots=True)
class Made:
    """What the family shows our creates made."""

    live: tuple[str, ...] = ()  # the live workspace credited (at most one): the candidate
    shells: tuple[str, ...] = ()  # terminal ones credited: recorded, owed, never bound
    unclear: int = 0  # new workspaces that cannot be told apart (ambiguous), else 0
    # False when only shells are credited after a create was given up: the shells
    # may be the given-up one's while the latest create's workspace is on its way.
    settled: bool = True

    @property
    def ours(self) -> tuple[str, ...]:
        """Every workspace credited: the live one first."""
        return self.live + self.shells


def unaccounted(
    family: Iterable[FamilyMember], title: str, parent_id: str, creates: Creates
) -> list[FamilyMember]:
    """Same-title children new since the baseline and not on record: what our creates
    may have made, unless taken elsewhere (whose claims the use case reads)."""
    gone = creates.baseline | creates.on_record
    return [m for m in same_title(family, title, parent_id) if m.id not in gone]


def made_by_our_creates(
    family: Iterable[FamilyMember],
    title: str,
    parent_id: str,
    creates: Creates,
    taken: Collection[str] = (),
) -> Made:
    """Which workspaces of the family our unresolved creates made, as far as it can tell.

    One create makes at most one workspace. With none given up, that is the one
    live workspace found, else the one shell, else nothing we can tell apart.
    With a create given up, it is the one live workspace if there is exactly one,
    and every shell besides (a shell is never usable: recording it costs nothing).
    """
    found = [m for m in unaccounted(family, title, parent_id, creates) if m.id not in taken]
    live = tuple(m.id for m in found if not classify_status(m.status).is_terminal)
    shells = tuple(m.id for m in found if classify_status(m.status).is_terminal)
    if len(live) > 1:  # several live: none can be told apart
        return Made(shells=shells if creates.given_up else (), unclear=len(live))
    if creates.given_up:
        return Made(live, shells, settled=bool(live))
    if live or len(shells) == 1:
        return Made(live, () if live else shells)
    return Made(unclear=len(shells))  # several shells, which one create cannot all have made


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
        if answer == parent_id or answer in parents:
            whose = "the parent's" if answer == parent_id else "another parent's"
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
