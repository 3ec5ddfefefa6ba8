"""The order of a brand's commands: whatever order `provision` and `deactivate` run
in, the brand ends as the one with the newest `requested_at` says. In memory: the
request path never calls the gateway."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from itertools import permutations
from typing import Any
from uuid import uuid4

import pytest
from eventsourcing.persistence import StoredEvent

from domain.attempt import ProvisioningAttempt
from domain.brand import ACTIVE, DEACTIVATED, Brand
from domain.errors import AttemptInProgress, RetryLater, StaleCommand
from infrastructure.eventstore import open_event_store
from infrastructure.service import ProvisioningService

T0 = datetime(2030, 1, 1, tzinfo=UTC)
P, D = "provision", "deactivate"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def new_service() -> ProvisioningService:
    return ProvisioningService(open_event_store("memory://"), gateway=None)  # type: ignore[arg-type]


def run(service: ProvisioningService, brand_id: str, command: str, seconds: float) -> str:
    """Run one command as the consumer does; say what happened."""
    try:
        if command == P:
            service.request_provisioning(brand_id, "Acme", "parent", at(seconds))
        else:
            service.deactivate(brand_id, at(seconds))
    except StaleCommand:
        return "ignored"
    except AttemptInProgress:
        return "in progress"
    return "applied"


# Each: the commands a producer sent (kind, its time); a repeated entry is a redelivery.
SEQUENCES = [
    [(P, 1), (D, 2)],
    [(D, 1), (P, 2)],
    [(P, 1), (D, 2), (P, 3)],
    [(D, 1), (P, 2), (D, 3)],
    [(P, 1), (P, 2), (D, 3)],
    [(P, 1), (D, 2), (P, 3), (D, 4)],
    [(D, 1), (P, 2), (D, 3), (P, 4)],
    [(P, 1), (P, 1), (D, 2)],  # the provision redelivered
    [(P, 1), (D, 2), (D, 2)],  # the deactivate redelivered
]
CASES = [
    pytest.param(order, id="-".join(f"{kind[0]}{t}" for kind, t in order))
    for sequence in SEQUENCES
    for order in sorted(set(permutations(sequence)))
]


@pytest.mark.parametrize("order", CASES)
def test_every_order_ends_as_the_newest_command_says(order: tuple[tuple[str, int], ...]) -> None:
    service = new_service()
    brand_id = f"b-{uuid4().hex[:8]}"

    for command, seconds in order:
        run(service, brand_id, command, seconds)

    last_kind, last_time = max(order, key=lambda c: c[1])
    brand = service.brand(brand_id)
    assert brand.last_command_at == at(last_time)
    current = service.attempt(brand.current_attempt_id) if brand.current_attempt_id else None
    if last_kind == P:
        assert brand.lifecycle == ACTIVE
        assert current is not None
        assert not current.is_terminal  # an attempt is on its way
    else:
        assert brand.lifecycle == DEACTIVATED
        assert current is None or current.is_terminal


def test_a_late_provision_is_refused_and_recorded_on_the_brand() -> None:
    service = new_service()
    service.request_provisioning("b1", "Acme", "parent", at(1))
    service.deactivate("b1", at(3))

    with pytest.raises(StaleCommand, match="older than"):
        service.request_provisioning("b1", "Acme", "parent", at(2))
    with pytest.raises(StaleCommand, match="redelivery"):
        service.deactivate("b1", at(3))

    ignored = [
        e
        for e in service.app.events.get(Brand.create_id("b1"))
        if type(e).__name__ == "CommandIgnored"
    ]
    assert [(e.command, e.requested_at) for e in ignored] == [(P, at(2)), (D, at(3))]
    assert service.brand("b1").lifecycle == DEACTIVATED


def test_a_deactivate_for_a_brand_never_seen_is_a_tombstone() -> None:
    service = new_service()

    result = service.deactivate("b1", at(2))

    assert not result.already_deactivated
    brand = service.brand("b1")
    assert brand.lifecycle == DEACTIVATED
    assert brand.current_attempt_id is None
    with pytest.raises(StaleCommand):
        service.request_provisioning("b1", "Acme", "parent", at(1))
    service.request_provisioning("b1", "Acme", "parent", at(3))
    assert service.brand("b1").lifecycle == ACTIVE


def test_a_provision_while_the_workspace_is_emptied_is_refused_for_now() -> None:
    brand = Brand.register("b1", "Acme", "parent")
    attempt_id = uuid4()
    brand.begin_attempt(attempt_id, "Acme", "parent", at(1))
    brand.bind("w1", attempt_id)
    brand.deactivate(at(2))
    brand.start_decommission()

    with pytest.raises(RetryLater, match="retry in a moment"):
        brand.check_provision_possible()
    brand.unbind("decommissioned")
    brand.check_provision_possible()  # over: the retry goes through


def test_without_a_producer_time_a_command_is_ordered_after_everything_applied() -> None:
    brand = Brand.register("b1", "Acme", "parent")
    brand.begin_attempt(uuid4(), "Acme", "parent", at(10))

    assert brand.command_time(None, at(5)) > at(10)  # the handler's clock is behind
    assert brand.command_time(None, at(20)) == at(20)
    assert brand.command_time(at(3), at(20)) == at(3)  # a producer's time is kept


def _as_written_before_command_times(stored: StoredEvent) -> StoredEvent:
    state: dict[str, Any] = json.loads(stored.state)
    state.pop("requested_at", None)
    state.pop("class_version", None)
    return StoredEvent(
        stored.originator_id, stored.originator_version, stored.topic, json.dumps(state).encode()
    )


def test_a_log_written_before_commands_carried_a_time_still_loads() -> None:
    service = new_service()
    app = service.app
    brand = Brand.register("b1", "Acme", "parent")
    attempt = ProvisioningAttempt.start("b1", "Acme", "parent", None, max_hop=3)
    brand.begin_attempt(attempt.id, "Acme", "parent", at(1))
    brand.deactivate(at(2))
    attempt.cancel("brand deactivated")
    app.save(attempt)
    events = brand.collect_events()
    old = [_as_written_before_command_times(app.mapper.to_stored_event(e)) for e in events]
    assert all(b"requested_at" not in s.state for s in old)
    app.recorder.insert_events(old)

    loaded = service.brand("b1")

    assert loaded.lifecycle == DEACTIVATED
    # An old event's command time is the time it was recorded.
    assert loaded.last_command_at == events[-1].timestamp
    with pytest.raises(StaleCommand):
        service.request_provisioning("b1", "Acme", "parent", events[-1].timestamp)
    service.request_provisioning("b1", "Acme", "parent")  # now: newer
    assert service.brand("b1").lifecycle == ACTIVE
