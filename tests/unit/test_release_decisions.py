"""The releases' and the decommission's decisions (domain/releases.py), as tables:
plain values in, a typed plan or outcome out, no store and no gateway."""

from __future__ import annotations

from dataclasses import replace
from uuid import UUID, uuid4

import pytest

from domain import ownership
from domain import releases as rules
from domain.errors import NotOurs
from domain.releases import (
    BoundFacts,
    BrandFacts,
    Decommissioned,
    DecommissionKind,
    Emptied,
    EmptyBound,
    EmptyOwed,
    HandOver,
    KeepBound,
    LeaveForAPerson,
    NotOursToEmpty,
    NotOwed,
    RejectedForGood,
    Released,
    ReleaseFacts,
    ReleaseKind,
    UnbindUnemptied,
)

US, OTHER = uuid4(), uuid4()
LEFT, REFUSED = ReleaseKind.LEFT_FOR_A_PERSON, ReleaseKind.REFUSED_FOR_GOOD
OWED = ReleaseFacts("ws-1", US, "parent", owed=True, parent_allowed=True)


# One release.


def test_a_workspace_not_owed_is_refused_before_anything_is_read() -> None:
    plan = rules.plan_release(replace(OWED, owed=False))
    assert isinstance(plan, NotOwed)
    assert "owes no release of ws-1" in plan.why


def test_a_workspace_under_a_parent_no_longer_ours_is_left_for_a_person() -> None:
    plan = rules.plan_release(replace(OWED, parent_allowed=False))
    assert isinstance(plan, LeaveForAPerson)
    assert "PROVISIONER_PARENT_IDS" in plan.why


@pytest.mark.parametrize(
    ("holder", "releasing_by", "expected"),
    [
        (None, None, EmptyOwed(ownership.Facts("ws-1", ("parent",), proven=True), mark=True)),
        (US, None, EmptyOwed(ownership.Facts("ws-1", ("parent",), proven=True), mark=True)),
        (None, US, EmptyOwed(ownership.Facts("ws-1", ("parent",), proven=True), mark=False)),
        (OTHER, US, EmptyOwed(ownership.Facts("ws-1", ("parent",), proven=True), mark=False)),
        (OTHER, None, HandOver(OTHER)),
        (OTHER, OTHER, HandOver(OTHER)),
    ],
    ids=[
        "unclaimed: marked, then emptied",
        "our claim: marked, then emptied",
        "already marked by us: emptied without a second mark",
        "marked by us before another claimed it: still ours to finish",
        "another attempt's claim: handed over",
        "another attempt releasing it: handed over",
    ],
)
def test_who_holds_the_claim_decides_between_emptying_and_handing_over(
    holder: UUID | None, releasing_by: UUID | None, expected: rules.ReleasePlan
) -> None:
    facts = replace(OWED, claim_holder=holder, releasing_by=releasing_by)
    assert rules.plan_release(facts) == expected


def test_a_lost_creates_workspace_is_emptied_only_as_credited_not_as_proven() -> None:
    plan = rules.plan_release(replace(OWED, inferred=True))
    assert plan == EmptyOwed(ownership.Facts("ws-1", ("parent",), credited=True), mark=True)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (Emptied(3), Released(ReleaseKind.EMPTIED, "ws-1", 3)),
        (Emptied(0), Released(ReleaseKind.EMPTIED, "ws-1", 0)),
        (NotOursToEmpty("unclear"), Released(ReleaseKind.LEFT_FOR_A_PERSON, "ws-1", why="unclear")),
        (
            RejectedForGood("HTTP 409"),
            Released(ReleaseKind.REFUSED_FOR_GOOD, "ws-1", why="HTTP 409"),
        ),
    ],
    ids=["emptied", "already gone", "ownership refused", "the gateway refused for good"],
)
def test_what_the_emptying_answered_is_what_the_release_did(
    answer: rules.Emptying, expected: Released
) -> None:
    outcome = rules.release_answered("ws-1", answer)
    assert outcome == expected
    assert outcome.emptied is (expected.kind is ReleaseKind.EMPTIED)


# What an ended attempt owes besides its releases.


@pytest.mark.parametrize(
    ("exhausted", "before", "now", "refused", "expected"),
    [
        (False, ("a", "b"), (), (), ()),
        (True, ("a", "b"), (), (), ("a", "b")),
        (True, ("a", "b"), ("a",), (), ("b",)),
        (True, ("a", "b"), (), ("b",), ("a",)),
    ],
    ids=[
        "not exhausted: none",
        "exhausted: every shell",
        "not one released now",
        "not one refused",
    ],
)
def test_only_an_exhausted_attempts_earlier_shells_are_looked_at_again(
    exhausted: bool,
    before: tuple[str, ...],
    now: tuple[str, ...],
    refused: tuple[str, ...],
    expected: tuple[str, ...],
) -> None:
    assert rules.shells_to_recheck(exhausted, before, now, refused) == expected


@pytest.mark.parametrize(
    ("inferred", "claimed", "held", "expected"),
    [
        (False, True, False, True),
        (True, True, False, False),
        (False, False, False, False),
        (False, True, True, False),
    ],
    ids=["ours, unheld", "by inference only", "no claim on record", "claimed since"],
)
def test_a_shell_is_looked_at_again_only_if_ours_by_proof_and_held_by_none(
    inferred: bool, claimed: bool, held: bool, expected: bool
) -> None:
    assert rules.may_recheck_shell(inferred, claimed, held) is expected


def test_a_shell_is_emptied_again_only_when_projects_appeared() -> None:
    assert (rules.shell_to_empty_again(0), rules.shell_to_empty_again(2)) == (False, True)


def test_only_an_adopted_candidates_claim_goes_back() -> None:
    assert rules.adopted_claim(True, "ws-1") == "ws-1"
    assert rules.adopted_claim(False, "ws-1") is None
    assert rules.adopted_claim(True, None) is None


@pytest.mark.parametrize(
    ("holder", "unresolved", "expected"),
    [(US, False, True), (US, True, False), (OTHER, False, False), (None, False, False)],
    ids=["ours", "ours, a create unresolved", "another's", "free already"],
)
def test_an_ended_attempt_frees_only_its_own_slot_and_not_while_a_create_is_unresolved(
    holder: UUID | None, unresolved: bool, expected: bool
) -> None:
    assert rules.frees_slot(holder, US, unresolved) is expected


# The decommission.

DUE = BrandFacts("b1", "ws-1", due=True, active=False, emptying_refused=None)


@pytest.mark.parametrize(
    ("facts", "kind", "why"),
    [
        (replace(DUE, workspace_id=None, due=False), DecommissionKind.NOTHING_BOUND, ""),
        (replace(DUE, due=False, active=True), DecommissionKind.NOT_DUE, "active again"),
        (replace(DUE, due=False, emptying_refused="HTTP 409"), DecommissionKind.NOT_DUE, "409"),
        (replace(DUE, due=False), DecommissionKind.NOT_DUE, "retention window"),
    ],
    ids=["nothing bound", "active again", "refused earlier", "window not over"],
)
def test_a_decommission_not_due_says_why_and_does_nothing(
    facts: BrandFacts, kind: DecommissionKind, why: str
) -> None:
    outcome = rules.decommission_gate(facts)
    assert outcome is not None
    assert outcome.kind is kind
    assert why in outcome.why


def test_a_due_decommission_goes_on() -> None:
    assert rules.decommission_gate(DUE) is None


BOUND = BoundFacts(
    "b1", "ws-1", "parent", ("parent", "p2"), decommissioning=None, parent_allowed=True,
    is_parent=False, claimed=True, claim_brand="b1",
)  # fmt: skip
PROVEN = ownership.Facts("ws-1", ("parent", "parent", "p2"), proven=True)


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        (BOUND, EmptyBound(PROVEN, mark=True)),
        (replace(BOUND, decommissioning="ws-1"), EmptyBound(PROVEN, mark=False)),
        (
            replace(BOUND, parent_allowed=False),
            KeepBound("parent parent " + rules.NOT_OUR_PARENT, mark=True),
        ),
        (
            replace(BOUND, is_parent=True),
            UnbindUnemptied("a parent the service acts under", mark=True),
        ),
        (replace(BOUND, claimed=False, claim_brand=None), UnbindUnemptied("no claim", mark=True)),
        (replace(BOUND, claim_brand="b2"), UnbindUnemptied("claim held by b2", mark=True)),
        (replace(BOUND, claim_brand=None), UnbindUnemptied("claim held by None", mark=True)),
    ],
    ids=[
        "ours by proof: marked, then emptied",
        "already marked: emptied",
        "a parent not ours: kept and bound",
        "bound to a parent: unbound, kept",
        "no claim: unbound, kept",
        "another brand's claim: unbound, kept",
        "a claim no brand holds: unbound, kept",
    ],
)
def test_only_a_workspace_bound_with_the_brands_claim_is_emptied(
    facts: BoundFacts, expected: rules.DecommissionPlan
) -> None:
    assert rules.plan_decommission(facts) == expected


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (Emptied(4), Decommissioned(DecommissionKind.EMPTIED, "b1", "ws-1", 4)),
        (
            RejectedForGood("HTTP 409"),
            Decommissioned(DecommissionKind.REFUSED, "b1", "ws-1", why="HTTP 409"),
        ),
    ],
    ids=["emptied", "refused for good"],
)
def test_what_the_emptying_answered_is_what_the_decommission_did(
    answer: rules.Emptying, expected: Decommissioned
) -> None:
    assert rules.decommission_answered("b1", "ws-1", answer) == expected


def test_ownership_refusing_a_bound_workspace_is_a_refused_command_not_a_record() -> None:
    with pytest.raises(NotOurs, match="unclear"):
        rules.decommission_answered("b1", "ws-1", NotOursToEmpty("unclear"))
