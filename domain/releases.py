"""What a release and a decommission decide, as pure functions of plain values.

The use cases (`infrastructure/usecases/releases.py`) load, observe through the
gateway port, ask these functions and save; they choose nothing themselves.

A release empties one workspace an ended (or pending) attempt owes:

    plan_release(ReleaseFacts)        -> NotOwed | LeaveForAPerson | HandOver | EmptyOwed
    release_answered(ws, Emptying)    -> Released   (emptied, left for a person, refused for good)

A decommission empties a deactivated brand's bound workspace:

    decommission_gate(BrandFacts)     -> Decommissioned (nothing to do now) | None (go on)
    plan_decommission(BoundFacts)     -> KeepBound | UnbindUnemptied | EmptyBound
    decommission_answered(...)        -> Decommissioned (emptied, or refused for good)

Every plan says whether the claim or the brand is to be marked first (`mark`): that
mark is saved, version-checked, before any delete (decision 004). Every answer is
a typed outcome; nobody decides on its `why`, which is for people.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID

from domain import ownership
from domain.errors import NotOurs

NOT_OUR_PARENT = "is not one the service acts under (PROVISIONER_PARENT_IDS)"


# What the gateway answered an emptying: the projects deleted, or why none were.


@dataclass(frozen=True, slots=True)
class Emptied:
    """Every project listed was deleted (0 when the workspace was already gone)."""

    projects_deleted: int


@dataclass(frozen=True, slots=True)
class NotOursToEmpty:
    """Ownership refused on the projects listed now; nothing was deleted."""

    why: str


@dataclass(frozen=True, slots=True)
class RejectedForGood:
    """The gateway refused the emptying for good (decision 028)."""

    why: str


Emptying = Emptied | NotOursToEmpty | RejectedForGood


# One release.


class ReleaseKind(StrEnum):
    EMPTIED = "emptied"  # its projects deleted, the release recorded, the claim back
    HANDED_OVER = "handed_over"  # a later attempt holds its claim: nothing deleted
    LEFT_FOR_A_PERSON = "left_for_a_person"  # ownership refused: recorded, never asked again
    REFUSED_FOR_GOOD = "refused_for_good"  # the gateway refused: recorded, not retried


@dataclass(frozen=True, slots=True)
class Released:
    """What one release did to one workspace."""

    kind: ReleaseKind
    workspace_id: str
    projects_deleted: int = 0
    why: str = ""

    @property
    def emptied(self) -> bool:
        return self.kind is ReleaseKind.EMPTIED


@dataclass(frozen=True, slots=True)
class ReleaseFacts:
    """One workspace an attempt may owe a release of, and its claim, as plain values."""

    workspace_id: str
    attempt_id: UUID
    parent_id: str
    owed: bool  # on the attempt's record as owed: only what our creates made
    parent_allowed: bool  # the attempt's parent is one the service acts under
    inferred: bool = False  # credited to a lost create by inference, not proof
    claim_holder: UUID | None = None  # the attempt holding its claim, if any
    releasing_by: UUID | None = None  # the attempt that marked it `Releasing`, if any


@dataclass(frozen=True, slots=True)
class NotOwed:
    """Asked to release what the attempt does not owe: a refused command."""

    why: str


@dataclass(frozen=True, slots=True)
class LeaveForAPerson:
    """Not emptied, on record as refused; a person decides (provisioner audit)."""

    why: str


@dataclass(frozen=True, slots=True)
class HandOver:
    """A later attempt holds the claim: the workspace is its now, nothing deleted."""

    to_attempt: UUID


@dataclass(frozen=True, slots=True)
class EmptyOwed:
    """Mark the claim `Releasing` first (when `mark`), then empty it as ownership allows."""

    facts: ownership.Facts
    mark: bool


ReleasePlan = NotOwed | LeaveForAPerson | HandOver | EmptyOwed


def plan_release(f: ReleaseFacts) -> ReleasePlan:
    """What to do about one workspace the attempt says it owes."""
    if not f.owed:
        return NotOwed(f"attempt {f.attempt_id} owes no release of {f.workspace_id}")
    if not f.parent_allowed:
        return LeaveForAPerson(f"parent {f.parent_id} {NOT_OUR_PARENT}: not emptied")
    if f.claim_holder not in (None, f.attempt_id) and f.releasing_by != f.attempt_id:
        assert f.claim_holder is not None
        return HandOver(f.claim_holder)
    if f.inferred:  # a lost create's, by inference: emptied only while it holds nothing
        facts = ownership.Facts(f.workspace_id, (f.parent_id,), credited=True)
    else:
        facts = ownership.Facts(f.workspace_id, (f.parent_id,), proven=True)
    return EmptyOwed(facts, mark=f.releasing_by != f.attempt_id)


def release_answered(workspace_id: str, answer: Emptying) -> Released:
    """What the emptying of an owed workspace comes to."""
    match answer:
        case Emptied(deleted):
            return Released(ReleaseKind.EMPTIED, workspace_id, deleted)
        case NotOursToEmpty(why):
            return Released(ReleaseKind.LEFT_FOR_A_PERSON, workspace_id, why=why)
        case RejectedForGood(why):
            return Released(ReleaseKind.REFUSED_FOR_GOOD, workspace_id, why=why)


# What an ended attempt owes besides its releases.


def shells_to_recheck(
    exhausted: bool,
    released_before: Collection[str],
    released_now: Collection[str],
    refused: Collection[str],
) -> tuple[str, ...]:
    """An exhausted attempt's shells, emptied while still `not ready`, may get projects
    once they settle: each released earlier (not now, not refused) is looked at again."""
    if not exhausted:
        return ()
    return tuple(ws for ws in released_before if ws not in released_now and ws not in refused)


def may_recheck_shell(inferred: bool, claimed: bool, held: bool) -> bool:
    """A shell is looked at again only if it is ours by proof (never emptied of
    projects on inference) and its claim is on record, held by no brand since."""
    return not inferred and claimed and not held


def shell_to_empty_again(projects: int) -> bool:
    """... and emptied again only if projects appeared in it."""
    return projects > 0


def adopted_claim(adopted: bool, candidate_id: str | None) -> str | None:
    """The workspace whose claim goes back when the attempt ends unpromoted: an
    adopted candidate's (given back only while this attempt holds it)."""
    return candidate_id if adopted else None


def frees_slot(slot_holder: UUID | None, attempt_id: UUID, create_unresolved: bool) -> bool:
    """An ended attempt frees its title slot, unless a create of its is unresolved."""
    return slot_holder == attempt_id and not create_unresolved


# The decommission of a deactivated brand.


class DecommissionKind(StrEnum):
    EMPTIED = "emptied"  # its projects deleted, then unbound and unclaimed
    NOTHING_BOUND = "nothing_bound"  # no workspace bound: nothing to empty
    NOT_DUE = "not_due"  # active again, its window not over, or refused earlier
    REFUSED = "refused"  # kept and bound, on record: not retried until deactivated again
    UNBOUND_NOT_EMPTIED = "unbound_not_emptied"  # not provably ours: unbound, kept


@dataclass(frozen=True, slots=True)
class Decommissioned:
    """What one decommission did. `projects_deleted` counts only when `EMPTIED`."""

    kind: DecommissionKind
    brand_id: str
    workspace_id: str | None = None
    projects_deleted: int = 0
    why: str = ""


@dataclass(frozen=True, slots=True)
class BrandFacts:
    """A deactivated (or reactivated) brand, as plain values."""

    brand_id: str
    workspace_id: str | None
    due: bool  # `Brand.decommission_due`: deactivated, bound, its window over or begun
    active: bool
    emptying_refused: str | None  # a refusal on record, until deactivated again


def decommission_gate(f: BrandFacts) -> Decommissioned | None:
    """Is there a workspace to empty now? None: go on."""
    if f.workspace_id is None:
        return Decommissioned(DecommissionKind.NOTHING_BOUND, f.brand_id)
    if f.due:
        return None
    if f.active:
        why = "the brand is active again"
    elif f.emptying_refused is not None:
        why = f"its emptying was refused: {f.emptying_refused}"
    else:
        why = "its retention window is not over"
    return Decommissioned(DecommissionKind.NOT_DUE, f.brand_id, f.workspace_id, why=why)


@dataclass(frozen=True, slots=True)
class BoundFacts:
    """The bound workspace of a brand whose decommission is due, and its claim."""

    brand_id: str
    workspace_id: str
    parent_id: str
    parents: tuple[str, ...]  # every parent the service acts under
    decommissioning: str | None  # the workspace already marked as being emptied
    parent_allowed: bool
    is_parent: bool  # the bound workspace is itself a parent
    claimed: bool  # a claim is on record
    claim_brand: str | None = None  # the brand holding it


@dataclass(frozen=True, slots=True)
class KeepBound:
    """The parent is not ours: the refusal is recorded, the workspace kept and bound."""

    why: str
    mark: bool


@dataclass(frozen=True, slots=True)
class UnbindUnemptied:
    """Bound without this brand's claim: not provably ours to empty. Unbound, kept."""

    why: str
    mark: bool


@dataclass(frozen=True, slots=True)
class EmptyBound:
    """Ours by proof (bound, with this brand's claim): empty it, then unbind and unclaim."""

    facts: ownership.Facts
    mark: bool


DecommissionPlan = KeepBound | UnbindUnemptied | EmptyBound


def plan_decommission(f: BoundFacts) -> DecommissionPlan:
    """What to do about the bound workspace; first, the brand is marked as being
    emptied (`mark`), so a reactivation now waits for the decommission."""
    mark = f.decommissioning != f.workspace_id
    if not f.parent_allowed:
        return KeepBound(f"parent {f.parent_id} {NOT_OUR_PARENT}", mark)
    if f.is_parent:
        return UnbindUnemptied("a parent the service acts under", mark)
    if not f.claimed:
        return UnbindUnemptied("no claim", mark)
    if f.claim_brand != f.brand_id:
        return UnbindUnemptied(f"claim held by {f.claim_brand}", mark)
    facts = ownership.Facts(f.workspace_id, (f.parent_id, *f.parents), proven=True)
    return EmptyBound(facts, mark)


def decommission_answered(brand_id: str, workspace_id: str, answer: Emptying) -> Decommissioned:
    """What the emptying of the bound workspace comes to. Ownership never refuses a
    workspace bound with this brand's claim: if it does, that is refused as a command
    (`NotOurs`), nothing recorded."""
    match answer:
        case NotOursToEmpty(why):
            raise NotOurs(why)
        case Emptied(deleted):
            return Decommissioned(DecommissionKind.EMPTIED, brand_id, workspace_id, deleted)
        case RejectedForGood(why):
            return Decommissioned(DecommissionKind.REFUSED, brand_id, workspace_id, why=why)


def decommission_refused(brand_id: str, workspace_id: str, plan: KeepBound) -> Decommissioned:
    return Decommissioned(DecommissionKind.REFUSED, brand_id, workspace_id, why=plan.why)


def decommission_unbound(brand_id: str, workspace_id: str, plan: UnbindUnemptied) -> Decommissioned:
    return Decommissioned(
        DecommissionKind.UNBOUND_NOT_EMPTIED, brand_id, workspace_id, why=plan.why
    )
