from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from eventsourcing.application import Application

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.claim import WorkspaceClaim
from domain.errors import AlreadyClaimed, BrandDeactivated, CommandRefused
from domain.ids import brand_aggregate_id
from domain.policies import AttemptState, FailureReason, Provenance
from domain.stored import safe_message

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def attempt(existing: str | None = None) -> ProvisioningAttempt:
    return ProvisioningAttempt.start("b1", "Acme", "parent", existing, max_hop=5)


def test_brand_ids_are_deterministic_so_registering_twice_conflicts() -> None:
    app = Application[object](env={"PERSISTENCE_MODULE": "eventsourcing.popo"})
    app.save(Brand.register("b1", "Acme", "parent"))
    from eventsourcing.persistence import IntegrityError

    with pytest.raises(IntegrityError):
        app.save(Brand.register("b1", "Acme", "parent"))
    assert Brand.register("b1", "x", "y").id == brand_aggregate_id("b1")


def test_a_created_candidate_that_ends_unpromoted_owes_a_release_once() -> None:
    a = attempt()
    a.request_create(0, [], a.created_on)
    a.accept_candidate("w1", Provenance.CREATED, 0)
    assert not a.release_owed
    a.fail(FailureReason.EXHAUSTED, "no luck", 5)
    assert a.release_owed
    a.record_release("w1", 0)
    assert not a.release_owed
    a.record_release("w1", 0)  # idempotent
    assert [type(e).__name__ for e in a.pending_events].count("CandidateReleased") == 1


@pytest.mark.parametrize("provenance", [Provenance.ADOPTED])
def test_adopted_candidates_never_owe_a_release(provenance: Provenance) -> None:
    a = attempt()
    a.accept_candidate("w1", provenance, 0)
    a.cancel("brand deactivated")
    assert not a.release_owed
    with pytest.raises(CommandRefused):
        a.record_release("w1", 0)


def test_existing_candidates_never_owe_a_release() -> None:
    a = attempt(existing="w0")
    assert a.provenance is Provenance.EXISTING
    a.supersede(uuid4())
    assert not a.release_owed


def test_promoted_and_terminal_status_candidates_owe_nothing() -> None:
    promoted = attempt()
    promoted.accept_candidate("w1", Provenance.CREATED, 0)
    promoted.promote(0)
    assert not promoted.release_owed
    terminal = attempt()
    terminal.accept_candidate("w2", Provenance.CREATED, 0)
    terminal.fail(FailureReason.TERMINAL_STATUS, "creation_failed", 0)
    assert not terminal.release_owed


def test_an_ended_attempt_refuses_new_decisions_but_records_what_it_created() -> None:
    a = attempt()
    a.request_create(0, [], a.created_on)
    a.supersede(uuid4())
    with pytest.raises(CommandRefused):
        a.accept_candidate("w1", Provenance.ADOPTED, 0)
    with pytest.raises(CommandRefused):
        a.schedule_hop(1, a.created_on, "x")
    a.record_created("w1", 0)
    assert a.state is AttemptState.SUPERSEDED
    assert a.release_owed


def test_the_parent_is_never_a_candidate() -> None:
    a = attempt()
    with pytest.raises(CommandRefused):
        a.accept_candidate("parent", Provenance.ADOPTED, 0)
    with pytest.raises(CommandRefused):
        a.record_created("parent", 0)


def test_hops_are_scheduled_in_order_within_the_budget() -> None:
    a = attempt()
    with pytest.raises(CommandRefused):
        a.schedule_hop(2, a.created_on, "x")
    for hop in range(1, 6):
        a.schedule_hop(hop, a.created_on, "not ready")
    with pytest.raises(CommandRefused):
        a.schedule_hop(6, a.created_on, "not ready")


def test_stored_messages_are_one_bounded_line() -> None:
    assert safe_message("a\nb\t c") == "a b c"
    assert len(safe_message("x" * 1000)) == 300


def test_a_claim_belongs_to_one_brand_at_a_time() -> None:
    claim = WorkspaceClaim.open("w1")
    claim.claim("b1", uuid4())
    claim.claim("b1", uuid4())  # the same brand may claim again
    with pytest.raises(AlreadyClaimed):
        claim.claim("b2", uuid4())
    claim.release("done")
    claim.claim("b2", uuid4())
    assert claim.brand_id == "b2"


def test_a_deactivated_brand_refuses_attempts_and_bindings() -> None:
    brand = Brand.register("b1", "Acme", "parent")
    attempt_id = uuid4()
    brand.begin_attempt(attempt_id, "Acme", "parent", at(1))
    brand.deactivate(at(2))
    with pytest.raises(BrandDeactivated):
        brand.begin_attempt(uuid4(), "Acme", "parent", at(3))
    with pytest.raises(BrandDeactivated):
        brand.bind("w1", attempt_id)
    brand.reactivate()
    brand.bind("w1", attempt_id)
    assert brand.workspace_id == "w1"


def test_a_brand_binds_only_its_current_attempts_workspace_never_the_parent() -> None:
    brand = Brand.register("b1", "Acme", "parent")
    attempt_id = uuid4()
    brand.begin_attempt(attempt_id, "Acme", "parent", at(1))
    with pytest.raises(CommandRefused):
        brand.bind("w1", uuid4())
    with pytest.raises(CommandRefused):
        brand.bind("parent", attempt_id)
