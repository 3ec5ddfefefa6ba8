"""Two budgets: hops the gateway did not answer are deferred, never spend the settle
budget, and go on until the attempt's deadline; a hop that keeps raising a bug
fails `internal_error`. Against the in-memory gateway and event store."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from domain.attempt import ProvisioningAttempt
from domain.hop import CREATED_WAIT
from domain.outcomes import Outcome
from domain.policies import AttemptState, FailureReason
from domain.ports import AmbiguousCreate, TransientGatewayError
from domain.waits import Deferral
from infrastructure.broker.topology import wait_rung_ms
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.views.audit import attempt_story
from tests.memory_gateway import PARENT, MemoryGateway
from tests.support import ManualClock, as_stored_before

TITLE = "Acme"
DEADLINE_S = 3600.0


@pytest.fixture
def settings(settings: EngineSettings) -> EngineSettings:
    """The unit tests' settle budget, with deferrals of 2 s doubling to 30 s until an
    hour is up."""
    deferral = Deferral(2.0, max_s=30.0, deadline_s=DEADLINE_S, retry_after_max_s=300.0)
    return replace(settings, deferral=deferral)


@pytest.fixture
def jitter() -> Callable[[], float]:
    """Every deferred hop at the middle of its spread: waits the tests can name."""
    return lambda: 0.5


def down(gateway: MemoryGateway, call: str, times: int, **kw: Any) -> None:
    gateway.fail[call] = [TransientGatewayError(f"{call}: HTTP 503", **kw) for _ in range(times)]


def test_an_outage_longer_than_the_settle_budget_does_not_fail_the_attempt(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    gateway.new_statuses = ["not ready", "not ready", "ready"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    down(gateway, "family", 20)  # far more hops than the settle budget (3)

    outcomes = []
    for hop in range(20):
        outcomes.append(service.run_hop(attempt_id, hop))
        clock.advance(outcomes[-1].delay_s or 0)
    attempt = service.attempt(attempt_id)

    assert {o.outcome for o in outcomes} == {Outcome.DEFERRED}
    assert attempt.state is AttemptState.PENDING
    assert (attempt.deferrals, attempt.deferred_in_row, attempt.settle_hops) == (20, 20, 0)
    # The gateway is back: the whole settle budget is still there. Hop 20 creates and
    # waits for the first poll (spending none), two "not ready" spend two of the three.
    results = []
    for hop in range(20, 26):
        results.append(service.run_hop(attempt_id, hop))
        clock.advance(results[-1].delay_s or 0)
        if results[-1].outcome is Outcome.PROMOTED:
            break
    assert [r.outcome for r in results] == [Outcome.SCHEDULED] * 3 + [Outcome.PROMOTED]
    attempt = service.attempt(attempt_id)
    assert (attempt.deferred_in_row, attempt.settle_hops) == (0, 2)


def test_a_deferral_waits_out_the_retry_after_and_a_capped_jittered_backoff(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    down(gateway, "family", 1, retry_after_s=40.0)
    down(gateway, "create_child", 8)

    first = service.run_hop(attempt_id, 0)
    delays = [first.delay_s]
    for hop in range(1, 9):
        outcome = service.run_hop(attempt_id, hop)
        assert outcome.outcome is Outcome.DEFERRED, outcome
        delays.append(outcome.delay_s)

    # The gateway said when: its Retry-After, jittered up to a second more (at 0.5:
    # half a second), not the backoff.
    assert delays[0] == 40.5
    # The family answers each time, only the create does not: the gateway is up, so
    # the backoff does not grow (the first step, at 0.75 of 2 s: the jitter given).
    assert delays[1:] == [1.5] * 8
    # A create refused (never sent) made nothing: nothing to look for, or owe.
    attempt = service.attempt(attempt_id)
    assert not attempt.create_unresolved
    assert not attempt.orphan_search
    assert gateway.made == []


def test_deferral_ends_at_the_deadline_naming_since_when(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    down(gateway, "family", 10_000)
    hop, outcome = 0, service.run_hop(attempt_id, 0)
    while outcome.outcome is Outcome.DEFERRED:
        clock.advance(outcome.delay_s or 0)
        hop += 1
        outcome = service.run_hop(attempt_id, hop)
    attempt = service.attempt(attempt_id)

    assert outcome.outcome is Outcome.FAILED
    assert attempt.failure_reason is FailureReason.DEADLINE
    assert "no answer from the gateway since" in attempt.last_status
    age = clock.now() - attempt.created_on
    assert timedelta(seconds=DEADLINE_S) <= age < timedelta(seconds=DEADLINE_S + 1)
    # Bounded by the deadline over the cap: 3600 s / 22.5 s, plus the ramp.
    assert 150 <= attempt.deferrals <= 170


def test_a_hop_that_raises_a_bug_on_every_retry_fails_internal_error(
    service: ProvisioningService,
) -> None:
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    assert not service.fail_internal(attempt_id, 3, "KeyError")  # not the hop it expects
    assert service.fail_internal(attempt_id, 0, "KeyError")
    assert not service.fail_internal(attempt_id, 0, "KeyError")  # already ended
    attempt = service.attempt(attempt_id)

    assert attempt.failure_reason is FailureReason.INTERNAL_ERROR
    assert attempt.last_status == "hop 0 raised KeyError on every retry"


def test_a_log_written_before_deferrals_still_loads(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    attempt = ProvisioningAttempt.start("b1", TITLE, PARENT, None, max_hop=3)
    attempt.schedule_hop(1, clock.now(), "not ready")
    attempt.schedule_hop(2, clock.now(), "not ready")
    app = service.app
    old = [as_stored_before(app.mapper.to_stored_event(e), "deferred")
           for e in attempt.collect_events()]  # fmt: skip
    assert all(b"deferred" not in s.state for s in old)
    app.recorder.insert_events(old)

    loaded = service.attempt(attempt.id)

    # Every hop scheduled before deferrals existed was a settle wait.
    assert (loaded.settle_hops, loaded.deferrals, loaded.expected_hop) == (2, 0, 2)
    loaded.schedule_hop(3, clock.now(), "not ready")
    with pytest.raises(Exception, match="cannot schedule hop 4"):
        loaded.schedule_hop(4, clock.now(), "not ready")  # the settle budget is spent
    loaded.schedule_hop(4, clock.now(), "gateway unavailable", deferred=True)  # a deferral is not


def test_the_audit_folds_deferrals_in_a_row_into_one_entry(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    gateway.new_statuses = ["not ready", "ready"]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    down(gateway, "family", 7)
    hop = 0
    while (outcome := service.run_hop(attempt_id, hop)).next_hop is not None:
        clock.advance(outcome.delay_s or 0)
        hop = outcome.next_hop

    story = attempt_story(service, attempt_id)

    rows = [(e["type"], e["deferred"]) for e in story["events"]]
    assert rows == [("Started", 0), ("HopScheduled", 7), ("CreateRequested", 0),
                    ("CandidateAccepted", 0), ("HopScheduled", 0), ("HopScheduled", 0),
                    ("Promoted", 0)]  # fmt: skip
    folded = story["events"][1]
    assert folded["reason"].startswith("deferred ×7: gateway unavailable: family: HTTP 503 since ")
    assert folded["hop"] == 7
    assert folded["until"] > folded["at"]
    assert set(folded) == set(story["events"][0]) | {"until"}  # one shape, `spent` False
    assert folded["spent"] is False
    # The waits after the create are not deferrals, and not folded: the first poll's
    # (which spends no settle budget), then the one "not ready" (which spends one).
    waits = [e["reason"] for e in story["events"][4:6]]
    assert waits == [CREATED_WAIT, "not ready"]
    assert [e["spent"] for e in story["events"][4:6]] == [False, True]  # the strip draws this
    assert story["events"][0]["spent"] is None  # no wait
    assert (story["settle_hops"], story["max_hop"], story["deferrals"]) == (1, 3, 7)


def _deferred_delays(
    service: ProvisioningService,
    clock: ManualClock,
    attempt_id: Any,
    hops: range,
    before: Callable[[], None] = lambda: None,
) -> list[float | None]:
    """Run `hops`, each deferred (after `before`), the clock advanced by each delay:
    the delays."""
    delays = []
    for hop in hops:
        before()
        outcome = service.run_hop(attempt_id, hop)
        assert outcome.outcome is Outcome.DEFERRED, outcome
        delays.append(outcome.delay_s)
        clock.advance(outcome.delay_s or 0)
    return delays


def _deferred_through(service: ProvisioningService, clock: ManualClock, attempt_id: Any,
                      first: Any) -> tuple[int, Any]:  # fmt: skip
    """Run the hops after `first` while they are deferred; the next hop and the outcome
    of the first hop the gateway answered."""
    hop, outcome = 1, first
    while True:
        clock.advance(outcome.delay_s or 0)
        outcome = service.run_hop(attempt_id, hop)
        hop += 1
        if outcome.outcome is not Outcome.DEFERRED:
            return hop, outcome


def test_an_unconfirmed_create_gets_its_grace_again_after_an_outage(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    """The family could not be listed during the outage, so it could not show the
    create: the grace restarts when the gateway answers, and no title is made twice."""
    gateway.creates = ["late"]  # made, but the create timed out and it is not listed yet
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    first = service.run_hop(attempt_id, 0)
    assert first.detail == "create unconfirmed; not in the family yet"
    down(gateway, "family", 12)  # the gateway is down for minutes: far past the grace
    hop, outcome = _deferred_through(service, clock, attempt_id, first)
    assert service.attempt(attempt_id).deferrals == 12

    # Back, and still not listed: within its new grace the create may yet appear.
    assert outcome.outcome is Outcome.SCHEDULED
    assert outcome.detail == "create unconfirmed; not in the family yet"
    gateway.reveal()
    clock.advance(outcome.delay_s or 0)
    assert service.run_hop(attempt_id, hop).outcome is Outcome.PROMOTED
    assert gateway.calls["create_child"] == 1


@pytest.mark.parametrize(("outage", "waits"), [(12, False), (2, True)])
def test_a_create_the_gateway_answered_keeps_its_grace_from_the_create(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock,
    outage: int, waits: bool,
) -> None:  # fmt: skip
    """A 503 to the create: the gateway is done with it, so whatever it made shows
    within the grace of the create. After an outage longer than the grace it creates
    again as soon as the family answers; after a shorter one it waits the rest."""
    gateway.creates = [AmbiguousCreate("create_child: outcome unknown (HTTP 503)", answered=True)]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    first = service.run_hop(attempt_id, 0)
    assert first.detail == "create unconfirmed; not in the family yet"
    down(gateway, "family", outage)  # 12 deferrals: minutes; 2: 6 s, within the grace
    hop, outcome = _deferred_through(service, clock, attempt_id, first)

    story = attempt_story(service, attempt_id)
    unconfirmed = [e for e in story["events"] if e["type"] == "CreateUnconfirmed"]
    assert [e["message"] for e in unconfirmed] == ["create_child: outcome unknown (HTTP 503)"]
    if waits:
        assert outcome.detail == "create unconfirmed; not in the family yet"
        assert gateway.calls["create_child"] == 1
        while gateway.calls["create_child"] == 1:
            clock.advance(outcome.delay_s or 0)
            outcome = service.run_hop(attempt_id, hop)
            hop += 1
        assert clock.now() - service.attempt(attempt_id).created_on >= timedelta(seconds=60)
    assert gateway.calls["create_child"] == 2  # created again: the first made nothing
    while outcome.next_hop is not None:
        clock.advance(outcome.delay_s or 0)
        outcome = service.run_hop(attempt_id, outcome.next_hop)
    assert outcome.outcome is Outcome.PROMOTED
    assert len(gateway.made) == 1


def test_a_create_left_unanswered_by_a_proxy_gets_its_grace_again_after_an_outage(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    """A 504 from a proxy in front of the gateway: the gateway may still hold the
    request, as after a timeout, so the grace restarts when the family answers."""
    gateway.creates = [AmbiguousCreate("create_child: outcome unknown (HTTP 504)")]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    first = service.run_hop(attempt_id, 0)
    down(gateway, "family", 12)
    _, outcome = _deferred_through(service, clock, attempt_id, first)

    assert outcome.detail == "create unconfirmed; not in the family yet"
    assert gateway.calls["create_child"] == 1


def test_a_hop_held_for_the_fleets_turn_waits_that_long_not_a_growing_backoff(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    """The pace held the call for its turn (the rate, a shared Retry-After): the
    gateway is answering, so six holds in a row each wait about their turn (up to a
    quarter more), where six outage deferrals climb to the 30 s cap."""
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    gateway.fail["family"] = [
        TransientGatewayError("family: not sent (paced at 20 calls/s)", retry_after_s=3.0,
                              paced=True)
        for _ in range(6)
    ]  # fmt: skip
    assert deferrals(service, clock, attempt_id) == [3.375] * 6  # 3 s, a quarter x 0.5

    outage = service.request_provisioning("b2", "Other", PARENT)
    down(gateway, "family", 6)
    doubling = [1.5, 3.0, 6.0, 12.0, 22.5, 22.5]  # 2 s doubling to 30, the jitter at 0.75
    assert deferrals(service, clock, outage) == doubling


def deferrals(service: ProvisioningService, clock: ManualClock, attempt_id: Any) -> list[float]:
    """Run an attempt's hops from the first while they are deferred: their delays."""
    delays: list[float] = []
    hop, outcome = 0, service.run_hop(attempt_id, 0)
    while outcome.outcome is Outcome.DEFERRED:
        delays.append(outcome.delay_s or 0.0)
        clock.advance(outcome.delay_s or 0)
        hop += 1
        outcome = service.run_hop(attempt_id, hop)
    return delays


def test_jittered_delays_share_a_bounded_set_of_wait_queues_and_never_run_early() -> None:
    delays = [n / 1000 for n in range(0, 3_600_000, 7)]  # every 7 ms up to an hour
    rungs = {wait_rung_ms(d) for d in delays}

    assert len(rungs) <= 70  # one RabbitMQ wait queue per rung
    assert all(wait_rung_ms(d) >= d * 1000 - 1 for d in delays)
    assert [wait_rung_ms(d) for d in (0.5, 1.0, 1.125, 1.6, 4.2, 4.9995, 5.0, 22.4, 3600.0)] == [
        500,
        1000,  # a Retry-After of 1 s, waited as told: its own rung, not the next
        1250,  # a quarter-second rung past 1 s: not kept 2 s
        1750,
        4500,
        5000,
        5000,
        25000,
        3600000,
    ]


def test_a_create_throttled_after_the_family_answered_starts_the_backoff_again(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    down(gateway, "family", 4)  # held four times: the backoff grows
    hop, outcome = 0, service.run_hop(attempt_id, 0)
    while gateway.fail["family"]:
        clock.advance(outcome.delay_s or 0)
        hop += 1
        outcome = service.run_hop(attempt_id, hop)
    assert outcome.delay_s == 12.0  # 2 s doubling, the jitter at 0.75
    gateway.creates = [TransientGatewayError("create: throttled (HTTP 429)", retry_after_s=1.0)]
    clock.advance(outcome.delay_s or 0)

    throttled = service.run_hop(attempt_id, hop + 1)  # the family answers, the create is 429'd

    assert throttled.outcome is Outcome.DEFERRED
    # Not 22.5: the gateway is up, only busy, so the backoff starts again (1.5: its first
    # step at 0.75). Not the Retry-After as given: four deferrals came before it in a row.
    assert throttled.delay_s == 1.5


def test_deferrals_written_before_spent_existed_still_load_as_spending_nothing(
    service: ProvisioningService, clock: ManualClock
) -> None:
    attempt = ProvisioningAttempt.start("b1", TITLE, PARENT, None, max_hop=3)
    attempt.schedule_hop(1, clock.now(), "not ready")
    attempt.schedule_hop(2, clock.now(), "gateway unavailable", deferred=True)
    app = service.app
    stored = [app.mapper.to_stored_event(e) for e in attempt.collect_events()]
    app.recorder.insert_events([as_stored_before(s, "spent", "paced", version=2) for s in stored])

    loaded = service.attempt(attempt.id)

    assert (loaded.settle_hops, loaded.deferrals, loaded.expected_hop) == (1, 1, 2)


def test_a_retry_after_is_waited_as_given_twice_in_a_row_then_backs_off(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    """A stray 429 costs its own retry: a call told when to come back waits just that,
    unless it is told so again and again."""
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    down(gateway, "family", 4, retry_after_s=1.0)
    delays = _deferred_delays(service, clock, attempt_id, range(4))
    # 1 s as told twice (no spread within its first second); then the doubling
    # backoff from its third step (8 s at 0.75), as for a gateway that does not answer.
    assert delays == [1.0, 1.0, 6.0, 12.0]


def test_a_create_throttled_again_and_again_is_not_asked_every_second(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    """The family answers each hop, the create is 429'd each time with a short
    Retry-After: waited as told twice, then the backoff's first step (the gateway is
    up), never a sub-second loop."""
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    throttled = TransientGatewayError("create: throttled (HTTP 429)", retry_after_s=0.3)

    def throttle() -> None:
        gateway.creates = [throttled]

    delays = _deferred_delays(service, clock, attempt_id, range(4), throttle)
    # 0.3 s told, but at least 1 s (half the 2 s first step); then 1.5.
    assert delays == [1.0, 1.0, 1.5, 1.5]


def test_a_stray_429_after_the_fleets_turns_waits_its_retry_after_not_a_backoff(
    service: ProvisioningService, gateway: MemoryGateway, clock: ManualClock
) -> None:
    """Held five times for the fleet's turn, then told by a 429 to come back in 1 s:
    the holds did not ask the gateway, so the 429 is the first unanswered deferral in
    a row and is waited as told (where five outage deferrals before it would have
    brought the 30 s cap)."""
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    paced = TransientGatewayError("family: not sent (paced at 10 calls/s)", retry_after_s=2.0,
                                  paced=True)  # fmt: skip
    throttled = TransientGatewayError("family: throttled (HTTP 429)", retry_after_s=1.0)
    gateway.fail["family"] = [paced] * 5 + [throttled, throttled, throttled]
    delays = _deferred_delays(service, clock, attempt_id, range(8))
    # 2 s and a quarter x 0.5 five times; the 429 twice as told (1 s), then the
    # backoff's third step (8 s at 0.75).
    assert delays == [2.25] * 5 + [1.0, 1.0, 6.0]
    attempt = service.attempt(attempt_id)
    assert (attempt.deferrals, attempt.unanswered_in_row) == (8, 3)
    # The family answers at last: the hop creates, and its wait for the first poll
    # ends the run of deferrals.
    assert service.run_hop(attempt_id, 8).outcome is Outcome.SCHEDULED
    assert service.attempt(attempt_id).unanswered_in_row == 0


def test_deferrals_written_before_paced_existed_load_as_the_gateways(
    service: ProvisioningService, clock: ManualClock
) -> None:
    attempt = ProvisioningAttempt.start("b1", TITLE, PARENT, None, max_hop=3)
    attempt.schedule_hop(1, clock.now(), "gateway unavailable", deferred=True, paced=True)
    attempt.schedule_hop(2, clock.now(), "gateway unavailable", deferred=True)
    app = service.app
    stored = [app.mapper.to_stored_event(e) for e in attempt.collect_events()]
    app.recorder.insert_events([as_stored_before(s, "paced", version=3) for s in stored])

    loaded = service.attempt(attempt.id)

    assert (loaded.deferred_in_row, loaded.unanswered_in_row) == (2, 2)
    assert attempt.unanswered_in_row == 1  # as written now: the fleet's turn not counted
