"""The reliability run's checks (tests/reliability/checks.py) over hand-made facts:
each promise holds on a good history and is reported, by kind and brand, on a bad one."""

from __future__ import annotations

import dataclasses
from typing import Any

from tests.reliability import checks
from tests.reliability.checks import AttemptFacts, BrandFacts, Facts, Upstream

PARENT = {"p": {"id": "p", "title": "Org", "status": "active", "projects": ["prj-1"]}}


def ws(title: str, status: str = "created", projects: int = 0) -> dict[str, Any]:
    return {"title": title, "parent": "p", "status": status, "projects": ["x"] * projects}


def promoted(attempt_id: str, title: str, workspace: str) -> AttemptFacts:
    return AttemptFacts(
        attempt_id, title, "promoted", candidate_id=workspace, created_ids=(workspace,),
        events=("Started", "CreateRequested", "CandidateAccepted", "Promoted"),
    )  # fmt: skip


def good() -> Facts:
    """Three brands: one bound; one deactivated and decommissioned; one whose create
    timed out, created again after the grace, and released the late orphan."""
    a = promoted("a1", "A", "w-a")
    b = dataclasses.replace(promoted("b1", "B", "w-b"))
    c = AttemptFacts(
        "c1", "C", "promoted", candidate_id="w-c2", created_ids=("w-c2", "w-c1"),
        released_ids=("w-c1",),
        events=("Started", "CreateRequested", "HopScheduled", "CreateRequested",
                "CandidateAccepted", "Promoted", "SurplusCreated", "CandidateReleased"),
    )  # fmt: skip
    brands = {
        "a": BrandFacts("a", "active", "w-a", (a,)),
        "b": BrandFacts("b", "deactivated", None, (b,), unbound_ids=("w-b",)),
        "c": BrandFacts("c", "active", "w-c2", (c,)),
    }
    upstream = Upstream(
        workspaces={
            **PARENT,
            "w-a": ws("A"),
            "w-b": ws("B"),
            "w-c1": ws("C"),
            "w-c2": ws("C"),
            "seed": ws("A", projects=1),
        },
        creates={"A": 1, "B": 1, "C": 2},
        parents_before=PARENT,
        seeded=frozenset({"seed"}),
    )
    return Facts(
        brands=brands,
        claims={"w-a": "a", "w-c2": "c"},
        upstream=upstream,
        poison=[b"{bad", b"[[[["],
        dead_letters=[b"[[[[", b"{bad"],
    )


def kinds(facts: Facts) -> dict[str, int]:
    return checks.by_kind(checks.check(facts))


def test_a_good_history_holds_every_promise() -> None:
    assert checks.check(good()) == []


def test_an_attempt_still_pending_is_reported_with_its_brand() -> None:
    facts = good()
    pending = AttemptFacts("a2", "A", "pending", events=("Started",))
    a = facts.brands["a"]
    facts.brands = {**facts.brands, "a": dataclasses.replace(a, attempts=(*a.attempts, pending))}
    found = checks.attempts_ended(facts.brands.values())
    assert [(v.kind, v.brand_id) for v in found] == [("attempt_not_ended", "a")]


def test_bindings_promoted_unbound_bound_twice_not_ready_and_deactivated_pointer() -> None:
    facts = good()
    brands = dict(facts.brands)
    brands["a"] = dataclasses.replace(brands["a"], workspace_id=None)
    brands["b"] = dataclasses.replace(brands["b"], workspace_id="w-b")
    assert kinds(dataclasses.replace(facts, brands=brands)) == {
        "deactivated_with_pointer": 1,
        "promoted_not_bound": 1,
        "left_unreleased": 1,  # w-a: neither bound any more nor released
    }
    brands = dict(facts.brands)
    brands["x"] = BrandFacts("x", "active", "w-a", ())
    assert kinds(dataclasses.replace(facts, brands=brands))["bound_twice"] == 2
    workspaces = {**facts.upstream.workspaces, "w-a": ws("A", "not ready")}
    upstream = dataclasses.replace(facts.upstream, workspaces=workspaces)
    assert kinds(dataclasses.replace(facts, upstream=upstream)) == {"bound_not_ready": 1}
    claims = {**facts.claims, "w-a": "c"}
    assert kinds(dataclasses.replace(facts, claims=claims)) == {"claim_mismatch": 1}


def test_upstream_a_workspace_left_unreleased_or_never_on_record_is_reported() -> None:
    facts = good()
    c = facts.brands["c"]
    forgot = dataclasses.replace(c.attempts[0], released_ids=())
    brands = {**facts.brands, "c": dataclasses.replace(c, attempts=(forgot,))}
    found = checks.upstream_accounted(brands.values(), facts.upstream)
    assert [(v.kind, v.brand_id) for v in found] == [("left_unreleased", "c")]
    workspaces = {**facts.upstream.workspaces, "w-ghost": ws("A")}
    upstream = dataclasses.replace(facts.upstream, workspaces=workspaces)
    assert kinds(dataclasses.replace(facts, upstream=upstream)) == {"create_not_on_record": 1}
    workspaces = {**facts.upstream.workspaces, "w-shell": ws("C", "creation_failed")}
    upstream = dataclasses.replace(facts.upstream, workspaces=workspaces)
    found = checks.upstream_accounted(facts.brands.values(), upstream)
    assert [(v.kind, v.brand_id) for v in found] == [("terminal_shell_not_on_record", "c")]
    workspaces = {**facts.upstream.workspaces, "w-c1": ws("C", projects=2)}
    upstream = dataclasses.replace(facts.upstream, workspaces=workspaces)
    assert kinds(dataclasses.replace(facts, upstream=upstream)) == {"released_not_empty": 1}


def test_a_terminal_candidate_is_owed_nothing() -> None:
    facts = good()
    dead = AttemptFacts(
        "d1", "D", "failed", "terminal_status", candidate_id="w-d", created_ids=("w-d",),
        events=("Started", "CreateRequested", "CandidateAccepted", "Failed"),
    )  # fmt: skip
    brands = {**facts.brands, "d": BrandFacts("d", "active", None, (dead,))}
    workspaces = {**facts.upstream.workspaces, "w-d": ws("D", "failed")}
    upstream = dataclasses.replace(facts.upstream, workspaces=workspaces, creates={"D": 1})
    assert checks.check(dataclasses.replace(facts, brands=brands, upstream=upstream)) == []


def test_creates_beyond_the_record_or_after_a_resolved_create_are_reported() -> None:
    facts = good()
    upstream = dataclasses.replace(facts.upstream, creates={"A": 2, "B": 1, "C": 2})
    found = checks.creates(facts.brands.values(), upstream)
    assert [(v.kind, v.brand_id) for v in found] == [("create_beyond_record", "a")]
    twice = AttemptFacts(
        "e1", "E", "promoted",
        events=("Started", "CreateRequested", "CandidateAccepted", "CreateRequested"),
    )  # fmt: skip
    assert checks.unjustified_creates(twice) == 1
    dropped = dataclasses.replace(
        twice,
        events=("CreateRequested", "CandidateAccepted", "CandidateDropped", "CreateRequested"),
    )
    assert checks.unjustified_creates(dropped) == 0
    unresolved = dataclasses.replace(twice, events=("CreateRequested", "CreateRequested"))
    assert checks.unjustified_creates(unresolved) == 0


def test_the_parent_touched_or_bound_is_reported() -> None:
    facts = good()
    workspaces = {**facts.upstream.workspaces, "p": {**PARENT["p"], "projects": []}}
    upstream = dataclasses.replace(facts.upstream, workspaces=workspaces)
    assert kinds(dataclasses.replace(facts, upstream=upstream)) == {"parent_touched": 1}
    brands = {**facts.brands, "z": BrandFacts("z", "active", "p", ())}
    assert kinds(dataclasses.replace(facts, brands=brands))["parent_bound"] == 1


def test_the_dead_letter_queue_must_hold_the_poison_and_nothing_else() -> None:
    found = checks.dead_letters([b"a", b"b"], [b"b", b"c", b"c"])
    assert [(v.kind, v.detail) for v in found] == [
        ("poison_not_dead_lettered", "b'a'"),
        ("unexpected_dead_letter", "2 x b'c'"),
    ]
    assert checks.dead_letters([b"a", b"b"], [b"b", b"a", b"a"]) == []
    assert checks.dead_letter_repeats([b"a", b"b"], [b"b", b"a", b"a"]) == 1


def test_secret_hits_name_the_file_line_and_secret_but_never_repeat_it() -> None:
    logs = {"worker-1.1.log": "ok\nurl amqp://u:s3cr3t-pw@h\n", "relay.1.log": "tok-xyz"}
    hits = checks.secret_hits(logs, {"broker password": "s3cr3t-pw", "token": "tok-xyz"})
    assert hits == ["worker-1.1.log:2: broker password", "relay.1.log:1: token"]
    assert not any("s3cr3t" in hit for hit in hits)
