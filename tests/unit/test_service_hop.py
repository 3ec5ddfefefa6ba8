"""The service's use cases on an in-memory event store and an in-memory gateway
(no sockets, no database): each hop step's shell loads, asks the port, decides
with `domain.hop` and saves; `retry_on_conflict` retries a lost race."""

from __future__ import annotations

import logging
from uuid import UUID, uuid4

import pytest
from eventsourcing.persistence import IntegrityError

from domain.outcomes import Outcome, StandDown
from domain.policies import AttemptState, FailureReason, Provenance
from domain.ports import RequestRejected, TransientGatewayError, Unauthorized
from infrastructure.service import ProvisioningService
from infrastructure.usecases.retry import ContentionError, retry_on_conflict
from infrastructure.usecases.unit import HopUnit
from tests.memory_gateway import PARENT, MemoryGateway
from tests.support import ManualClock, drive

TITLE = "Acme"


def names(service: ProvisioningService, attempt_id: UUID) -> list[str]:
    return [type(e).__name__ for e in service.attempt_history(attempt_id)]


def test_a_created_workspace_is_first_polled_in_the_next_hop_and_promoted(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    """Never ready the instant its create returns: the create's hop waits the backoff's
    first step without polling it or spending the settle budget; the next hop polls."""
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    created = service.run_hop(attempt_id, 0)

    assert created.outcome is Outcome.SCHEDULED
    assert (created.next_hop, created.delay_s) == (1, 5.0)
    assert gateway.calls["status"] == 0
    assert service.attempt(attempt_id).settle_hops == 0

    outcome = service.run_hop(attempt_id, 1)

    assert outcome.outcome is Outcome.PROMOTED
    assert gateway.calls["status"] == 1
    [made] = gateway.children(PARENT, TITLE)
    assert service.brand("b1").workspace_id == made.id == outcome.workspace_id
    assert created.workspace_id == made.id
    assert names(service, attempt_id) == [
        "Started",
        "CreateRequested",
        "CandidateAccepted",
        "HopScheduled",
        "Promoted",
    ]
    claim = service.claim(made.id)
    assert claim is not None
    assert claim.brand_id == "b1"


def test_a_settling_workspace_is_polled_on_the_backoff_then_promoted(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    gateway.new_statuses = ["not ready", "not ready", "created"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    created = service.run_hop(attempt_id, 0)  # not polled: waits the first step
    clock.advance(5)
    first = service.run_hop(attempt_id, 1)
    clock.advance(5)
    second = service.run_hop(attempt_id, 2)
    clock.advance(10)
    third = service.run_hop(attempt_id, 3)

    assert [created.outcome, first.outcome, second.outcome, third.outcome] == [
        Outcome.SCHEDULED,
        Outcome.SCHEDULED,
        Outcome.SCHEDULED,
        Outcome.PROMOTED,
    ]
    assert (created.next_hop, created.delay_s) == (1, 5.0)
    assert (first.next_hop, first.delay_s, second.delay_s) == (2, 5.0, 10.0)
    assert service.attempt(attempt_id).settle_hops == 2  # the two "not ready" answers
    assert gateway.calls["status"] == 3
    assert gateway.calls["create_child"] == 1


def test_out_of_hops_fails_exhausted_and_releases_what_it_created(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    """A budget of 3 settle waits: the create's hop waits without spending it, then
    each of the 4 polls answers "not ready"; the 4th finds the budget spent."""
    gateway.new_statuses = ["not ready"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    outcomes = [service.run_hop(attempt_id, hop) for hop in range(5)]

    assert [o.outcome for o in outcomes] == [Outcome.SCHEDULED] * 4 + [Outcome.FAILED]
    assert gateway.calls["status"] == 4
    attempt = service.attempt(attempt_id)
    assert attempt.failure_reason is FailureReason.EXHAUSTED
    assert attempt.settle_hops == 3
    assert outcomes[-1].detail.startswith("exhausted: not confirmed after 4 answered hops")
    assert outcomes[-1].released == (attempt.candidate_id,)


def test_one_ready_empty_same_title_child_is_adopted(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    existing = gateway.add(PARENT, TITLE, "active")
    gateway.add(PARENT, TITLE, "active", projects=1)  # not empty: not adoptable
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    outcome = service.run_hop(attempt_id, 0)

    assert outcome.outcome is Outcome.PROMOTED
    assert outcome.workspace_id == existing
    assert service.attempt(attempt_id).provenance is Provenance.ADOPTED
    assert gateway.calls["create_child"] == 0


def test_two_adoptable_children_fail_ambiguous(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    gateway.add(PARENT, TITLE, "ready")
    gateway.add(PARENT, TITLE, "ready")
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    outcome = service.run_hop(attempt_id, 0)

    assert outcome.outcome is Outcome.FAILED
    assert outcome.failure is FailureReason.AMBIGUOUS  # the kind, for the log and metrics
    assert service.attempt(attempt_id).failure_reason is FailureReason.AMBIGUOUS


def test_a_create_whose_answer_was_lost_is_found_in_the_family_at_once(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    gateway.add(PARENT, TITLE, "not ready")  # a zombie from before: never confused with ours
    gateway.creates = ["lost"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    outcome = service.run_hop(attempt_id, 0)

    assert outcome.outcome is Outcome.PROMOTED
    [_, ours] = gateway.children(PARENT, TITLE)
    assert outcome.workspace_id == ours.id
    assert service.attempt(attempt_id).provenance is Provenance.CREATED


def test_a_create_that_did_not_happen_is_not_repeated_within_the_grace(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    gateway.creates = ["none"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    first = service.run_hop(attempt_id, 0)
    clock.advance(5)
    second = service.run_hop(attempt_id, 1)
    clock.advance(60)
    third = service.run_hop(attempt_id, 2)  # past the grace: creates again
    clock.advance(5)
    fourth = service.run_hop(attempt_id, 3)

    assert first.detail == second.detail == "create unconfirmed; not in the family yet"
    assert [first.outcome, second.outcome, third.outcome] == [Outcome.SCHEDULED] * 3
    assert third.workspace_id is not None
    assert fourth.outcome is Outcome.PROMOTED
    assert fourth.workspace_id == third.workspace_id
    assert gateway.calls["create_child"] == 2


@pytest.mark.parametrize(
    ("error", "outcome", "reason"),
    [
        (RequestRejected("409 quota"), Outcome.FAILED, FailureReason.REJECTED),
        (Unauthorized("401"), Outcome.FAILED, FailureReason.UNAUTHORIZED),
        (TransientGatewayError("429"), Outcome.DEFERRED, None),
    ],
)
def test_a_refused_create_is_recorded_as_refused(
    service: ProvisioningService,
    gateway: MemoryGateway,
    error: Exception,
    outcome: Outcome,
    reason: FailureReason | None,
) -> None:
    gateway.creates = [error]  # type: ignore[list-item]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    result = service.run_hop(attempt_id, 0)

    assert result.outcome is outcome
    attempt = service.attempt(attempt_id)
    assert attempt.failure_reason is reason
    assert "CreateRefused" in names(service, attempt_id)
    assert not attempt.create_unresolved


def test_a_create_whose_429_was_waited_out_is_made_again_on_record_once_a_hop(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    """Under the fleet's pace the adapter waits a short Retry-After in the create's
    thread (`waited`): the hop records the refusal and creates again at once, so the
    hop keeps its place in the queue and every create sent is on record. A second
    such 429 in the same hop defers it, as any 429."""
    waited = TransientGatewayError(
        "create_child: throttled (HTTP 429), nothing created", retry_after_s=1.0, waited=True
    )
    gateway.creates = [waited]
    made_again = service.request_provisioning("b1", TITLE, PARENT)

    assert service.run_hop(made_again, 0).outcome is Outcome.SCHEDULED  # polled next hop
    assert names(service, made_again)[1:5] == [
        "CreateRequested", "CreateRefused", "CreateRequested", "CandidateAccepted",
    ]  # fmt: skip
    assert service.attempt(made_again).candidate_id is not None

    gateway.creates = [waited, waited]
    deferred = service.request_provisioning("b2", "Other", PARENT)
    outcome = service.run_hop(deferred, 0)

    assert outcome.outcome is Outcome.DEFERRED
    history = names(service, deferred)
    assert history.count("CreateRequested") == history.count("CreateRefused") == 2
    assert not service.attempt(deferred).create_unresolved
    assert gateway.creates == []  # two creates sent by this hop, both on record


def test_a_unit_whose_save_failed_never_saves_again(
    service: ProvisioningService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed save took the attempt's new events and stored none; saving the same
    aggregate again would store the next version over a gap, and the attempt could
    never be loaded again. The unit refuses, and the round starts afresh."""
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    unit = HopUnit(service, attempt_id)
    saved = service.app.save

    def conflict(*_aggregates: object) -> None:
        raise IntegrityError("raced")

    unit.attempt.request_create(0, [], service.clock.now())
    monkeypatch.setattr(service.app, "save", conflict)
    with pytest.raises(IntegrityError, match="raced"):
        unit.save()
    monkeypatch.setattr(service.app, "save", saved)
    unit.attempt.record_create_refused(0, "429")
    with pytest.raises(IntegrityError, match="decide again"):
        unit.save()

    assert names(service, attempt_id) == ["Started"]  # nothing stored, no gap
    assert service.attempt(attempt_id).version == 1


def test_credentials_refused_on_the_family_fail_the_attempt(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    gateway.fail["family"] = [Unauthorized("403")]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    outcome = service.run_hop(attempt_id, 0)

    assert outcome.outcome is Outcome.FAILED
    assert outcome.detail == "unauthorized: gateway refused: 403"


@pytest.mark.parametrize("status", ["failed", "error", "invalid subscription", "Failed"])
def test_a_status_unsafe_to_create_again_fails_naming_it_and_creates_no_more(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock, status: str
) -> None:
    gateway.new_statuses = [status]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    assert service.run_hop(attempt_id, 0).outcome is Outcome.SCHEDULED  # created, not polled
    clock.advance(5)
    outcome = service.run_hop(attempt_id, 1)
    clock.advance(5)
    later = service.run_hop(attempt_id, 2)

    assert outcome.outcome is Outcome.FAILED
    attempt = service.attempt(attempt_id)
    assert attempt.failure_reason is FailureReason.TERMINAL_STATUS
    assert repr(status) in outcome.detail
    assert outcome.released == ()  # a terminal candidate is not released
    assert later.stand_down is StandDown.FAILED
    assert gateway.calls["create_child"] == 1


@pytest.mark.parametrize("status", ["creation_failed", "Creation Failed"])
def test_creation_failed_drops_the_candidate_releases_it_and_creates_again(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock, status: str
) -> None:
    gateway.new_statuses = [status]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    created = service.run_hop(attempt_id, 0)
    [shell] = [w.id for w in gateway.children(PARENT, TITLE)]
    gateway.new_statuses = ["created"]
    clock.advance(5)
    first = service.run_hop(attempt_id, 1)  # polls it: creation failed
    clock.advance(5)
    again = service.run_hop(attempt_id, 2)  # releases the shell, creates again
    clock.advance(5)
    second = service.run_hop(attempt_id, 3)

    assert created.workspace_id == shell
    assert first.outcome is Outcome.SCHEDULED
    assert first.workspace_id is None  # dropped
    assert again.outcome is Outcome.SCHEDULED
    assert again.released == (shell,)
    assert second.outcome is Outcome.PROMOTED
    assert gateway.calls["create_child"] == 2
    assert second.workspace_id not in (None, shell)
    assert second.workspace_id == again.workspace_id
    attempt = service.attempt(attempt_id)
    assert attempt.released_ids == (shell,)
    assert attempt.owed_releases == ()
    assert service.brand("b1").workspace_id == second.workspace_id
    claim = service.claim(shell)
    assert claim is not None
    assert claim.brand_id is None


def test_the_bound_workspace_that_failed_is_kept_and_the_attempt_fails(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    drive(service, service.request_provisioning("b1", TITLE, PARENT))
    bound = service.brand("b1").workspace_id
    assert bound is not None
    gateway.workspaces[bound].statuses = ["error"]

    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    outcome = service.run_hop(attempt_id, 0)  # not created: polled at once

    assert outcome.outcome is Outcome.FAILED
    assert "'error'" in outcome.detail
    assert service.brand("b1").workspace_id == bound
    assert gateway.calls["create_child"] == 1


def test_the_gate_answers_duplicates_future_hops_and_ended_attempts(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    gateway.new_statuses = ["created"]  # hop 0 creates and waits; hop 1 polls it ready
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    service.run_hop(attempt_id, 0)

    again = service.run_hop(attempt_id, 0)
    early = service.run_hop(attempt_id, 2)
    service.run_hop(attempt_id, 1)
    late = service.run_hop(attempt_id, 1)

    assert (again.outcome, again.stand_down) == (Outcome.DUPLICATE, StandDown.STALE_HOP)
    assert (early.outcome, early.stand_down) == (Outcome.STOOD_DOWN, StandDown.FUTURE_HOP)
    assert late.stand_down is StandDown.REDELIVERY_OF_PROMOTED


def test_a_cancelled_attempt_releases_what_it_created_when_released(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    gateway.new_statuses = ["not ready"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    first = service.run_hop(attempt_id, 0)
    assert first.workspace_id is not None
    gateway.workspaces[first.workspace_id].projects = ["p-1"]

    service.deactivate("b1")
    released = service.release(attempt_id)

    assert released == (first.workspace_id,)
    assert gateway.workspaces[first.workspace_id].projects == []
    assert service.attempt(attempt_id).state is AttemptState.CANCELLED
    assert service.release(attempt_id) == ()  # safe to repeat


def test_a_release_the_gateway_refuses_for_good_is_recorded_once_not_retried(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    gateway.new_statuses = ["not ready"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    first = service.run_hop(attempt_id, 0)
    assert first.workspace_id is not None
    gateway.workspaces[first.workspace_id].projects = ["p-1"]
    gateway.fail["delete_project"] = [RequestRejected("HTTP 409: project locked")]

    service.deactivate("b1")
    assert service.release(attempt_id) == ()

    attempt = service.attempt(attempt_id)
    assert attempt.refused_ids == (first.workspace_id,)
    assert attempt.owed_releases == ()  # a decision on record: nothing left to retry
    assert gateway.workspaces[first.workspace_id].projects == ["p-1"]  # nothing more deleted
    claim = service.claim(first.workspace_id)
    assert claim is not None
    assert claim.brand_id is None
    assert service.release(attempt_id) == ()
    assert gateway.calls["delete_project"] == 1


def test_an_owed_workspace_another_brand_claimed_since_ends_as_a_hand_over_not_a_loop(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    # A gateway that re-issued the id to another brand's create: that brand holds it now.
    gateway.new_statuses = ["not ready"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    made = service.run_hop(attempt_id, 0).workspace_id
    assert made is not None
    gateway.workspaces[made].projects = ["theirs"]
    service.deactivate("b1")
    claim = service.claim(made)
    assert claim is not None
    claim.release("re-issued upstream")
    claim.claim("b2", uuid4())
    service.app.save(claim)

    assert service.release(attempt_id) == ()

    assert gateway.workspaces[made].projects == ["theirs"]  # never emptied
    assert service.attempt(attempt_id).owed_releases == ()  # nothing left to send
    assert "CandidateHandedOver" in names(service, attempt_id)


def test_retry_on_conflict_decides_again_then_gives_up() -> None:
    rounds: list[int] = []
    forgotten: list[int] = []

    def step() -> str:
        rounds.append(1)
        if len(rounds) < 3:
            raise IntegrityError("lost a race")
        return "done"

    assert retry_on_conflict(6, step, "busy", lambda: forgotten.append(1)) == "done"
    assert (len(rounds), len(forgotten)) == (3, 2)

    def always() -> str:
        raise IntegrityError("lost a race")

    with pytest.raises(ContentionError, match="busy"):
        retry_on_conflict(4, always, "busy")


def test_a_lost_create_whose_workspace_appears_after_a_later_create_is_released(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    gateway.creates = ["none", "ok"]  # the first create times out; its workspace comes late
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    first = service.run_hop(attempt_id, 0)
    clock.advance(61)  # past the grace: the retry creates again
    created = service.run_hop(attempt_id, 1)
    clock.advance(5)
    second = service.run_hop(attempt_id, 2)
    late = gateway.add(PARENT, TITLE, "created")  # empty, as a create of ours leaves it

    released = service.release(attempt_id)  # what the reconciler sends during the hour

    assert first.outcome is created.outcome is Outcome.SCHEDULED
    assert second.outcome is Outcome.PROMOTED
    assert second.workspace_id is not None
    assert released == (late,)
    assert gateway.workspaces[late].projects == []
    attempt = service.attempt(attempt_id)
    assert attempt.create_lost
    assert attempt.created_ids == (second.workspace_id, late)
    assert attempt.inferred_ids == (late,)  # ours by inference, not by proof
    assert attempt.released_ids == (late,)
    assert service.brand("b1").workspace_id == second.workspace_id
    assert service.release(attempt_id) == ()  # safe to repeat
    assert gateway.workspaces[second.workspace_id].status() == "created"


@pytest.mark.parametrize("status", ["creation_failed", "failed"])
def test_a_lost_create_whose_shell_appears_late_in_a_terminal_status_goes_on_record(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock, status: str
) -> None:
    """The orphan search records a late shell too (nothing to empty, never bound),
    beside a late live workspace, which is still taken only when it is the only one."""
    gateway.creates = ["none", "ok"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    service.run_hop(attempt_id, 0)
    clock.advance(61)
    service.run_hop(attempt_id, 1)  # creates again, polled next hop
    clock.advance(5)
    second = service.run_hop(attempt_id, 2)
    shell = gateway.add(PARENT, TITLE, status)
    late = gateway.add(PARENT, TITLE, "created")

    released = service.release(attempt_id)

    assert second.outcome is Outcome.PROMOTED
    assert sorted(released) == sorted((late, shell))
    attempt = service.attempt(attempt_id)
    assert set(attempt.created_ids) == {second.workspace_id, late, shell}
    assert service.brand("b1").workspace_id == second.workspace_id
    assert service.release(attempt_id) == ()


def test_a_create_given_up_for_an_adoption_is_counted_and_its_workspace_released(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    """After the grace a workspace there before the create is adopted instead: the
    create is given up (counted among the creates lost, not among those given up for
    a new create, which bound the creates), and what it made, listed only later, is
    found by the orphan search and released; the adopted one is kept."""
    adoptable = gateway.add(PARENT, TITLE, "not ready")  # not adoptable yet
    gateway.creates = ["late"]  # made, the answer lost, listed only later
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    service.run_hop(attempt_id, 0)
    clock.advance(61)
    gateway.workspaces[adoptable].statuses = ["created"]

    adopted = service.run_hop(attempt_id, 1)
    [late] = gateway.reveal()
    released = service.release(attempt_id)

    assert adopted.outcome is Outcome.PROMOTED
    assert adopted.workspace_id == adoptable
    attempt = service.attempt(attempt_id)
    assert (attempt.creates_lost, attempt.creates_given_up) == (1, 0)
    assert attempt.creates.given_up == 1
    assert released == (late,)
    assert attempt.created_ids == (late,)
    assert gateway.workspaces[late].projects == []
    assert service.brand("b1").workspace_id == adoptable


def test_a_create_confirmed_or_refused_is_not_a_lost_create(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    gateway.creates = [TransientGatewayError("429"), "ok"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    service.run_hop(attempt_id, 0)
    clock.advance(5)
    service.run_hop(attempt_id, 1)  # creates, polled next hop
    clock.advance(5)
    promoted = service.run_hop(attempt_id, 2)
    gateway.add(PARENT, TITLE, "created")  # someone else's, later

    assert promoted.outcome is Outcome.PROMOTED
    assert not service.attempt(attempt_id).create_lost
    assert service.release(attempt_id) == ()
    assert gateway.calls["family"] == 2  # no search after the end


def test_an_exhausted_shell_that_gets_projects_later_is_emptied_again_unless_held(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    gateway.new_statuses = ["not ready"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    outcomes = drive(service, attempt_id)
    assert service.attempt(attempt_id).failure_reason is FailureReason.EXHAUSTED
    [shell] = outcomes[-1].released
    calls_before = gateway.calls["list_projects"]
    assert service.release(attempt_id) == ()  # still empty: nothing to do
    assert gateway.calls["list_projects"] == calls_before + 1  # but it was re-checked
    gateway.workspaces[shell].statuses = ["created"]  # it settles, and projects appear
    gateway.workspaces[shell].projects = ["p-late"]

    again = service.release(attempt_id)  # what the reconciler sends during the hour

    assert again == (shell,)
    assert gateway.workspaces[shell].projects == []
    claim = service.claim(shell)
    assert claim is not None
    assert (claim.brand_id, claim.releasing_by) == (None, None)
    adopter = service.request_provisioning("b2", TITLE, PARENT)
    assert service.run_hop(adopter, 0).workspace_id == shell  # ready, empty, free
    gateway.workspaces[shell].projects = ["p-b2"]
    assert service.release(attempt_id) == ()  # held by b2 now: never touched
    assert gateway.workspaces[shell].projects == ["p-b2"]


def test_an_adopted_candidate_whose_creation_failed_is_dropped_and_its_claim_returned(
    service: ProvisioningService,
    gateway: MemoryGateway,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    adopted = gateway.add(PARENT, TITLE, "ready")
    polled = gateway.status
    monkeypatch.setattr(
        gateway, "status", lambda w: "creation_failed" if w == adopted else polled(w)
    )
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    first = service.run_hop(attempt_id, 0)  # adopted, not created: polled at once
    gateway.workspaces[adopted].statuses = ["creation_failed"]  # as the family shows it now
    clock.advance(5)
    created = service.run_hop(attempt_id, 1)
    clock.advance(5)
    second = service.run_hop(attempt_id, 2)

    assert first.outcome is Outcome.SCHEDULED
    assert first.workspace_id is None  # dropped in the hop that adopted it
    assert created.outcome is Outcome.SCHEDULED
    assert second.outcome is Outcome.PROMOTED
    assert second.workspace_id not in (None, adopted)
    claim = service.claim(adopted)
    assert claim is not None
    assert claim.brand_id is None  # given back at the drop
    attempt = service.attempt(attempt_id)
    assert adopted not in attempt.created_ids  # never ours to release
    assert created.released == second.released == ()


def test_a_lost_create_whose_shell_failed_at_once_is_recorded_and_created_again(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    """The answer lost (a killed worker, a dropped connection) and the shell already
    `creation_failed` when the family is read: it is ours, on record, dropped."""
    gateway.creates = ["lost"]
    gateway.new_statuses = ["creation_failed"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    first = service.run_hop(attempt_id, 0)
    [shell] = gateway.children(PARENT, TITLE)
    gateway.new_statuses = ["created"]
    clock.advance(30)
    created = service.run_hop(attempt_id, first.next_hop or 1)
    clock.advance(5)
    second = service.run_hop(attempt_id, created.next_hop or 2)

    attempt = service.attempt(attempt_id)
    assert first.outcome is Outcome.SCHEDULED
    assert first.workspace_id is None  # the lost create's shell, found and dropped
    assert created.outcome is Outcome.SCHEDULED
    assert second.outcome is Outcome.PROMOTED
    assert attempt.created_ids[0] == shell.id
    assert attempt.candidate_id != shell.id
    assert gateway.calls["create_child"] == 2


def test_a_lost_create_whose_shell_failed_for_good_fails_the_attempt_on_record(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    gateway.creates = ["lost"]
    gateway.new_statuses = ["failed"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    outcome = service.run_hop(attempt_id, 0)

    attempt = service.attempt(attempt_id)
    [shell] = gateway.children(PARENT, TITLE)
    assert outcome.outcome is Outcome.FAILED
    assert attempt.failure_reason is FailureReason.TERMINAL_STATUS
    assert attempt.created_ids == (shell.id,)
    assert gateway.calls["create_child"] == 1  # a new create is not safe after `failed`


def test_shells_beside_the_live_workspace_a_lost_create_made_are_owed_a_release(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    """An earlier create was given up; a shell that failed appears beside the live
    workspace the next create's lost answer made: the live one is taken, the shell
    (the earlier create's, for all we can tell) goes on record as a surplus."""
    made: list[str] = []
    create_child = gateway.create_child

    def create_with_a_shell(parent_id: str, title: str) -> str:
        if gateway.calls["create_child"] == 1:  # the second create
            made.append(gateway.add(parent_id, title, "creation_failed"))
        return create_child(parent_id, title)

    gateway.create_child = create_with_a_shell  # type: ignore[method-assign]
    gateway.creates = ["none", "lost"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    service.run_hop(attempt_id, 0)
    clock.advance(61)  # past the grace: the first create is given up

    outcome = service.run_hop(attempt_id, 1)

    attempt = service.attempt(attempt_id)
    [shell] = made
    assert outcome.outcome is Outcome.PROMOTED
    assert attempt.create_lost
    assert attempt.candidate_id not in (None, shell)
    assert set(attempt.created_ids) == {attempt.candidate_id, shell}
    assert attempt.owed_releases == (shell,)
    service.release(attempt_id)  # as the reconciler's scan of owed releases does
    assert service.attempt(attempt_id).released_ids == (shell,)


def test_one_create_is_credited_with_one_workspace_only(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    """A create that timed out, then someone else's live workspace and a shell of the
    same title appear: one create made at most one of them, so the live one is taken
    (the contract cannot tell it apart) and the shell is not put on record."""
    gateway.creates = ["none"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    service.run_hop(attempt_id, 0)
    live = gateway.add(PARENT, TITLE, "created")
    shell = gateway.add(PARENT, TITLE, "creation_failed")
    clock.advance(5)

    outcome = service.run_hop(attempt_id, 1)

    attempt = service.attempt(attempt_id)
    assert outcome.outcome is Outcome.PROMOTED
    assert attempt.created_ids == (live,)
    assert shell not in attempt.created_ids


def test_an_earlier_creates_shell_does_not_end_the_wait_for_the_create_in_flight(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    """A create given up, then another sent: a shell that turns up meanwhile may be
    the first one's. Taking it would end the wait for the second and, once dropped,
    send a third create while the second may still appear."""
    gateway.creates = ["none", "none"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    service.run_hop(attempt_id, 0)
    clock.advance(61)  # the first create is given up; the second is sent
    second = service.run_hop(attempt_id, 1)
    shell = gateway.add(PARENT, TITLE, "creation_failed")  # the first one's, late
    clock.advance(5)

    waiting = service.run_hop(attempt_id, second.next_hop or 2)
    live = gateway.add(PARENT, TITLE, "created")  # the second one's, late
    clock.advance(5)
    found = service.run_hop(attempt_id, waiting.next_hop or 3)

    assert waiting.outcome is Outcome.SCHEDULED
    assert waiting.detail == "create unconfirmed; not in the family yet"
    assert found.outcome is Outcome.PROMOTED
    assert found.workspace_id == live
    attempt = service.attempt(attempt_id)
    assert set(attempt.created_ids) == {live, shell}
    assert attempt.owed_releases == (shell,)
    assert gateway.calls["create_child"] == 2


def test_a_failure_that_loses_its_save_to_a_cancel_says_what_it_observed(
    service: ProvisioningService, gateway: MemoryGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway reports the workspace failed; the brand is deactivated before the
    failure is saved: the hop stands down, and its line names the status it saw."""
    gateway.new_statuses = ["failed"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    gateway.hooks["status"] = [lambda: service.deactivate("b1")]
    assert service.run_hop(attempt_id, 0).outcome is Outcome.SCHEDULED  # created, not polled
    assert len(gateway.hooks["status"]) == 1

    with caplog.at_level(logging.INFO, logger="provisioner.engine"):
        outcome = service.run_hop(attempt_id, 1)

    assert outcome.outcome is Outcome.STOOD_DOWN
    lines = [r.getMessage() for r in caplog.records if "stood down after a race" in r.getMessage()]
    assert len(lines) == 1
    assert "cancelled" in lines[0]
    assert "failing terminal_status" in lines[0]
    assert "'failed'" in lines[0]
