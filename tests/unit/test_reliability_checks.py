"""The reliability run's checks (tests/reliability/checks.py) over hand-made facts:
each promise holds on a good history and is reported, by kind and brand, on a bad one."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from tests.reliability import checks, plan
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


def failed(
    attempt_id: str, title: str, reason: str, workspace: str | None = None, **kw: Any
) -> AttemptFacts:
    made = (workspace,) if workspace else ()
    return AttemptFacts(
        attempt_id, title, "failed", reason, candidate_id=workspace, created_ids=made,
        events=("Started", "CreateRequested", "CandidateAccepted", "Failed"),
        failure_message=f"{reason}: ...", **kw,
    )  # fmt: skip


def with_brand(facts: Facts, brand: BrandFacts, **workspaces: dict[str, Any]) -> Facts:
    upstream = dataclasses.replace(
        facts.upstream,
        workspaces={**facts.upstream.workspaces, **workspaces},
        creates={**facts.upstream.creates, **{w["title"]: 1 for w in workspaces.values()}},
    )
    return dataclasses.replace(
        facts, brands={**facts.brands, brand.brand_id: brand}, upstream=upstream
    )


def test_failures_the_faults_explain_hold_every_promise() -> None:
    """A zombie's attempt exhausted, a title scripted `creation failed` created again
    until exhausted, one scripted `error`, and one ambiguous between two seeded
    lookalikes: every promise holds, and the brands end failed, not ready."""
    facts = good()
    zombie = failed("z1", "Z", "exhausted", "w-z", released_ids=("w-z",), deferrals=40)
    facts = with_brand(
        facts, BrandFacts("z", "active", None, (zombie,)), **{"w-z": ws("Z", "not ready")}
    )
    again = dataclasses.replace(
        failed("f1", "F", "exhausted"), created_ids=("w-f1",), released_ids=("w-f1",)
    )
    shell = ws("F", "creation_failed")
    facts = with_brand(facts, BrandFacts("f", "active", None, (again,)), **{"w-f1": shell})
    dead = failed("t1", "T", "terminal_status", "w-t")
    facts = with_brand(facts, BrandFacts("t", "active", None, (dead,)), **{"w-t": ws("T", "error")})
    twins = failed("m1", "M", "ambiguous")
    lookalikes = {"w-m1": ws("M", "created", 1), "w-m2": ws("M")}
    facts = with_brand(facts, BrandFacts("m", "active", None, (twins,)), **lookalikes)
    seeded = facts.upstream.seeded | set(lookalikes)
    facts = dataclasses.replace(facts, upstream=dataclasses.replace(facts.upstream, seeded=seeded))
    assert checks.failures_explained(facts.brands.values(), facts.upstream) == []
    assert checks.brands_ready(facts.brands.values(), facts.upstream) == []
    assert checks.check(facts) == []


def test_exhausted_or_deadline_with_nothing_stuck_upstream_is_unexplained() -> None:
    facts = good()
    # Its workspace settled (ready upstream): only the gateway's silence, an outage,
    # can have spent its settle hops.
    outage = failed("o1", "O", "exhausted", "w-o", deferrals=3)
    facts = with_brand(facts, BrandFacts("o", "active", None, (outage,)), **{"w-o": ws("O")})
    facts = dataclasses.replace(
        facts,
        brands={**facts.brands, "o": dataclasses.replace(facts.brands["o"], unbound_ids=("w-o",))},
    )
    found = checks.failures_explained(facts.brands.values(), facts.upstream)
    assert [(v.kind, v.brand_id) for v in found] == [("failure_unexplained", "o")]
    assert "failed exhausted" in found[0].detail
    assert "3 hops deferred" in found[0].detail
    assert checks.brands_ready(facts.brands.values(), facts.upstream)[0].kind == "brand_not_ready"
    # Waiting on another create of its title, with nothing made: unexplained too.
    waited = dataclasses.replace(failed("w1", "W", "exhausted"), events=("Started", "Failed"))
    assert not checks.failure_explained(waited, facts.upstream)
    for reason in ("deadline", "internal_error", "unauthorized", "rejected", "gateway_bug"):
        attempt = failed("x1", "A", reason, "w-a")
        assert not checks.failure_explained(attempt, facts.upstream), reason
    # terminal_status needs its candidate terminal upstream; ambiguous two lookalikes.
    assert not checks.failure_explained(failed("x2", "A", "terminal_status", "w-a"), facts.upstream)
    assert not checks.failure_explained(failed("x3", "B", "ambiguous"), facts.upstream)


def test_exhausted_after_lost_creates_is_explained_only_by_as_many_losses() -> None:
    """Three creates never confirmed exhaust the attempt by design (at most three
    unconfirmed creates): explained when the fake dropped, or a worker kill soon
    after cut, at least as many of them; not by fewer, another title's drops, or a
    kill before a create or long after it."""
    facts = good()
    lost = dataclasses.replace(
        failed("d1", "D", "exhausted"),
        events=("Started", *("CreateRequested",) * 3, "Failed"),
        create_times=(100.0, 130.0, 160.0),
    )
    up = facts.upstream
    assert not checks.failure_explained(lost, up)
    assert not checks.failure_explained(lost, dataclasses.replace(up, dropped={"D": 2}))
    assert checks.failure_explained(lost, dataclasses.replace(up, dropped={"D": 3}))
    assert not checks.failure_explained(lost, dataclasses.replace(up, dropped={"E": 3}))
    two_cut = dataclasses.replace(up, dropped={"D": 1}, kills=(100.3, 131.0))
    assert checks.failure_explained(lost, two_cut)
    wrong_times = dataclasses.replace(up, dropped={"D": 1}, kills=(99.0, 130.0 + 30))
    assert not checks.failure_explained(lost, wrong_times)


def test_an_active_brand_not_ready_is_reported_unless_deactivated() -> None:
    facts = good()
    cancelled = AttemptFacts("a2", "A", "cancelled", events=("Started", "Cancelled"))
    a = facts.brands["a"]
    brands = {**facts.brands, "a": dataclasses.replace(a, attempts=(*a.attempts, cancelled))}
    found = checks.brands_ready(brands.values(), facts.upstream)
    assert [(v.kind, v.brand_id, v.detail) for v in found] == [
        ("brand_not_ready", "a", "last attempt a2 cancelled")
    ]
    gone = dataclasses.replace(brands["a"], lifecycle="deactivated", workspace_id=None)
    assert checks.brands_ready([gone], facts.upstream) == []
    never = BrandFacts("n", "active", None, ())
    assert [v.detail for v in checks.brands_ready([never], facts.upstream)] == ["no attempt"]
    # A failure the faults explain is the brand's end; one they do not is not.
    zombie = failed("z1", "Z", "exhausted", "w-z")
    upstream = dataclasses.replace(
        facts.upstream, workspaces={**facts.upstream.workspaces, "w-z": ws("Z", "not ready")}
    )
    assert checks.brands_ready([BrandFacts("z", "active", None, (zombie,))], upstream) == []
    bug = failed("i1", "Z", "internal_error", "w-z")
    found = checks.brands_ready([BrandFacts("z", "active", None, (bug,))], upstream)
    assert [v.detail for v in found] == ["last attempt i1 failed (internal_error)"]


def test_the_gateway_faults_drawn_from_a_seed() -> None:
    """Every outage outlasts the settle budget; two are one of each mode; the pace is
    configured near the limit or learned (then without the fake's random 429s)."""
    budget = 15.75
    kinds: Counter[tuple[str, ...]] = Counter()
    for seed in range(200):
        outages = plan.draw_outages(seed, budget, first_by_s=6.0)
        assert outages == plan.draw_outages(seed, budget, first_by_s=6.0)
        kinds[tuple(o.mode for o in outages)] += 1
        assert all(o.seconds > budget for o in outages)
        assert 3.0 <= outages[0].at_s <= 6.0
        if len(outages) == 2:
            assert outages[1].at_s >= outages[0].at_s + outages[0].seconds + 3.0
        fixed = plan.draw_outages(seed, budget, first_by_s=6.0, seconds=17.0)
        assert [(o.mode, o.seconds) for o in fixed] == [(o.mode, 17.0) for o in outages]
        m = plan.draw_metering(seed, workers=2)
        assert 28.0 <= m.rate_limit <= 40.0
        assert 2 <= m.burst <= 5
        if m.pace == "configured":
            assert m.service_rate is not None
            assert 0.8 * m.rate_limit - 0.1 <= m.service_rate <= 1.2 * m.rate_limit + 0.1
            assert m.env()["PROVISIONER_GATEWAY_RATE"] == f"{m.service_rate:g}"
            assert m.random_429s
        else:
            assert m.env() == {}
            assert not m.random_429s
    assert set(kinds) == {("503",), ("refuse",), ("503", "refuse"), ("refuse", "503")}


def test_the_audits_findings_that_break_a_promise_are_violations() -> None:
    findings = [
        {"kind": "orphan", "workspace_id": "w1", "brand_ids": ["b1"], "detail": "made by a1"},
        {"kind": "released_not_empty", "workspace_id": "w2", "brand_ids": [], "detail": "2"},
        {"kind": "foreign", "workspace_id": "w3", "brand_ids": [], "detail": "someone's"},
        {"kind": "unclear", "workspace_id": "w4", "brand_ids": ["b2"], "detail": "ambiguous"},
    ]
    found = checks.audited(findings)
    assert [(v.kind, v.brand_id) for v in found] == [
        ("audit_orphan", "b1"), ("audit_released_not_empty", None)
    ]  # fmt: skip
    assert found[0].detail == "w1: made by a1"
