"""The ownership model (`domain/ownership.py`): every kind, and every path that may
empty a workspace (a hop, the orphan search the reconciler sends, a release, a
decommission, `audit --fix`), on the cases that once emptied someone else's work."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest

from domain.errors import NotOurs
from domain.outcomes import Outcome
from domain.ownership import Creates, Facts, Owner, canonical, credit, is_parent, judge
from domain.ports import FamilyMember
from domain.releases import DecommissionKind
from domain.upstream_audit import Kind, plan, still_true
from domain.waits import Backoff
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import open_event_store
from infrastructure.usecases import releases
from infrastructure.usecases.upstream_audit import audit_parent, fix
from tests.memory_gateway import MemoryGateway
from tests.support import ManualClock, drive

PARENT, OTHER_PARENT, TITLE = "org-parent", "org-other", "Acme"
PARENTS = (PARENT, OTHER_PARENT)


def row(name: str, owner: Owner, workspace_id: str = "ws-1", **facts: Any) -> object:
    return pytest.param(Facts(workspace_id, PARENTS, **facts), owner, id=name)


READY_EMPTY: dict[str, Any] = {"same_title": True, "status": "created", "projects": 0}
NEW_IN_WINDOW: dict[str, Any] = {"new": True, "window_open": True}
CLAIMED = "claimed by brand b2"

# Facts -> the kind; one row a rule (the docstring of domain/ownership.py).
JUDGED = [
    row("the-parent-even-on-record", Owner.PARENT, PARENT, proven=True),
    row("the-parent-upper-case", Owner.PARENT, "ORG-PARENT", **READY_EMPTY),
    row("a-parent-spaced-invisible", Owner.PARENT, " org-other\u200b"),
    row("a-parent-full-width", Owner.PARENT, "\uff4frg-parent"),
    row("created-or-bound", Owner.PROOF, proven=True, projects=7),
    row("new-within-window-empty", Owner.INFERENCE, **NEW_IN_WINDOW, projects=0),
    row("new-within-window-with-projects", Owner.UNCLEAR, **NEW_IN_WINDOW, projects=2),
    row("new-within-window-projects-not-read", Owner.UNCLEAR, **NEW_IN_WINDOW),
    row("on-record-by-inference-still-empty", Owner.INFERENCE, credited=True, projects=0),
    row("on-record-by-inference-now-with-projects", Owner.UNCLEAR, credited=True, projects=1),
    row("new-past-the-window", Owner.FOREIGN, new=True, projects=3),
    row("new-but-anothers-claim", Owner.FOREIGN, **NEW_IN_WINDOW, projects=0, taken=CLAIMED),
    row("pre-existing-ready-empty-unclaimed", Owner.ADOPTABLE, **READY_EMPTY),
    row("new-past-the-window-ready-empty", Owner.ADOPTABLE, new=True, **READY_EMPTY),
    row("pre-existing-with-projects", Owner.FOREIGN, **{**READY_EMPTY, "projects": 1}),
    row("pre-existing-settling", Owner.FOREIGN, **{**READY_EMPTY, "status": "not ready"}),
    row("claimed-by-another", Owner.FOREIGN, **READY_EMPTY, taken=CLAIMED),
    row("nothing-known", Owner.FOREIGN),
]


@pytest.mark.parametrize(("facts", "owner"), JUDGED)
def test_each_kind(facts: Facts, owner: Owner) -> None:
    verdict = judge(facts)
    assert verdict.owner is owner, verdict.why
    assert verdict.why
    # Only what is ours may be emptied; ours by inference only while it is empty.
    assert verdict.ours == (owner in (Owner.PROOF, Owner.INFERENCE))
    if owner is Owner.INFERENCE:
        assert facts.projects == 0


def test_parents_are_compared_as_a_lenient_gateway_would() -> None:
    assert canonical(" ORG-Parent\u200d ") == "org-parent"
    assert is_parent("ORG-PARENT", PARENTS)
    assert not is_parent("org-parent-2", PARENTS)
    assert not is_parent("\u043erg-parent", PARENTS)  # Cyrillic o: another id to NFKC


NOW = datetime(2026, 12, 1, tzinfo=UTC)
LOST = Creates(frozenset({"before"}), frozenset({"ours"}), given_up=1, window_from=NOW)


def family(*members: tuple[str, str]) -> list[FamilyMember]:
    return [FamilyMember(PARENT, "Org", "active"),
            *(FamilyMember(ws, TITLE, status) for ws, status in members)]  # fmt: skip


def test_credit_takes_only_empty_new_children_within_the_window() -> None:
    listed = family(("before", "created"), ("ours", "created"), ("hand-made", "created"),
                    ("ORG-PARENT", "created"))  # fmt: skip
    with_projects = credit(listed, TITLE, PARENT, LOST, projects={"hand-made": 2})
    empty = credit(listed, TITLE, PARENT, LOST, projects={"hand-made": 0})
    closed = credit(listed, TITLE, PARENT, LOST, projects={"hand-made": 0}, window_open=False)

    assert with_projects.ours == ()
    assert [ws for ws, _ in with_projects.held] == ["hand-made"]
    assert "holds 2 projects" in with_projects.held[0][1]
    assert empty.live == ("hand-made",)
    assert closed.ours == ()
    assert closed.held == ()


# The stories, on the service with a gateway in memory.


@pytest.fixture
def gateway() -> MemoryGateway:
    return MemoryGateway(PARENT, OTHER_PARENT)


@pytest.fixture
def settings(settings: EngineSettings) -> EngineSettings:
    return replace(settings, parent_ids=frozenset(PARENTS))


def promoted_after_a_lost_create(service: ProvisioningService, clock: ManualClock) -> UUID:
    """The brand's first create times out having made nothing; the next one, after its
    grace, succeeds, is polled by the hop after it and the brand is promoted: a
    healthy outcome."""
    gateway = service.gateway
    assert isinstance(gateway, MemoryGateway)
    gateway.creates = ["none", "ok"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    assert service.run_hop(attempt_id, 0).outcome is Outcome.SCHEDULED
    clock.advance(61)
    assert service.run_hop(attempt_id, 1).outcome is Outcome.SCHEDULED  # created again
    assert service.run_hop(attempt_id, 2).outcome is Outcome.PROMOTED
    return attempt_id


@pytest.mark.parametrize("later_s", [30.0, 30 * 86_400.0], ids=["30s", "30days"])
def test_a_hand_made_same_title_workspace_with_projects_is_never_emptied(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock, later_s: float
) -> None:
    attempt_id = promoted_after_a_lost_create(service, clock)
    hand_made = gateway.add(PARENT, TITLE, "created", projects=2)
    clock.advance(later_s)

    by_reconciler = service.release(attempt_id)  # the orphan re-check the reconciler sends
    found = audit_parent(service, PARENT)
    steps = plan([found])
    done = fix(service, found)  # `audit --fix --yes`

    assert by_reconciler == ()
    assert len(gateway.workspaces[hand_made].projects) == 2
    assert gateway.deleted == []
    [finding] = [f for f in found.findings if f.workspace_id == hand_made]
    assert finding.kind is (Kind.UNCLEAR if later_s < 3600 else Kind.FOREIGN)
    assert finding.title == TITLE
    assert finding.projects == 2
    assert hand_made not in {s.workspace_id for s in steps}
    assert done == []
    attempt = service.attempt(attempt_id)
    assert hand_made not in attempt.created_ids
    assert service.brand("b1").workspace_id != hand_made


def test_a_hop_never_takes_a_hand_made_workspace_for_its_lost_create(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    gateway.creates = ["none", "ok"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    service.run_hop(attempt_id, 0)  # the create's answer is lost; nothing was made
    hand_made = gateway.add(PARENT, TITLE, "created", projects=2)
    clock.advance(10)

    waiting = service.run_hop(attempt_id, 1)  # within the grace: not credited, waits
    clock.advance(61)
    created = service.run_hop(attempt_id, 2)  # after it: creates afresh, never adopts it
    done = service.run_hop(attempt_id, 3)  # polls what it created

    assert waiting.outcome is Outcome.SCHEDULED
    assert created.outcome is Outcome.SCHEDULED
    assert created.workspace_id not in (hand_made, None)
    assert (done.outcome, done.workspace_id) == (Outcome.PROMOTED, created.workspace_id)
    assert len(gateway.workspaces[hand_made].projects) == 2
    assert hand_made not in service.attempt(attempt_id).created_ids


def test_an_empty_late_workspace_is_credited_by_inference_and_emptying_it_deletes_nothing(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    attempt_id = promoted_after_a_lost_create(service, clock)
    late = gateway.add(PARENT, TITLE, "created")  # empty, as our create leaves it
    history_before = len(service.attempt_history(attempt_id))

    released = service.release(attempt_id)

    attempt = service.attempt(attempt_id)
    assert released == (late,)
    assert attempt.inferred_ids == (late,)
    names = [type(e).__name__ for e in service.attempt_history(attempt_id)[history_before:]]
    assert names[0] == "CreditedByInference"
    assert gateway.calls["delete_project"] == 0


def test_a_release_of_what_inference_credited_refuses_once_it_holds_projects(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    """Credited while empty; a person starts using it before the release empties it."""
    attempt_id = promoted_after_a_lost_create(service, clock)
    late = gateway.add(PARENT, TITLE, "created")
    # The orphan search's read answers empty; right after it, a person adds a project.
    gateway.hooks["list_projects"] = [lambda: gateway.workspaces[late].projects.append("someones")]

    released = service.release(attempt_id)

    attempt = service.attempt(attempt_id)
    assert released == ()
    assert gateway.workspaces[late].projects == ["someones"]
    assert late in attempt.refused_ids  # on record, never asked again
    assert attempt.owed_releases == ()


def test_a_workspace_the_gateway_lists_as_the_parent_in_upper_case_is_never_adopted(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    gateway.workspaces["ORG-PARENT"] = gateway.workspaces.pop(gateway.add(PARENT, TITLE))
    gateway.workspaces["ORG-PARENT"].id = "ORG-PARENT"
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    outcome = service.run_hop(attempt_id, 0)

    assert outcome.workspace_id not in ("ORG-PARENT", None)
    assert service.attempt(attempt_id).provenance is not None
    assert service.claim("ORG-PARENT") is None


def test_empty_workspace_refuses_any_form_of_a_parent(service: ProvisioningService) -> None:
    for lookalike in ("ORG-PARENT", " org-other ", "org-parent\u200b"):
        with pytest.raises(NotOurs, match="never emptied"):
            releases.empty_workspace(service, Facts(lookalike, proven=True))


def test_release_and_decommission_under_a_parent_no_longer_allowed_delete_nothing(
    gateway: MemoryGateway, clock: ManualClock
) -> None:
    """An attempt and a brand from before the allowlist: the service then acts under
    another parent only."""
    store = open_event_store("memory://")
    before = ProvisioningService(store, gateway, clock, EngineSettings(backoff=Backoff(5.0, 3)))
    attempt_id = before.request_provisioning("b1", TITLE, OTHER_PARENT)
    *_, promoted = drive(before, attempt_id)
    assert promoted.outcome is Outcome.PROMOTED
    bound = promoted.workspace_id
    assert bound is not None
    gateway.workspaces[bound].projects = ["p1", "p2", "p3", "p4"]
    after = ProvisioningService(store, gateway, clock, EngineSettings(
        backoff=Backoff(5.0, 3), parent_ids=frozenset({PARENT}),
        decommission_delay_s=0.0))  # fmt: skip

    after.deactivate("b1")
    deleted = after.decommission("b1")
    found = audit_parent(after, OTHER_PARENT)

    assert deleted.kind is DecommissionKind.REFUSED
    assert gateway.workspaces[bound].projects == ["p1", "p2", "p3", "p4"]
    assert after.brand("b1").emptying_refused
    assert [f.kind for f in found.findings] == [Kind.PARENT_NOT_ALLOWED]
    assert gateway.calls["list_projects"] == 0


def test_a_fix_plan_is_applied_only_where_it_still_holds(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    attempt_id = promoted_after_a_lost_create(service, clock)
    late = gateway.add(PARENT, TITLE, "created")  # empty: an orphan of ours
    planned = plan([audit_parent(service, PARENT)])
    gateway.workspaces[late].projects.append("someones")  # a person uses it meanwhile

    now = [audit_parent(service, PARENT)]
    kept = still_true(planned, now)
    done = [d for a in kept for d in fix(service, a)]

    assert [(s.kind, s.workspace_id, s.title) for s in planned] == [("orphan", late, TITLE)]
    assert [f.kind for a in now for f in a.findings if f.workspace_id == late] == [Kind.UNCLEAR]
    assert done == []
    assert gateway.workspaces[late].projects == ["someones"]
    assert late not in service.attempt(attempt_id).created_ids


def test_the_window_is_counted_from_the_create(clock: ManualClock) -> None:
    start = clock.now()
    creates = Creates(frozenset(), frozenset(), window_from=start)
    assert creates.window_open(start + timedelta(seconds=3600), 3600)
    assert not creates.window_open(start + timedelta(seconds=3601), 3600)
    assert not Creates(frozenset(), frozenset()).window_open(start, 3600)
