"""Races and crashes at precise points, through the fake gateway over HTTP.

Each test injects a second actor at one point of a hop (with the Intercepting
gateway) and checks the promises: nothing duplicated upstream, nothing we
created left unrecorded, a workspace in use never emptied.
"""

from __future__ import annotations

from typing import Any

from domain.outcomes import Outcome, StandDown
from domain.policies import AttemptState, Provenance
from domain.ports import AmbiguousCreate, TransientGatewayError
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.service import ProvisioningService
from tests.conftest import PARENT
from tests.support import Intercepting, ManualClock


def intercept(service: ProvisioningService) -> Intercepting:
    wrapper = Intercepting(service.gateway)
    service.gateway = wrapper
    return wrapper


def projects(fake: FakeGateway, workspace_id: str) -> list[Any]:
    ws = next(w for w in fake.state()["workspaces"] if w["id"] == workspace_id)
    return list(ws["projects"])


def test_a_release_never_empties_a_workspace_a_later_attempt_took_on(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    first = service.request_provisioning(brand_id, title, PARENT)
    created = service.run_hop(first, 0)  # creates, not polled: still pending
    workspace = created.workspace_id
    assert created.outcome is Outcome.SCHEDULED
    assert workspace is not None
    service.deactivate(brand_id)  # first now owes the release of `workspace`
    second = service.request_provisioning(brand_id, title, PARENT)
    adopted = service.run_hop(second, 0)  # ready now: adopted by the same brand
    assert adopted.workspace_id == workspace
    fake.add_project(workspace)

    assert service.release(first) == ()

    assert len(projects(fake, workspace)) == 1
    assert not service.attempt(first).release_owed
    names = [type(e).__name__ for e in service.app.events.get(first)]
    assert "CandidateHandedOver" in names


def test_a_failing_delivery_never_empties_what_a_concurrent_delivery_promoted(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    fake.configure(settle_polls=100)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    hop = 0  # hop 0 creates (spends nothing), hops 1-5 spend the budget of 5 settle waits
    while (outcome := service.run_hop(attempt_id, hop)).next_hop is not None and hop < 5:
        clock.advance(outcome.delay_s or 0)
        hop = outcome.next_hop
    hop = outcome.next_hop or hop
    workspace = outcome.workspace_id
    assert workspace is not None
    assert service.attempt(attempt_id).settle_hops == 5  # the next "not ready" fails it
    wrapper = intercept(service)
    statuses = iter(["not ready", "created"])

    def other_delivery_promotes() -> None:
        assert service.run_hop(attempt_id, hop).outcome is Outcome.PROMOTED
        fake.add_project(workspace)

    def status() -> str:
        answer = next(statuses)
        if answer == "not ready":
            other_delivery_promotes()
        return answer

    wrapper.status_answer[workspace] = status

    last = service.run_hop(attempt_id, hop)  # sees "not ready" on its last hop

    assert last.outcome is Outcome.STOOD_DOWN
    assert last.stand_down is StandDown.REDELIVERY_OF_PROMOTED
    assert service.attempt(attempt_id).state is AttemptState.PROMOTED
    assert len(projects(fake, workspace)) == 1


def test_a_create_slower_than_the_backoff_is_never_repeated(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    wrapper = intercept(service)
    later: list[Any] = []

    def slow_create(parent: str, title_: str) -> str:
        # While this create is in flight, a duplicate of hop 0 moves the attempt
        # on and hop 1 runs 5 s later.
        later.append(service.run_hop(attempt_id, 0))
        clock.advance(5)
        later.append(service.run_hop(attempt_id, 1))
        wrapper.create_answer = None
        return wrapper.inner.create_child(parent, title_)

    wrapper.create_answer = slow_create

    first = service.run_hop(attempt_id, 0)

    assert [o.outcome for o in later] == [Outcome.SCHEDULED, Outcome.SCHEDULED]
    assert first.stand_down is StandDown.CONCURRENT_DELIVERY
    assert fake.state()["creates"] == {title: 1}
    clock.advance(10)
    assert service.run_hop(attempt_id, 2).outcome is Outcome.PROMOTED


def test_promotion_racing_a_deactivation_stands_down_and_releases(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    fake.configure(settle_polls=1)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    workspace = service.run_hop(attempt_id, 0).workspace_id
    assert workspace is not None
    wrapper = intercept(service)

    def deactivated_meanwhile() -> str:
        service.deactivate(brand_id)
        return "created"

    wrapper.status_answer[workspace] = deactivated_meanwhile

    outcome = service.run_hop(attempt_id, 1)

    assert outcome.stand_down is StandDown.CANCELLED
    assert outcome.released == (workspace,)
    assert service.brand(brand_id).workspace_id is None


def test_same_title_brands_never_create_at_once_nor_take_each_others_workspace(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    x = service.request_provisioning(brand_id + "-x", title, PARENT)
    y = service.request_provisioning(brand_id + "-y", title, PARENT)
    wrapper = intercept(service)
    seen: list[Any] = []

    def x_create_times_out(parent: str, title_: str) -> str:
        seen.append(service.run_hop(y, 0))  # Y arrives while X's create is in flight
        raise AmbiguousCreate("timed out")

    wrapper.create_answer = x_create_times_out
    x_first = service.run_hop(x, 0)
    wrapper.create_answer = None

    assert seen[0].outcome is Outcome.SCHEDULED
    assert "in flight" in seen[0].detail
    assert x_first.outcome is Outcome.SCHEDULED
    assert fake.state()["creates"] == {}  # nothing reached the gateway
    clock.advance(61)  # X's unconfirmed create is now abandoned
    y_created = service.run_hop(y, 1)  # Y creates; hop 2 polls it
    assert y_created.outcome is Outcome.SCHEDULED
    clock.advance(y_created.delay_s or 0)
    y_next = service.run_hop(y, 2)
    assert y_next.outcome is Outcome.PROMOTED
    assert y_next.workspace_id == y_created.workspace_id
    x_next = service.run_hop(x, 1)
    # X does not take Y's workspace for its own: it creates its own afterwards.
    assert x_next.workspace_id is not None
    assert x_next.workspace_id != y_next.workspace_id
    assert fake.state()["creates"] == {title: 2}  # Y's, then X's own
    assert service.attempt(y).provenance is Provenance.CREATED


def test_a_create_that_lost_its_race_is_recorded_even_when_emptying_it_fails(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    wrapper = intercept(service)
    adoptable: dict[str, Any] = {}

    def meanwhile_someone_adopts(parent: str, title_: str) -> str:
        created = wrapper.inner.create_child(parent, title_)
        # The attempt is superseded while the create is in flight.
        clock.advance(601)
        service.request_provisioning(brand_id, title, PARENT)
        adoptable["id"] = created
        return created

    wrapper.create_answer = meanwhile_someone_adopts
    original = wrapper.inner.list_projects

    def list_projects_down(workspace_id: str) -> list[str]:
        raise TransientGatewayError("503")

    wrapper.inner.list_projects = list_projects_down  # type: ignore[method-assign]

    outcome = service.run_hop(attempt_id, 0)

    assert outcome.stand_down is StandDown.SUPERSEDED
    attempt = service.attempt(attempt_id)
    assert attempt.created_ids == (adoptable["id"],)
    assert attempt.release_owed  # on record, to be done when the gateway answers
    wrapper.inner.list_projects = original  # type: ignore[method-assign]
    assert service.release(attempt_id) == (adoptable["id"],)
    assert not service.attempt(attempt_id).release_owed


def test_an_adopted_candidate_that_fails_at_its_first_poll_gives_its_claim_back(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    adoptable = fake.seed_workspace(title, PARENT, status="created")
    wrapper = intercept(service)

    def refused() -> str:
        from domain.ports import Unauthorized

        raise Unauthorized("401")

    wrapper.status_answer[adoptable["id"]] = refused
    attempt_id = service.request_provisioning(brand_id, title, PARENT)

    outcome = service.run_hop(attempt_id, 0)

    assert outcome.outcome is Outcome.FAILED
    assert service.attempt(attempt_id).provenance is Provenance.ADOPTED
    claim = service.claim(adoptable["id"])
    assert claim is not None
    assert claim.brand_id is None  # free for the next attempt or brand
