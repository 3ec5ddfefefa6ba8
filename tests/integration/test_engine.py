"""The hop protocol (docs/architecture.md) end to end: the service, the HTTP adapter, the fake
gateway over real HTTP, and the event store on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any
from uuid import UUID, uuid4

import pytest
from pytest_mock import MockerFixture

from domain.errors import AttemptInProgress, InvalidRequest
from domain.hop import CREATED_WAIT
from domain.outcomes import HopOutcome, Outcome, StandDown
from domain.policies import AttemptState, FailureReason, Provenance
from domain.ports import RequestRejected, TransientGatewayError, Unauthorized
from domain.releases import DecommissionKind
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from tests.conftest import PARENT, TOKEN
from tests.support import Intercepting, ManualClock, creates, drive, event_names, upstream


def parent_untouched(fake: FakeGateway) -> bool:
    parent = next(w for w in fake.state()["workspaces"] if w["id"] == PARENT)
    return bool(parent["projects"]) and parent["status"] == "active"


def created_then_promoted(service: ProvisioningService, attempt_id: UUID) -> HopOutcome:
    """Hop 0 creates the workspace and, without polling it (never ready the instant its
    create returns), waits the backoff's first step, spending none of the settle
    budget; hop 1 polls it (ready at the fake's first poll) and promotes it."""
    created = service.run_hop(attempt_id, 0)
    assert (created.outcome, created.next_hop, created.detail) == (
        Outcome.SCHEDULED,
        1,
        CREATED_WAIT,
    ), created
    assert service.attempt(attempt_id).settle_hops == 0
    promoted = service.run_hop(attempt_id, 1)
    assert (promoted.outcome, promoted.workspace_id) == (Outcome.PROMOTED, created.workspace_id)
    return promoted


# The happy path and settling.


def test_first_hop_creates_and_records_the_candidate_the_next_promotes_it_when_ready(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    attempt_id = service.request_provisioning(brand_id, title, PARENT)

    created = service.run_hop(attempt_id, 0)

    # Never ready the instant its create returns: recorded and claimed, not polled; the
    # next hop comes after the backoff's first step, spending none of the settle budget.
    assert (created.outcome, created.next_hop, created.delay_s) == (Outcome.SCHEDULED, 1, 5.0)
    assert created.detail == CREATED_WAIT
    assert fake.state()["calls"].get("status", 0) == 0
    waiting = service.attempt(attempt_id)
    assert (waiting.state, waiting.candidate_id) == (AttemptState.PENDING, created.workspace_id)
    assert waiting.settle_hops == 0
    assert service.brand(brand_id).workspace_id is None
    assert created.workspace_id is not None
    assert service.claim(created.workspace_id).brand_id == brand_id  # type: ignore[union-attr]

    outcome = service.run_hop(attempt_id, 1)

    assert outcome.outcome is Outcome.PROMOTED
    assert fake.state()["calls"]["status"] == 1
    attempt = service.attempt(attempt_id)
    assert attempt.provenance is Provenance.CREATED
    assert attempt.state is AttemptState.PROMOTED
    [workspace] = upstream(fake, title)
    assert attempt.candidate_id == workspace["id"] == outcome.workspace_id
    assert service.brand(brand_id).workspace_id == workspace["id"]
    assert event_names(service.app, attempt_id) == [
        "Started",
        "CreateRequested",
        "CandidateAccepted",
        "HopScheduled",
        "Promoted",
    ]
    assert service.claim(workspace["id"]).brand_id == brand_id  # type: ignore[union-attr]
    assert parent_untouched(fake)


def test_settling_schedules_the_next_hop_with_the_backoff_delay(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    fake.configure(settle_polls=3)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)

    outcomes = drive(service, attempt_id, clock.advance)

    # Hop 0 creates and waits the backoff's first step without polling (spending none of
    # the settle budget); hops 1-3 poll "not ready" three times, each spending one
    # settle wait on the backoff; hop 4 finds it ready.
    assert [o.outcome for o in outcomes] == [Outcome.SCHEDULED] * 4 + [Outcome.PROMOTED]
    assert [o.delay_s for o in outcomes[:4]] == [5.0, 5.0, 10.0, 20.0]
    scheduled = [
        e for e in service.app.events.get(attempt_id) if type(e).__name__ == "HopScheduled"
    ]
    assert [e.hop for e in scheduled] == [1, 2, 3, 4]  # type: ignore[attr-defined]
    assert [(e.last_status, e.spent) for e in scheduled] == [  # type: ignore[attr-defined]
        (CREATED_WAIT, False),
        ("not ready", True),
        ("not ready", True),
        ("not ready", True),
    ]
    assert service.attempt(attempt_id).settle_hops == 3
    first = scheduled[0]
    assert 4.0 <= (first.not_before - first.timestamp).total_seconds() <= 6.0  # type: ignore[attr-defined]
    # Each hop ran at its not_before (the clock advanced by each delay, give or take the
    # real time a hop takes): the waits after the three "not ready" are 5, 10 and 20 s.
    gaps = [(b.not_before - a.not_before).total_seconds() for a, b in pairwise(scheduled)]  # type: ignore[attr-defined]
    assert [round(gap) for gap in gaps] == [5, 10, 20]


def test_resumed_hop_polls_the_recorded_candidate_without_creating(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    first = service.run_hop(attempt_id, 0)  # creates, and waits for its first poll
    assert first.outcome is Outcome.SCHEDULED
    assert first.workspace_id is not None
    assert fake.state()["calls"].get("status", 0) == 0

    second = service.run_hop(attempt_id, 1)

    assert second.outcome is Outcome.PROMOTED
    assert second.workspace_id == first.workspace_id
    assert creates(fake, title) == 1
    assert fake.state()["calls"]["create"] == 1
    assert fake.state()["calls"]["status"] == 1


def test_budget_exhausted_fails_and_records_the_release_of_a_created_candidate(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    fake.configure(zombie_rate=1.0)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    first = service.run_hop(attempt_id, 0)
    assert first.workspace_id is not None
    fake.add_project(first.workspace_id)  # something to empty
    clock.advance(5)

    outcomes = drive_from(service, attempt_id, 1, clock)

    last = outcomes[-1]
    assert last.outcome is Outcome.FAILED
    assert last.released == (first.workspace_id,)
    attempt = service.attempt(attempt_id)
    assert attempt.failure_reason is FailureReason.EXHAUSTED
    assert not attempt.release_owed
    released = [
        e for e in service.app.events.get(attempt_id) if type(e).__name__ == "CandidateReleased"
    ]
    assert [(e.workspace_id, e.projects_deleted) for e in released] == [(first.workspace_id, 1)]  # type: ignore[attr-defined]
    [workspace] = upstream(fake, title)
    assert workspace["projects"] == []
    assert service.brand(brand_id).workspace_id is None


def drive_from(
    service: ProvisioningService, attempt_id: UUID, hop: int, clock: ManualClock
) -> list[Any]:
    outcomes = []
    while True:
        outcome = service.run_hop(attempt_id, hop)
        outcomes.append(outcome)
        if outcome.outcome is not Outcome.SCHEDULED:
            return outcomes
        clock.advance(outcome.delay_s or 0)
        hop = outcome.next_hop


def test_creation_failed_shells_are_released_and_created_again_until_out_of_hops(
    service: ProvisioningService,
    fake: FakeGateway,
    settings: EngineSettings,
    brand_id: str,
    title: str,
) -> None:
    fake.configure(terminal_rate=1.0)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)

    hop, outcome = 0, service.run_hop(attempt_id, 0)
    while outcome.outcome is Outcome.SCHEDULED:
        assert outcome.next_hop is not None
        hop = outcome.next_hop
        outcome = service.run_hop(attempt_id, hop)

    assert outcome.outcome is Outcome.FAILED
    attempt = service.attempt(attempt_id)
    assert attempt.failure_reason is FailureReason.EXHAUSTED
    # Each shell is created by one hop and first polled by the next, which drops it
    # (a create again is safe) and spends a settle wait: one create every other hop,
    # until the settle budget is spent.
    requested = [
        e.hop  # type: ignore[attr-defined]
        for e in service.app.events.get(attempt_id)
        if type(e).__name__ == "CreateRequested"
    ]
    assert requested == list(range(0, hop, 2))
    assert len(attempt.created_ids) == (hop + 1) // 2 == settings.backoff.max_requeues + 1
    assert attempt.settle_hops == settings.backoff.max_requeues
    assert set(attempt.released_ids) == set(attempt.created_ids)
    assert not attempt.release_owed
    assert service.release(attempt_id) == ()


# Ambiguous creates.


def test_create_that_times_out_after_creating_adopts_the_sole_family_match(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    fake.configure(create_timeout_after_create_rate=1.0)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)

    outcome = service.run_hop(attempt_id, 0)

    [workspace] = upstream(fake, title)
    assert creates(fake, title) == 1
    assert outcome.outcome is Outcome.PROMOTED
    attempt = service.attempt(attempt_id)
    assert attempt.candidate_id == workspace["id"]
    # We made it (CreateRequested is on record), so we own it: provenance created.
    assert attempt.provenance is Provenance.CREATED


def test_create_that_times_out_without_creating_is_retried_on_later_hops_then_fails(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    fake.configure(create_timeout_without_create_rate=1.0)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)

    outcomes = drive(service, attempt_id, clock.advance)

    assert outcomes[-1].outcome is Outcome.FAILED
    assert service.attempt(attempt_id).failure_reason is FailureReason.EXHAUSTED
    assert upstream(fake, title) == []
    # hop 0 creates; later hops re-list the family and create again only once the
    # earlier create is older than the grace period (60 s), waiting 5 s apart without
    # spending the settle budget: 12 hops a grace. The third unconfirmed create is the
    # last (`MAX_CREATES`): the attempt fails then, not at its deadline.
    requested = [
        e.hop for e in service.app.events.get(attempt_id) if type(e).__name__ == "CreateRequested"
    ]  # type: ignore[attr-defined]
    assert requested == [0, 12, 24]
    assert "3 creates titled" in service.attempt(attempt_id).last_status
    assert creates(fake, title) == 3


def test_create_retried_on_a_later_hop_succeeds_once_the_gateway_recovers(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    fake.configure(create_timeout_without_create_rate=1.0)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    assert service.run_hop(attempt_id, 0).outcome is Outcome.SCHEDULED
    fake.configure(create_timeout_without_create_rate=0.0)
    clock.advance(5)
    waiting = service.run_hop(attempt_id, 1)  # within the grace period: no second create
    clock.advance(61)

    created = service.run_hop(attempt_id, 2)  # past the grace: creates again
    clock.advance(created.delay_s or 0)
    outcome = service.run_hop(attempt_id, 3)  # polls what it created

    assert waiting.outcome is Outcome.SCHEDULED
    assert "unconfirmed" in waiting.detail
    assert (created.outcome, created.detail) == (Outcome.SCHEDULED, CREATED_WAIT)
    assert outcome.outcome is Outcome.PROMOTED
    assert outcome.workspace_id == created.workspace_id
    assert creates(fake, title) == 2
    assert len(upstream(fake, title)) == 1


def test_a_lapsed_unconfirmed_create_never_takes_the_workspace_another_attempt_is_creating(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, title: str
) -> None:
    # X's create times out having made nothing; its reservation of the title lapses.
    fake.configure(create_timeout_without_create_rate=1.0)
    x = service.request_provisioning(f"x-{uuid4().hex[:8]}", title, PARENT)
    assert service.run_hop(x, 0).outcome is Outcome.SCHEDULED
    fake.configure(create_timeout_without_create_rate=0.0)
    clock.advance(61)
    # Y (same title, same parent) takes the slot and creates; while its create is in
    # flight, X's next hop lists the family and sees the new child.
    intercept = Intercepting(service.gateway)
    x_hop: list[HopOutcome] = []

    def create_while_x_recovers(parent: str, child_title: str) -> str:
        made = intercept.inner.create_child(parent, child_title)
        if not x_hop:
            x_hop.append(service.run_hop(x, 1))
        return made

    intercept.create_answer = create_while_x_recovers
    service.gateway = intercept
    y_brand = f"y-{uuid4().hex[:8]}"
    y_attempt = service.request_provisioning(y_brand, title, PARENT)
    y_created = service.run_hop(y_attempt, 0)

    # Not gateway_bug: its workspace was not taken; it waits for its first poll.
    assert (y_created.outcome, y_created.detail) == (Outcome.SCHEDULED, CREATED_WAIT)
    assert x_hop[0].outcome is Outcome.SCHEDULED  # X waits for the slot instead
    assert service.attempt(x).candidate_id is None
    y = service.run_hop(y_attempt, 1)
    assert (y.outcome, y.workspace_id) == (Outcome.PROMOTED, y_created.workspace_id)
    clock.advance(60)
    assert x_hop[0].next_hop is not None
    later = service.run_hop(x, x_hop[0].next_hop)  # the slot is free: X creates its own
    assert (later.outcome, later.detail) == (Outcome.SCHEDULED, CREATED_WAIT)
    assert later.workspace_id not in (None, y.workspace_id)
    assert later.next_hop is not None
    done = service.run_hop(x, later.next_hop)
    assert (done.outcome, done.workspace_id) == (Outcome.PROMOTED, later.workspace_id)
    assert service.brand(y_brand).workspace_id == y.workspace_id


def _create_lost_to_an_outage(
    service: ProvisioningService, fake: FakeGateway, settle_polls: int
) -> Intercepting:
    """From now on a create makes its workspace (not ready for `settle_polls` polls,
    so nobody adopts it) but times out, and then the family cannot be listed."""
    intercept = Intercepting(service.gateway)
    service.gateway = intercept
    fake.configure(create_timeout_after_create_rate=1.0, settle_polls=settle_polls)

    def create_then_outage(parent: str, child_title: str) -> str:
        intercept.family_down = True
        return intercept.inner.create_child(parent, child_title)

    intercept.create_answer = create_then_outage
    return intercept


def _outage_over(fake: FakeGateway, intercept: Intercepting) -> None:
    fake.configure(create_timeout_after_create_rate=0.0)
    intercept.create_answer = None
    intercept.family_down = False


def test_an_orphan_of_a_create_unresolved_while_another_held_the_slot_is_found_later(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, title: str
) -> None:
    # Y's create makes a workspace but times out, and then the family cannot be listed.
    intercept = _create_lost_to_an_outage(service, fake, settle_polls=10)
    y = service.request_provisioning(f"y-{uuid4().hex[:8]}", title, PARENT)
    assert service.run_hop(y, 0).outcome is Outcome.DEFERRED  # no family: no answer
    [orphan] = [w["id"] for w in upstream(fake, title)]
    _outage_over(fake, intercept)
    clock.advance(61)  # Y's reservation lapses; X takes the slot and creates.
    y_hops: list[HopOutcome] = []

    def create_while_y_runs_out(parent: str, child_title: str) -> str:
        made = intercept.inner.create_child(parent, child_title)
        hop = 1
        while not y_hops or y_hops[-1].outcome is Outcome.SCHEDULED:  # no clock: X stays fresh
            y_hops.append(service.run_hop(y, hop))
            hop += 1
        return made

    intercept.create_answer = create_while_y_runs_out
    x = service.run_hop(service.request_provisioning(f"x-{uuid4().hex[:8]}", title, PARENT), 0)

    # While X's create was in flight Y waited, never taking X's workspace, and ran out.
    assert y_hops[-1].outcome is Outcome.FAILED
    assert {o.detail for o in y_hops[:-1]} == {f"another create titled {title!r} in flight"}
    assert (x.outcome, x.detail) == (Outcome.SCHEDULED, CREATED_WAIT)  # its own create
    assert x.workspace_id not in (None, orphan)
    # Once the slot is free, Y's release (the relay's, or the reconciler's) finds its orphan.
    service.release(y)
    ended = service.attempt(y)
    assert orphan in ended.created_ids
    assert orphan in ended.released_ids
    assert service.attempt(x.attempt_id).candidate_id == x.workspace_id


def test_an_orphan_is_found_beside_a_workspace_another_attempt_created_and_released(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, title: str
) -> None:
    # Y's create makes a workspace (never ready in this test) but times out, and the
    # family cannot be listed for the rest of Y's hops: Y ends with its create unresolved.
    intercept = _create_lost_to_an_outage(service, fake, settle_polls=100)
    y = service.request_provisioning(f"y-{uuid4().hex[:8]}", title, PARENT)
    assert drive(service, y, clock.advance)[-1].outcome is Outcome.FAILED
    [orphan] = [w["id"] for w in upstream(fake, title)]
    _outage_over(fake, intercept)
    # X (same title, another brand) creates its own, records it, runs out of hops and
    # releases it: an empty, unclaimed shell that X's create made, on record in X.
    x = service.request_provisioning(f"x-{uuid4().hex[:8]}", title, PARENT)
    assert drive(service, x, clock.advance)[-1].outcome is Outcome.FAILED
    [x_made] = service.attempt(x).created_ids
    assert x_made in service.attempt(x).released_ids

    service.release(y)  # the relay's or the reconciler's release of Y

    # X's released workspace is X's on record, not a second candidate for Y's orphan.
    ended = service.attempt(y)
    assert orphan in ended.created_ids
    assert orphan in ended.released_ids
    assert x_made not in ended.created_ids


def test_an_orphan_is_found_beside_the_workspace_of_the_brands_next_attempt(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    # As above, Y ends with an unresolved create whose workspace exists upstream.
    intercept = _create_lost_to_an_outage(service, fake, settle_polls=100)
    y = service.request_provisioning(brand_id, title, PARENT)
    assert drive(service, y, clock.advance)[-1].outcome is Outcome.FAILED
    [orphan] = [w["id"] for w in upstream(fake, title)]
    _outage_over(fake, intercept)
    # The brand asks again: its next attempt creates a workspace of its own (the
    # orphan is not ready, so it is not adopted); its claim names the same brand.
    retry = service.request_provisioning(brand_id, title, PARENT)
    assert service.run_hop(retry, 0).outcome is Outcome.SCHEDULED
    [made] = service.attempt(retry).created_ids

    service.release(y)

    ended = service.attempt(y)
    assert orphan in ended.created_ids
    assert orphan in ended.released_ids
    assert made not in ended.created_ids
    assert service.attempt(retry).candidate_id == made


def _refuse(error: Exception) -> Callable[[str, str], str]:
    def create(_parent: str, _title: str) -> str:
        raise error

    return create


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (RequestRejected("create_child: HTTP 422: title too long"), FailureReason.REJECTED),
        (Unauthorized("create_child: credentials refused (HTTP 401)"), FailureReason.UNAUTHORIZED),
    ],
)
def test_a_create_refused_outright_is_resolved_and_leaves_nothing_to_search_for(
    service: ProvisioningService,
    fake: FakeGateway,
    brand_id: str,
    title: str,
    error: Exception,
    reason: FailureReason,
) -> None:
    intercept = Intercepting(service.gateway)
    intercept.create_answer = _refuse(error)
    service.gateway = intercept
    attempt_id = service.request_provisioning(brand_id, title, PARENT)

    assert service.run_hop(attempt_id, 0).outcome is Outcome.FAILED
    attempt = service.attempt(attempt_id)
    assert attempt.failure_reason is reason
    assert not attempt.create_unresolved  # nothing was made: no orphan search
    assert service.slot(PARENT, title).holder is None
    listings = fake.state()["calls"].get("family", 0)
    assert service.release(attempt_id) == ()
    assert fake.state()["calls"].get("family", 0) == listings


def test_a_throttled_create_is_tried_again_at_the_next_hop_without_waiting_the_grace(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    intercept = Intercepting(service.gateway)
    intercept.create_answer = _refuse(TransientGatewayError("create_child: throttled (HTTP 429)"))
    service.gateway = intercept
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    assert service.run_hop(attempt_id, 0).outcome is Outcome.DEFERRED
    intercept.create_answer = None
    clock.advance(5)  # well within the 60 s grace of an unconfirmed create

    created = service.run_hop(attempt_id, 1)

    assert (created.outcome, created.detail) == (Outcome.SCHEDULED, CREATED_WAIT)
    assert creates(fake, title) == 1
    clock.advance(created.delay_s or 0)
    outcome = service.run_hop(attempt_id, 2)  # polls what hop 1 created
    assert (outcome.outcome, outcome.workspace_id) == (Outcome.PROMOTED, created.workspace_id)
    assert creates(fake, title) == 1


# Adoption rules.


def test_zombies_are_ignored_and_do_not_make_adoption_ambiguous(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    fake.seed_workspace(title, PARENT, status="not ready")
    ready = fake.seed_workspace(title, PARENT, status="Created")

    outcome = service.run_hop(service.request_provisioning(brand_id, title, PARENT), 0)

    assert outcome.outcome is Outcome.PROMOTED
    assert outcome.workspace_id == ready["id"]
    assert creates(fake, title) == 0


def test_a_lone_zombie_is_not_adopted_a_fresh_workspace_is_created(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    zombie = fake.seed_workspace(title, PARENT, status="not ready")

    outcome = created_then_promoted(service, service.request_provisioning(brand_id, title, PARENT))

    assert outcome.workspace_id != zombie["id"]
    assert creates(fake, title) == 1


def test_same_title_workspace_claimed_by_another_brand_is_ignored(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    created_then_promoted(service, service.request_provisioning(brand_id + "-other", title, PARENT))
    lone = fake.seed_workspace(title, PARENT, status="created")

    outcome = service.run_hop(service.request_provisioning(brand_id, title, PARENT), 0)

    assert outcome.workspace_id == lone["id"]
    assert service.attempt(outcome.attempt_id).provenance is Provenance.ADOPTED
    assert creates(fake, title) == 1  # only the other brand's


def test_two_adoptable_matches_fail_the_attempt_as_ambiguous(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    fake.seed_workspace(title, PARENT, status="created")
    fake.seed_workspace(title, PARENT, status="active")

    outcome = service.run_hop(service.request_provisioning(brand_id, title, PARENT), 0)

    assert outcome.outcome is Outcome.FAILED
    assert service.attempt(outcome.attempt_id).failure_reason is FailureReason.AMBIGUOUS
    assert creates(fake, title) == 0


def test_a_sole_match_with_projects_is_refused(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    busy = fake.seed_workspace(title, PARENT, status="created", projects=1)

    outcome = service.run_hop(service.request_provisioning(brand_id, title, PARENT), 0)

    assert outcome.workspace_id != busy["id"]
    assert creates(fake, title) == 1
    assert len(next(w for w in upstream(fake, title) if w["id"] == busy["id"])["projects"]) == 1


def test_the_parent_is_never_adopted_even_with_the_same_title(
    service: ProvisioningService, fake: FakeGateway, brand_id: str
) -> None:
    parent_title = next(w["title"] for w in fake.state()["workspaces"] if w["id"] == PARENT)

    attempt_id = service.request_provisioning(brand_id, parent_title, PARENT)

    outcome = created_then_promoted(service, attempt_id)

    assert outcome.workspace_id != PARENT
    assert creates(fake, parent_title) == 1
    assert parent_untouched(fake)


@pytest.mark.parametrize("answer", ["parent", "empty"])
def test_a_create_answering_the_parents_id_or_no_id_fails_and_never_binds_the_parent(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, answer: str, title: str
) -> None:
    intercept = Intercepting(service.gateway)
    intercept.create_answer = lambda parent, title: parent if answer == "parent" else ""
    service.gateway = intercept

    outcome = service.run_hop(service.request_provisioning(brand_id, title, PARENT), 0)

    assert outcome.outcome is Outcome.FAILED
    assert service.attempt(outcome.attempt_id).failure_reason is FailureReason.GATEWAY_BUG
    assert service.brand(brand_id).workspace_id is None
    assert service.claim(PARENT) is None
    assert parent_untouched(fake)


# Duplicate deliveries.


def test_a_sequential_duplicate_delivery_changes_nothing(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    fake.configure(settle_polls=1)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    service.run_hop(attempt_id, 0)
    version = service.attempt(attempt_id).version

    again = service.run_hop(attempt_id, 0)

    assert again.outcome is Outcome.DUPLICATE
    assert again.stand_down is StandDown.STALE_HOP
    assert service.attempt(attempt_id).version == version
    assert creates(fake, title) == 1


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_concurrent_duplicate_deliveries_create_once_and_leave_no_orphan(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    fake.configure(latency_ms=30, settle_polls=1)
    titles = [f"{title} {n}" for n in range(6)]
    attempts = [
        service.request_provisioning(f"{brand_id}-{n}", title, PARENT)
        for n, title in enumerate(titles)
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for attempt_id in attempts:
            list(pool.map(service.run_hop, [attempt_id, attempt_id], [0, 0]))

    for attempt_id, title in zip(attempts, titles, strict=True):
        assert creates(fake, title) == 1
        attempt = service.attempt(attempt_id)
        [workspace] = upstream(fake, title)
        assert attempt.candidate_id == workspace["id"]
        accepted = event_names(service.app, attempt_id).count("CandidateAccepted")
        assert accepted == 1


# Supersession, cancellation, redelivery.


def test_superseded_mid_flight_stands_down_and_releases_a_created_candidate(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    fake.configure(settle_polls=5)
    old = service.request_provisioning(brand_id, title, PARENT)
    first = service.run_hop(old, 0)
    assert first.workspace_id is not None
    fake.add_project(first.workspace_id)
    clock.advance(601)
    new = service.request_provisioning(brand_id, title, PARENT)

    outcome = service.run_hop(old, 1)

    assert outcome.stand_down is StandDown.SUPERSEDED
    assert outcome.released == (first.workspace_id,)
    assert service.attempt(old).state is AttemptState.SUPERSEDED
    assert next(w for w in upstream(fake, title) if w["id"] == first.workspace_id)["projects"] == []
    assert service.brand(brand_id).current_attempt_id == new
    # a second delivery never repeats it
    assert service.run_hop(old, 1).released == ()
    assert fake.state()["calls"]["delete_project"] == 1


def test_superseded_mid_flight_never_releases_an_adopted_candidate(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    adoptable = fake.seed_workspace(title, PARENT, status="created")
    intercept = Intercepting(service.gateway)

    def unavailable() -> str:
        raise TransientGatewayError("503")

    intercept.status_answer[adoptable["id"]] = unavailable
    service.gateway = intercept
    old = service.request_provisioning(brand_id, title, PARENT)
    assert service.run_hop(old, 0).outcome is Outcome.DEFERRED
    fake.add_project(adoptable["id"])  # now someone else's data may live there
    clock.advance(601)
    service.request_provisioning(brand_id, title, PARENT)

    outcome = service.run_hop(old, 1)

    assert outcome.stand_down is StandDown.SUPERSEDED
    assert outcome.released == ()
    assert (
        len(next(w for w in upstream(fake, title) if w["id"] == adoptable["id"])["projects"]) == 1
    )
    assert fake.state()["calls"].get("delete_project", 0) == 0
    assert service.claim(adoptable["id"]).brand_id is None  # type: ignore[union-attr]


def test_deactivated_mid_flight_cancels_and_releases_a_created_candidate(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    fake.configure(settle_polls=5)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    first = service.run_hop(attempt_id, 0)

    result = service.deactivate(brand_id)

    assert result.cancelled_attempt_id == attempt_id
    assert service.attempt(attempt_id).state is AttemptState.CANCELLED
    assert service.attempt(attempt_id).release_owed
    outcome = service.run_hop(attempt_id, 1)
    assert outcome.stand_down is StandDown.CANCELLED
    assert outcome.released == (first.workspace_id,)
    assert not service.attempt(attempt_id).release_owed


def test_release_use_case_performs_an_owed_release_once(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    fake.configure(settle_polls=5)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    first = service.run_hop(attempt_id, 0)
    service.deactivate(brand_id)

    assert service.release(attempt_id) == (first.workspace_id,)
    assert service.release(attempt_id) == ()
    assert event_names(service.app, attempt_id).count("CandidateReleased") == 1


def test_a_redelivered_hop_of_a_promoted_attempt_changes_nothing_and_releases_nothing(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    done = created_then_promoted(service, attempt_id)
    version = service.attempt(attempt_id).version

    again = [service.run_hop(attempt_id, hop) for hop in (1, 0)]  # the promoting hop, the first

    assert {o.stand_down for o in again} == {StandDown.REDELIVERY_OF_PROMOTED}
    assert {o.released for o in again} == {()}
    assert service.attempt(attempt_id).version == version
    assert service.brand(brand_id).workspace_id == done.workspace_id
    assert fake.state()["calls"].get("delete_project", 0) == 0


# The existing pointer.


def test_an_existing_ready_pointer_is_promoted_without_a_create(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    bound = created_then_promoted(service, service.request_provisioning(brand_id, title, PARENT))

    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    outcome = service.run_hop(attempt_id, 0)

    assert outcome.outcome is Outcome.PROMOTED
    assert outcome.workspace_id == bound.workspace_id
    assert service.attempt(attempt_id).provenance is Provenance.EXISTING
    assert creates(fake, title) == 1
    assert event_names(service.app, attempt_id) == ["Started", "Promoted"]


def test_an_existing_pointer_gone_terminal_is_unbound_and_the_next_hop_creates_fresh(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    bound = created_then_promoted(service, service.request_provisioning(brand_id, title, PARENT))
    assert bound.workspace_id is not None
    intercept = Intercepting(service.gateway)
    intercept.status_answer[bound.workspace_id] = lambda: "Creation Failed"
    service.gateway = intercept
    attempt_id = service.request_provisioning(brand_id, title, PARENT)

    first = service.run_hop(attempt_id, 0)

    assert first.outcome is Outcome.SCHEDULED
    assert service.brand(brand_id).workspace_id is None
    assert service.claim(bound.workspace_id).brand_id is None  # type: ignore[union-attr]
    clock.advance(first.delay_s or 0)
    second = service.run_hop(attempt_id, 1)  # creates afresh, and waits for its first poll
    assert (second.outcome, second.detail) == (Outcome.SCHEDULED, CREATED_WAIT)
    assert second.workspace_id not in (None, bound.workspace_id)
    clock.advance(second.delay_s or 0)
    third = service.run_hop(attempt_id, 2)
    assert (third.outcome, third.workspace_id) == (Outcome.PROMOTED, second.workspace_id)
    assert service.attempt(attempt_id).provenance is Provenance.CREATED
    assert creates(fake, title) == 2


# Gateway failures on status.


def test_429_and_5xx_on_status_are_deferred_without_spending_the_settle_budget(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    fake.configure(settle_polls=1)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    assert service.run_hop(attempt_id, 0).outcome is Outcome.SCHEDULED  # created: no poll yet
    settling = service.run_hop(attempt_id, 1)  # its first poll: not ready, spends one
    assert (settling.outcome, settling.detail) == (Outcome.SCHEDULED, "not ready")

    fake.configure(throttle_rate=1.0)
    throttled = service.run_hop(attempt_id, 2)
    fake.configure(throttle_rate=0.0, server_error_rate=1.0)
    erroring = service.run_hop(attempt_id, 3)
    fake.configure(server_error_rate=0.0)
    recovered = service.run_hop(attempt_id, 4)

    assert [throttled.outcome, erroring.outcome, recovered.outcome] == [
        Outcome.DEFERRED,
        Outcome.DEFERRED,
        Outcome.PROMOTED,
    ]
    attempt = service.attempt(attempt_id)
    assert (attempt.settle_hops, attempt.deferrals) == (1, 2)
    assert "429" in throttled.detail
    assert "503" in erroring.detail or "5" in erroring.detail


def test_401_fails_the_attempt_with_a_safe_message(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    fake.configure(unauthorized_rate=1.0)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)

    outcome = service.run_hop(attempt_id, 0)

    assert outcome.outcome is Outcome.FAILED
    attempt = service.attempt(attempt_id)
    assert attempt.failure_reason is FailureReason.UNAUTHORIZED
    for event in service.app.events.get(attempt_id):
        assert TOKEN not in repr(event)
    assert TOKEN not in outcome.detail


# The request path.


def test_a_request_while_an_attempt_is_pending_is_refused_clearly(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    first = service.request_provisioning(brand_id, title, PARENT)

    with pytest.raises(AttemptInProgress, match=str(first)):
        service.request_provisioning(brand_id, title, PARENT)
    assert service.brand(brand_id).current_attempt_id == first


def test_a_stale_pending_attempt_is_superseded_in_the_same_save(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    first = service.request_provisioning(brand_id, title, PARENT)
    clock.advance(601)
    saves = service.app.saves

    second = service.request_provisioning(brand_id, title, PARENT)

    assert service.app.saves == saves + 1
    assert service.attempt(first).state is AttemptState.SUPERSEDED
    superseded = service.app.events.get(first, desc=True, limit=1)
    assert [e.by_attempt_id for e in superseded] == [second]  # type: ignore[attr-defined]
    assert service.brand(brand_id).current_attempt_id == second


@pytest.mark.parametrize(
    ("brand", "title", "parent"),
    [("", "Acme", PARENT), ("b", " ", PARENT), ("b", "Acme", ""), (" b", "Acme", PARENT)],
)
def test_bad_requests_get_a_clear_error_and_record_nothing(
    service: ProvisioningService, brand: str, title: str, parent: str
) -> None:
    head = service.app.recorder.max_notification_id()
    with pytest.raises(InvalidRequest):
        service.request_provisioning(brand, title, parent)
    assert service.app.recorder.max_notification_id() == head


# Deactivation and reactivation.


def test_deactivate_empties_unbinds_and_releases_the_claim(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    bound = created_then_promoted(service, service.request_provisioning(brand_id, title, PARENT))
    assert bound.workspace_id is not None
    fake.add_project(bound.workspace_id)
    fake.add_project(bound.workspace_id)

    service.deactivate(brand_id)
    deleted = service.decommission(brand_id)

    assert (deleted.kind, deleted.projects_deleted) == (DecommissionKind.EMPTIED, 2)
    brand = service.brand(brand_id)
    assert brand.workspace_id is None
    assert brand.lifecycle == "deactivated"
    assert service.claim(bound.workspace_id).brand_id is None  # type: ignore[union-attr]
    [shell] = upstream(fake, title)
    assert shell["projects"] == []  # emptied, never deleted
    assert service.decommission(brand_id).kind is DecommissionKind.NOTHING_BOUND  # repeatable
    assert service.deactivate(brand_id).already_deactivated


def test_reactivation_adopts_the_emptied_shell(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    bound = created_then_promoted(service, service.request_provisioning(brand_id, title, PARENT))
    service.deactivate(brand_id)
    service.decommission(brand_id)

    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    outcome = service.run_hop(attempt_id, 0)

    assert outcome.outcome is Outcome.PROMOTED
    assert outcome.workspace_id == bound.workspace_id
    assert service.attempt(attempt_id).provenance is Provenance.ADOPTED
    assert service.brand(brand_id).lifecycle == "active"
    assert creates(fake, title) == 1


# Transaction budget.


def test_a_created_attempt_ready_at_its_first_poll_costs_four_transactions(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    before = service.app.saves
    created_then_promoted(service, service.request_provisioning(brand_id, title, PARENT))
    # request; CreateRequested (+ slot); CandidateAccepted + claim + slot freed + the
    # wait for the first poll (HopScheduled); at hop 1's poll, Promoted + bound
    assert service.app.saves - before == 4


def test_a_hop_reads_the_attempt_its_slot_and_its_brand_in_one_query(
    service: ProvisioningService,
    fake: FakeGateway,
    brand_id: str,
    title: str,
    clock: ManualClock,
    mocker: MockerFixture,
) -> None:
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    # Hop 0 creates and waits for its first poll; hop 1 polls it (ready) and promotes.
    loads = mocker.spy(service, "load")

    # This service took the request, so it knows the attempt's brand, parent and title.
    assert service.run_hop(attempt_id, 0).outcome is Outcome.SCHEDULED
    assert [len(call.args) for call in loads.call_args_list] == [3]
    # A service (another worker) that does not reads the attempt, then the brand to bind.
    other = ProvisioningService(service.app, service.gateway, service.clock, service.settings)
    other_loads = mocker.spy(other, "load")
    clock.advance(60)
    assert other.run_hop(attempt_id, 1).outcome is Outcome.PROMOTED
    assert [len(call.args) for call in other_loads.call_args_list] == [1, 1]


def test_an_adopted_attempt_ready_at_first_poll_costs_two_transactions(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    fake.seed_workspace(title, PARENT, status="created")
    before = service.app.saves
    service.run_hop(service.request_provisioning(brand_id, title, PARENT), 0)
    # request; CandidateAccepted + claim + Promoted + bound
    assert service.app.saves - before == 2
