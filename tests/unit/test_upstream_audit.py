"""The upstream audit's classification: a table of logs and families, and what each
finding says and does."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from domain.ownership import Creates
from domain.ports import FamilyMember
from domain.upstream_audit import (
    Action,
    AttemptRecord,
    Audit,
    BrandRecord,
    ClaimRecord,
    Kind,
    ParentRecord,
    Upstream,
    classify,
    needs_projects,
)

P, OTHER_PARENT, T = "org-p", "org-q", "Acme"
CREATED_AT = datetime(2026, 12, 1, tzinfo=UTC)  # the lost create's; read 30 s after
ROOT = FamilyMember(P, "Organisation", "active")


def member(ws: str, status: str = "created", title: str = T) -> FamilyMember:
    return FamilyMember(ws, title, status)


def attempt(attempt_id: str = "a1", brand: str = "b1", **kw: object) -> AttemptRecord:
    fields: dict[str, object] = {
        "attempt_id": attempt_id, "brand_id": brand, "parent_id": P, "title": T,
        "pending": False, "creates": Creates(frozenset(), frozenset()), "state": "promoted",
    }  # fmt: skip
    fields.update(kw)
    return AttemptRecord(**fields)  # type: ignore[arg-type]


def lost(attempt_id: str = "a1", brand: str = "b1", baseline: frozenset[str] = frozenset(),
         **kw: object) -> AttemptRecord:  # fmt: skip
    """An ended attempt whose create is unresolved: what it made may appear."""
    fields: dict[str, object] = {"state": "cancelled", **kw}
    creates = Creates(baseline, frozenset(), window_from=CREATED_AT)
    return attempt(attempt_id, brand, creates=creates, orphan_search=True, **fields)


def bound(ws: str, brand: str = "b1", *, active: bool = True) -> BrandRecord:
    return BrandRecord(brand, P, T, active, ws)


def claim(ws: str, brand: str | None = "b1") -> dict[str, ClaimRecord]:
    return {ws: ClaimRecord(ws, brand)}


def run(family: tuple[FamilyMember, ...], record: ParentRecord, **up: object) -> Audit:
    """The audit 30 s after the lost create, in an inference window of an hour; a
    child's projects 0 unless given."""
    up["projects"] = {**{m.id: 0 for m in family}, **up.get("projects", {})}  # type: ignore[dict-item]
    up.setdefault("read_at", CREATED_AT + timedelta(seconds=30))
    up.setdefault("window_s", 3600.0)
    return classify(P, Upstream((ROOT, *family), **up), record, (P, OTHER_PARENT))  # type: ignore[arg-type]


def kinds(result: Audit) -> list[tuple[str, str, str]]:
    return [(f.kind.value, f.workspace_id, f.action.value) for f in result.findings]


CASES = [
    pytest.param(
        (member("w1"),),
        ParentRecord(
            (attempt(created_ids=("w1",), candidate_id="w1"),), (bound("w1"),), claim("w1")
        ),
        {},
        [],
        id="bound-and-ready",
    ),
    pytest.param(
        (member("w1", "failed"),),
        ParentRecord((), (bound("w1"),), claim("w1")),
        {},
        [("bound_terminal", "w1", "none")],
        id="bound-terminal",
    ),
    pytest.param(
        (),
        ParentRecord((), (bound("w1"),), claim("w1")),
        {"statuses": {"w1": None}},
        [("bound_missing", "w1", "provision")],
        id="bound-gone-provisions-again",
    ),
    pytest.param(
        (),
        ParentRecord((), (bound("w1", active=False),)),
        {"statuses": {"w1": None}},
        [("bound_missing", "w1", "none")],
        id="deactivated-bound-gone-left-alone",
    ),
    pytest.param(
        (),
        ParentRecord((), (bound("w1"),)),
        {"statuses": {"w1": "ready"}},
        [],
        id="bound-not-listed-but-answers",
    ),
    pytest.param(
        (member("w1"),),
        ParentRecord((), (bound("w1"), bound("w1", "b2")), claim("w1")),
        {},
        [("claimed_twice", "w1", "none")],
        id="bound-to-two-brands",
    ),
    pytest.param(
        (member("w1"),),
        ParentRecord((), (bound("w1"),), claim("w1", "b9")),
        {},
        [("claimed_twice", "w1", "none")],
        id="bound-claimed-by-another",
    ),
    pytest.param(
        (member("w1"),),
        ParentRecord((attempt(created_ids=("w1",), released_ids=("w1",)),), (), claim("w1", None)),
        {"projects": {"w1": 0}},
        [],
        id="released-and-empty",
    ),
    pytest.param(
        (member("w1"),),
        ParentRecord((attempt(created_ids=("w1",), released_ids=("w1",)),), (), claim("w1", None)),
        {"projects": {"w1": 2}},
        [("released_not_empty", "w1", "none")],
        id="released-not-empty",
    ),
    pytest.param(
        (member("w1"),),
        ParentRecord((attempt(created_ids=("w1",), released_ids=("w1",)),), (), claim("w1", "b2")),
        {"projects": {"w1": 2}},
        [],
        id="released-then-adopted-not-judged",
    ),
    pytest.param(
        (member("w1"),),
        ParentRecord((), (BrandRecord("b1", P, T, False, None, ("w1",)),)),
        {"projects": {"w1": 1}},
        [("released_not_empty", "w1", "none")],
        id="decommissioned-not-empty",
    ),
    pytest.param(
        (),
        ParentRecord((attempt(created_ids=("w1",), owed=("w1",), state="failed"),)),
        {},
        [("release_owed", "w1", "release")],
        id="release-owed",
    ),
    pytest.param(
        (),
        ParentRecord((attempt(created_ids=("w1",), owed=("w1",), pending=True),)),
        {},
        [],
        id="pending-owes-nothing-yet",
    ),
    pytest.param(
        (member("w9"),),
        ParentRecord((lost(),)),
        {},
        [("orphan", "w9", "release")],
        id="orphan-of-an-unresolved-create",
    ),
    pytest.param(
        (member("w9", "creation_failed"),),
        ParentRecord((lost(),)),
        {},
        [("orphan", "w9", "release")],
        id="orphan-shell",
    ),
    pytest.param(
        (member("w9"),),
        ParentRecord((lost(pending=True, state="pending"),)),
        {},
        [("in_flight", "w9", "none")],
        id="pending-create-in-flight",
    ),
    pytest.param(
        (member("w9"),),
        ParentRecord((lost(baseline=frozenset({"w9"})),)),
        {"projects": {"w9": 3}},
        [("foreign", "w9", "none")],
        id="there-before-the-create",
    ),
    pytest.param(
        (member("w9"),),
        ParentRecord((lost(baseline=frozenset({"w9"})),)),
        {},
        [("adoptable", "w9", "none")],
        id="there-before-the-create-ready-and-empty-adoptable",
    ),
    pytest.param(
        (member("w9"),),
        ParentRecord((attempt(),)),
        {"projects": {"w9": 2}},
        [("foreign", "w9", "none")],
        id="create-resolved-someone-elses",
    ),
    pytest.param(
        (member("w9"),),
        ParentRecord((lost("a1", "b1"), lost("a2", "b2"))),
        {},
        [("unclear", "w9", "none")],
        id="credited-to-two-attempts",
    ),
    pytest.param(
        (member("w8"), member("w9")),
        ParentRecord((lost(),)),
        {},
        [("unclear", "w8", "none"), ("unclear", "w9", "none")],
        id="two-live-cannot-be-told-apart",
    ),
    pytest.param(
        (member("w8"), member("w9")),
        ParentRecord((lost(), attempt("a2", "b2", created_ids=("w8",)))),
        {},
        [("orphan", "w9", "release")],
        id="another-attempts-create-is-taken",
    ),
    pytest.param(
        (member("w9", title="Other Co"),),
        ParentRecord((lost(),)),
        {},
        [],
        id="titles-we-never-provisioned-are-not-looked-at",
    ),
    pytest.param(
        (member(P, title=T), member(OTHER_PARENT)),
        ParentRecord((lost(),)),
        {},
        [],
        id="a-parent-in-the-family-is-never-a-child",
    ),
    pytest.param(
        (),
        ParentRecord((attempt(created_ids=(P,)),), (bound(P),), claim(P)),
        {},
        [("parent_on_record", P, "none")],
        id="a-parent-on-record",
    ),
]


@pytest.mark.parametrize(("family", "record", "upstream", "expected"), CASES)
def test_classification(
    family: tuple[FamilyMember, ...],
    record: ParentRecord,
    upstream: dict[str, object],
    expected: list[tuple[str, str, str]],
) -> None:
    result = run(family, record, **upstream)
    assert kinds(result) == expected
    for finding in result.findings:  # a parent is never acted on
        assert finding.action is Action.NONE or finding.workspace_id not in (P, OTHER_PARENT)


def test_clean_counts_and_problems() -> None:
    record = ParentRecord(
        (attempt(created_ids=("w1", "w2"), released_ids=("w2",), candidate_id="w1"),
         lost("a2", "b2", baseline=frozenset({"w1", "w2", "w3"}))),
        (bound("w1"),), {**claim("w1"), **claim("w2", None)},
    )  # fmt: skip
    family = (member("w1"), member("w2"), member("w3"))
    result = run(family, record, projects={"w2": 0, "w3": 4})
    assert dict(result.clean) == {"bound_ready": 1, "bound_settling": 0, "released_empty": 1}
    assert kinds(result) == [("foreign", "w3", "none")]
    assert result.problems == ()  # someone else's: information only
    orphan = run((*family, member("w4")), record, projects={"w2": 0, "w3": 4})
    assert [f.kind for f in orphan.problems] == [Kind.ORPHAN]
    assert orphan.problems[0].attempt_id == "a2"


def test_what_the_audit_reads_the_projects_of() -> None:
    record = ParentRecord((replace(lost(), created_ids=("w1",), released_ids=("w1",)),))
    family = [ROOT, member("w1"), member("w9"), member("w7", title="Other Co")]
    assert needs_projects(P, family, record) == {"w1", "w9"}


def test_a_read_the_gateway_did_not_answer_is_asked_again_then_given_up() -> None:
    from domain.ports import TransientGatewayError
    from domain.waits import AUDIT_READ_TRIES as READ_TRIES
    from infrastructure.usecases.upstream_audit import _asked

    pauses: list[float] = []
    answers: list[object] = [TransientGatewayError("429", retry_after_s=3.0),
                             TransientGatewayError("503"), ["p1"]]  # fmt: skip

    def read() -> object:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert _asked(read, pauses.append) == ["p1"]
    assert pauses == [3.0, 1.0]  # its Retry-After, then the doubling pause

    def down() -> object:
        raise TransientGatewayError("503")

    with pytest.raises(TransientGatewayError):
        _asked(down, pauses.append)
    assert len(pauses) == 2 + READ_TRIES - 1
