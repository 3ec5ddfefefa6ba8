"""The order of a brand's commands: whatever order `provision` and `deactivate` run
in, the brand ends as the one with the newest `requested_at` says. In memory: the
request path never calls the gateway."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from itertools import permutations
from typing import Any
from uuid import uuid4

import pytest

from domain.attempt import ProvisioningAttempt
from domain.brand import ACTIVE, DEACTIVATED, Brand
from domain.errors import AttemptInProgress, RetryLater, StaleCommand
from domain.outcomes import Outcome
from domain.policies import AttemptState
from domain.releases import DecommissionKind
from domain.waits import WAIT_DELAYS_S
from infrastructure.broker import messages
from infrastructure.broker.outbox import OutboxMapper
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from tests.memory_gateway import MemoryGateway
from tests.support import (
    FakeMessage,
    ManualClock,
    RecordingBroker,
    as_stored_before,
    drive,
    finished,
    new_service,
    settler,
)
from worker.reading import Delivery

T0 = datetime(2020, 1, 1, tzinfo=UTC)
P, D = "provision", "deactivate"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# A command: (kind, its time in seconds[, title[, parent]]); a provision's title
# defaults to "Acme" and its parent to "parent".
Command = tuple[Any, ...]


def run(service: ProvisioningService, brand_id: str, command: Command) -> str:
    """Run one command as the consumer does; say what happened."""
    kind, seconds, title, parent = (*command, "Acme", "parent")[:4]
    try:
        if kind == P:
            service.request_provisioning(brand_id, title, parent, at(seconds))
        else:
            service.deactivate(brand_id, at(seconds))
    except StaleCommand:
        return "ignored"
    except AttemptInProgress:
        return "in progress"
    return "applied"


def winner(commands: tuple[Command, ...]) -> Command:
    """The producer's last command: the newest; at a tie a deactivate, else the
    provision with the greatest (title, parent)."""

    def rank(command: Command) -> tuple[Any, ...]:
        kind, seconds, title, parent = (*command, "Acme", "parent")[:4]
        return (seconds, kind == D, title, parent)

    return max(commands, key=rank)


# Each: the commands a producer sent; a repeated entry is a redelivery.
SEQUENCES: list[list[Command]] = [
    [(P, 1), (D, 2)],
    [(D, 1), (P, 2)],
    [(P, 1), (D, 2), (P, 3)],
    [(D, 1), (P, 2), (D, 3)],
    [(P, 1), (P, 2), (D, 3)],
    [(P, 1), (D, 2), (P, 3), (D, 4)],
    [(D, 1), (P, 2), (D, 3), (P, 4)],
    [(P, 1), (P, 1), (D, 2)],  # the provision redelivered
    [(P, 1), (D, 2), (D, 2)],  # the deactivate redelivered
    # Another title or parent while an attempt is pending: the newer one wins.
    [(P, 1, "A"), (D, 2), (P, 3, "B")],
    [(P, 1, "A"), (P, 2, "B"), (D, 3)],
    [(P, 1, "A"), (P, 2, "B")],
    [(P, 1, "A"), (P, 2, "B"), (P, 3, "A")],
    [(P, 1, "A"), (D, 2), (P, 3, "A", "other parent")],
    [(D, 1), (P, 2, "A"), (P, 3, "B", "other parent")],
    # Ties (timestamps of one second): a deactivate wins; the same command again is
    # a redelivery; of two provisions, the greater (title, parent).
    [(P, 1), (D, 1)],
    [(P, 1), (D, 1), (D, 1)],
    [(P, 1), (P, 1), (D, 1)],
    [(P, 1, "A"), (D, 1), (P, 2, "B")],
    [(D, 1), (P, 2), (D, 2)],
    [(P, 1, "A"), (P, 1, "B")],
    [(P, 1, "A"), (P, 1, "A", "other parent"), (D, 1)],
    [(D, 1), (P, 2, "A"), (P, 2, "B")],
]
CASES = [
    pytest.param(order, id="-".join(f"{c[0][0]}{c[1]}{''.join(c[2:])}" for c in order))
    for sequence in SEQUENCES
    for order in sorted(set(permutations(sequence)))
]


@pytest.mark.parametrize("order", CASES)
def test_every_order_ends_as_the_newest_command_says(order: tuple[Command, ...]) -> None:
    service = new_service()
    brand_id = f"b-{uuid4().hex[:8]}"

    for command in order:
        run(service, brand_id, command)

    last_kind, last_time, title, parent = (*winner(order), "Acme", "parent")[:4]
    brand = service.brand(brand_id)
    assert brand.last_command_at == at(last_time)
    assert brand.last_command_kind == last_kind
    current = service.attempt(brand.current_attempt_id) if brand.current_attempt_id else None
    if last_kind == P:
        assert brand.lifecycle == ACTIVE
        assert current is not None
        assert not current.is_terminal  # an attempt is on its way
        assert (current.title, current.parent_workspace_id) == (title, parent)
    else:
        assert brand.lifecycle == DEACTIVATED
        assert current is None or current.is_terminal


def test_a_newer_provision_for_another_title_supersedes_the_pending_attempt() -> None:
    service = new_service()
    first = service.request_provisioning("b1", "A", "parent", at(1))
    service.deactivate("b1", at(2))
    second = service.request_provisioning("b1", "B", "parent", at(3))
    # The reverse run (P1, P3, D2): the newer provision's time is on record.
    other = new_service()
    pending = other.request_provisioning("b1", "A", "parent", at(1))

    superseding = other.request_provisioning("b1", "B", "parent", at(3))
    with pytest.raises(StaleCommand):
        other.deactivate("b1", at(2))

    assert other.attempt(pending).state is AttemptState.SUPERSEDED
    assert other.attempt(superseding).state is AttemptState.PENDING
    for svc, attempt_id in ((service, second), (other, superseding)):
        brand = svc.brand("b1")
        assert (brand.lifecycle, brand.title, brand.current_attempt_id) == (
            ACTIVE,
            "B",
            attempt_id,
        )
    assert service.attempt(first).state is AttemptState.CANCELLED


def test_a_newer_provision_for_the_same_title_is_served_by_the_pending_attempt() -> None:
    service = new_service()
    first = service.request_provisioning("b1", "A", "parent", at(1))

    with pytest.raises(AttemptInProgress, match=str(first)):
        service.request_provisioning("b1", "A", "parent", at(3))
    with pytest.raises(StaleCommand):
        service.deactivate("b1", at(2))

    assert service.brand("b1").current_attempt_id == first
    assert service.attempt(first).state is AttemptState.PENDING


def _bound(service: ProvisioningService, brand_id: str, parent: str) -> None:
    """The brand provisioned at 1 s under `parent` and bound to its workspace."""
    attempt_id = service.request_provisioning(brand_id, "Acme", parent, at(1))
    brand = service.brand(brand_id)
    brand.bind(f"ws-{brand_id}", attempt_id)
    service.app.save(brand)


def test_a_provision_for_a_new_parent_waits_for_the_deactivated_brands_decommission() -> None:
    service = new_service()
    _bound(service, "b1", "parent-x")
    service.deactivate("b1", at(2))

    # Deactivated, still bound, its decommission not started yet: refused for now.
    with pytest.raises(RetryLater, match="--purge-now"):
        service.request_provisioning("b1", "Acme", "parent-y", at(3))
    brand = service.brand("b1")
    brand.start_decommission()
    service.app.save(brand)
    with pytest.raises(RetryLater):
        service.request_provisioning("b1", "Acme", "parent-y", at(3))
    brand = service.brand("b1")
    brand.unbind("decommissioned")
    service.app.save(brand)

    attempt_id = service.request_provisioning("b1", "Acme", "parent-y", at(3))  # the retry

    brand = service.brand("b1")
    assert (brand.lifecycle, brand.parent_workspace_id) == (ACTIVE, "parent-y")
    assert service.attempt(attempt_id).candidate_id is None


def test_a_move_that_runs_before_the_deactivate_sent_first_waits_for_it() -> None:
    """Producer: deactivate at 2, provision under another parent at 3. The worker runs
    the provision first: refused for now (retried), never for good; once the
    deactivate and the decommission have run, the retry moves the brand."""
    service = new_service()
    _bound(service, "b1", "parent-x")

    with pytest.raises(RetryLater, match="deactivate it before moving it"):
        service.request_provisioning("b1", "Acme", "parent-y", at(3))
    service.deactivate("b1", at(2))
    brand = service.brand("b1")
    brand.start_decommission()
    brand.unbind("decommissioned")
    service.app.save(brand)
    service.request_provisioning("b1", "Acme", "parent-y", at(3))  # the retry

    brand = service.brand("b1")
    assert (brand.lifecycle, brand.parent_workspace_id) == (ACTIVE, "parent-y")


def test_a_provision_for_the_same_parent_reactivates_a_brand_still_bound() -> None:
    service = new_service()
    _bound(service, "b1", "parent-x")
    service.deactivate("b1", at(2))

    attempt_id = service.request_provisioning("b1", "Acme", "parent-x", at(3))

    assert service.brand("b1").lifecycle == ACTIVE
    assert service.attempt(attempt_id).candidate_id == "ws-b1"  # re-confirmed


def test_ties_deactivate_wins_and_the_same_command_again_is_a_redelivery() -> None:
    service = new_service()
    service.request_provisioning("b1", "Acme", "parent", at(1))

    service.deactivate("b1", at(1))  # a different command at the same time: applied
    with pytest.raises(StaleCommand, match="redelivery"):
        service.deactivate("b1", at(1))
    with pytest.raises(StaleCommand, match="tie"):
        service.request_provisioning("b1", "Acme", "parent", at(1))

    brand = service.brand("b1")
    assert (brand.lifecycle, brand.last_command_kind) == (DEACTIVATED, D)


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
    old = [as_stored_before(app.mapper.to_stored_event(e), "requested_at") for e in events]
    assert all(b"requested_at" not in s.state for s in old)
    app.recorder.insert_events(old)

    loaded = service.brand("b1")

    assert loaded.lifecycle == DEACTIVATED
    # An old event's command time is the time it was recorded; its kind, its event's.
    assert loaded.last_command_at == events[-1].timestamp
    assert loaded.last_command_kind == D
    with pytest.raises(StaleCommand):
        service.request_provisioning("b1", "Acme", "parent", events[-1].timestamp)
    service.request_provisioning("b1", "Acme", "parent")  # now: newer
    assert service.brand("b1").lifecycle == ACTIVE


def test_a_command_refused_for_now_is_retried_for_about_an_hour_on_its_own_count() -> None:
    publisher = RecordingBroker()
    settle = settler(publisher, delays=(1.0, 5.0))  # the infrastructure schedule
    body = messages.provision("b1", "Acme", "parent", at(1)).encode()
    decoded = messages.decode(body)
    refused = RetryLater("retry in a moment")
    waits = [
        FakeMessage(body, headers={"x-retries": 2, "x-waits": n}) for n in range(len(WAIT_DELAYS_S))
    ]
    last = FakeMessage(body, headers={"x-retries": 2, "x-waits": len(WAIT_DELAYS_S)})

    for n, message in enumerate(waits):  # the infrastructure retries are all used up
        settle.settle(message, Delivery(decoded, 2, n), finished(refused))
    settle.settle(last, Delivery(decoded, 2, len(WAIT_DELAYS_S)), finished(refused))

    waited = [round(sum(WAIT_DELAYS_S[: n + 1]) * 1000) for n in range(len(WAIT_DELAYS_S))]
    assert [(d, h) for _, d, h in publisher.published] == [
        (delay, {"x-retries": 2, "x-waits": n + 1, "x-waited-ms": waited[n]})
        for n, delay in enumerate(WAIT_DELAYS_S)
    ]
    assert 3000 <= sum(WAIT_DELAYS_S) <= 3600  # about an hour, as documented
    assert all(60 <= d <= 120 for d in WAIT_DELAYS_S[2:])
    assert [d[1] for d in publisher.dead] == ["retries_exhausted"]  # only after that
    assert all(m.state == "ACK" for m in (*waits, last))


def test_an_infrastructure_failure_after_waits_still_gets_its_own_retries() -> None:
    publisher = RecordingBroker()
    body = messages.provision("b1", "Acme", "parent", at(1)).encode()
    decoded = messages.decode(body)
    message = FakeMessage(body, headers={"x-waits": 7})

    settler(publisher, delays=(1.0, 5.0)).settle(
        message, Delivery(decoded, 0, 7), finished(RuntimeError("database down"))
    )

    assert [(d, h) for _, d, h in publisher.published] == [(1.0, {"x-retries": 1, "x-waits": 7})]
    read = settler(RecordingBroker()).read(message, messages.COMMANDS_QUEUE)
    assert read == Delivery(decoded, 0, 7)


# The retention window: a deactivated brand's workspace is emptied only when it ends.

WINDOW_S = 3600.0


def window_service() -> tuple[ProvisioningService, MemoryGateway, ManualClock]:
    gateway, clock = MemoryGateway("parent"), ManualClock()
    settings = EngineSettings(decommission_delay_s=WINDOW_S)
    return new_service(gateway, clock, settings), gateway, clock


def provisioned(service: ProvisioningService, gateway: MemoryGateway, brand_id: str) -> str:
    """Provisioned through the hops, bound, with two projects in its workspace."""
    attempt_id = service.request_provisioning(brand_id, "Acme", "parent")
    assert drive(service, attempt_id)[-1].outcome is Outcome.PROMOTED
    workspace_id = service.brand(brand_id).workspace_id
    assert workspace_id is not None
    gateway.workspaces[workspace_id].projects += ["p1", "p2"]
    return workspace_id


def test_a_deactivated_brand_is_emptied_only_when_its_window_ends() -> None:
    service, gateway, clock = window_service()
    workspace_id = provisioned(service, gateway, "b1")

    result = service.deactivate("b1")
    early = service.decommission("b1")  # the message, arrived early (or a stray one)
    clock.advance(WINDOW_S)
    emptied = service.decommission("b1")

    assert result.to_be_emptied_at is not None
    assert abs((result.to_be_emptied_at - clock.now()).total_seconds()) < 5  # then + window
    assert early.kind is DecommissionKind.NOT_DUE
    assert emptied.projects_deleted == 2
    assert gateway.deleted == [(workspace_id, "p1"), (workspace_id, "p2")]
    brand = service.brand("b1")
    assert (brand.lifecycle, brand.workspace_id, brand.to_be_emptied_at) == (
        DEACTIVATED,
        None,
        None,
    )


def test_a_provision_inside_the_window_reconfirms_the_workspace_and_creates_nothing() -> None:
    service, gateway, clock = window_service()
    workspace_id = provisioned(service, gateway, "b1")
    service.deactivate("b1")
    clock.advance(WINDOW_S / 2)

    attempt_id = service.request_provisioning("b1", "Acme", "parent")
    outcomes = drive(service, attempt_id)
    clock.advance(WINDOW_S)
    late = service.decommission("b1")  # the delayed message, after the reactivation

    assert outcomes[-1].outcome is Outcome.PROMOTED
    assert late.kind is DecommissionKind.NOT_DUE  # active again
    brand = service.brand("b1")
    assert (brand.lifecycle, brand.workspace_id, brand.to_be_emptied_at) == (
        ACTIVE,
        workspace_id,
        None,
    )
    assert gateway.made == [workspace_id]  # one create, ever
    assert gateway.deleted == []
    assert gateway.workspaces[workspace_id].projects == ["p1", "p2"]


def test_an_older_window_does_not_empty_a_brand_deactivated_again_since() -> None:
    service, gateway, clock = window_service()
    provisioned(service, gateway, "b1")
    service.deactivate("b1")
    clock.advance(10)
    service.request_provisioning("b1", "Acme", "parent")  # reactivated: the emptying is off
    clock.advance(10)
    service.deactivate("b1")  # a new window, 20 s after the first

    clock.advance(WINDOW_S - 15)  # past the first window's end, not the second's
    first = service.decommission("b1")
    clock.advance(30)
    second = service.decommission("b1")

    assert (first.kind, second.projects_deleted) == (DecommissionKind.NOT_DUE, 2)


def test_purge_now_empties_at_once_even_after_a_deactivation_with_a_window() -> None:
    service, gateway, _ = window_service()
    provisioned(service, gateway, "b1")
    provisioned(service, gateway, "b2")
    service.deactivate("b1", purge_now=True)
    service.deactivate("b2")
    waiting = service.decommission("b2")
    brought_forward = service.deactivate("b2", purge_now=True)

    assert service.decommission("b1").projects_deleted == 2
    assert waiting.kind is DecommissionKind.NOT_DUE
    assert brought_forward.already_deactivated
    assert service.decommission("b2").projects_deleted == 2


def test_a_later_deactivate_never_puts_the_emptying_off() -> None:
    service, gateway, clock = window_service()
    provisioned(service, gateway, "b1")
    first = service.deactivate("b1").to_be_emptied_at
    clock.advance(60)
    again = service.deactivate("b1").to_be_emptied_at

    assert first is not None
    assert again == first


@pytest.mark.parametrize(
    ("provision_s", "deactivate_s", "emptied"),
    [(3, 2, False), (2, 3, True), (2, 2, True)],  # the newest wins; a deactivate wins a tie
)
@pytest.mark.parametrize("deactivate_first", [True, False])
def test_either_order_inside_the_window_ends_as_the_newest_command_says(
    provision_s: int, deactivate_s: int, emptied: bool, deactivate_first: bool
) -> None:
    service, gateway, clock = window_service()
    base = service.clock.now()
    attempt_id = service.request_provisioning("b1", "Acme", "parent", base)
    drive(service, attempt_id)
    gateway.workspaces[service.brand("b1").workspace_id or ""].projects.append("p1")
    commands = [
        lambda: service.deactivate("b1", base + timedelta(seconds=deactivate_s)),
        lambda: service.request_provisioning(
            "b1", "Acme", "parent", base + timedelta(seconds=provision_s)
        ),
    ]
    for command in commands if deactivate_first else commands[::-1]:
        with contextlib.suppress(StaleCommand):
            command()
    current = service.brand("b1").current_attempt_id
    assert current is not None
    if not service.attempt(current).is_terminal:
        drive(service, current)
    clock.advance(WINDOW_S + 1)
    deleted = service.decommission("b1")

    brand = service.brand("b1")
    assert brand.lifecycle == (DEACTIVATED if emptied else ACTIVE)
    assert (deleted.kind is DecommissionKind.EMPTIED) is emptied
    assert deleted.projects_deleted == (1 if emptied else 0)
    assert (brand.workspace_id is None) is emptied
    assert len(gateway.made) == 1  # the reactivation re-confirmed, never created


def test_a_log_written_before_the_retention_window_empties_at_once() -> None:
    service, gateway, _ = window_service()
    app = service.app
    provisioned(service, gateway, "b1")
    brand = service.brand("b1")
    brand.deactivate(at(0) + (datetime.now(UTC) - T0))
    events = brand.collect_events()
    old = [as_stored_before(app.mapper.to_stored_event(e), "purge_at") for e in events]
    assert all(b"purge_at" not in s.state for s in old)
    app.recorder.insert_events(old)

    loaded = service.brand("b1")

    assert loaded.lifecycle == DEACTIVATED
    assert loaded.to_be_emptied_at == events[-1].timestamp  # emptied at once, as then
    assert service.decommission("b1").projects_deleted == 2


def test_the_decommission_message_is_held_back_until_the_window_ends() -> None:
    service, gateway, _ = window_service()
    provisioned(service, gateway, "b1")
    service.deactivate("b1")
    events = list(service.app.events.get(Brand.create_id("b1")))
    [deactivated] = [e for e in events if isinstance(e, Brand.Deactivated)]

    [work], _ = OutboxMapper(service.app).map(deactivated)

    assert work.message == messages.decommission("b1")
    assert WINDOW_S - 5 < work.delay_s <= WINDOW_S
