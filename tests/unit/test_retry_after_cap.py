"""One 429 never holds the fleet for an hour: a Retry-After (seconds or an HTTP date)
holds every call for at most PROVISIONER_RETRY_AFTER_MAX_S (300 s by default), in the
fleet's pace and in a deferred hop's wait, and `health` says when a hold is longer."""

from __future__ import annotations

import httpx
import pytest

from domain.pacing import Go, Hold, PaceState, Result, admit, observe
from domain.ports import TransientGatewayError
from domain.waits import Deferral
from infrastructure.settings.model import Settings
from infrastructure.settings.parsing import SettingsError
from tests.support import ManualClock, pace_rules
from tests.unit.test_pacing import EVERY_429, Upstream, adapter
from worker.health.checks import circuit_check
from worker.health.results import Degraded

HOUR = 3600.0


@pytest.mark.parametrize(
    ("asked_s", "cap_s", "held_s", "asked_on_record"),
    [
        (0.0, 300.0, 1.0, 0.0),  # none given: still a second
        (30.0, 300.0, 30.0, 0.0),  # under the cap: as asked
        (300.0, 300.0, 300.0, 0.0),
        (HOUR, 300.0, 300.0, HOUR),  # an hour asked: the cap, and what was asked on record
        (HOUR, 60.0, 60.0, HOUR),  # a shorter cap configured
        (90.0, 60.0, 60.0, 90.0),
    ],
)
def test_a_429s_retry_after_holds_the_fleet_at_most_the_cap(
    asked_s: float, cap_s: float, held_s: float, asked_on_record: float
) -> None:
    rules = pace_rules(rate=5.0, retry_after_max_s=cap_s, **EVERY_429)
    state, _ = observe(rules, PaceState(), 100.0, Result.THROTTLED, retry_after_s=asked_s)
    assert state.paused_until == 100.0 + held_s
    assert state.asked_s == asked_on_record
    _, held = admit(rules, state, 100.0)  # a short one is waited in the thread
    assert isinstance(held, Hold if held_s > rules.max_wait_s else Go)
    assert held.wait_s == pytest.approx(held_s)
    _, after = admit(rules, state, 100.0 + held_s)
    assert isinstance(after, Go)


def test_a_longer_hold_on_record_is_cut_to_the_cap_at_the_next_call() -> None:
    """Stored by a process with a longer cap (or an older release that allowed an hour)."""
    rules = pace_rules(retry_after_max_s=300.0, **EVERY_429)
    stored = PaceState(paused_until=100.0 + HOUR)
    state, decision = admit(rules, stored, 100.0)
    assert state.paused_until == 400.0  # what the store keeps from now on
    assert state.asked_s == HOUR  # so that health still says a longer hold was cut
    assert isinstance(decision, Hold)
    assert decision.wait_s == pytest.approx(300.0)


def test_a_hold_at_the_cap_read_by_a_process_a_moment_behind_is_not_cut() -> None:
    """The shared clock is read by each process's transaction: one may see a `now` a
    little older than the 429's that set a hold of the whole cap."""
    rules = pace_rules(retry_after_max_s=300.0, **EVERY_429)
    state, _ = observe(rules, PaceState(), 1000.0, Result.THROTTLED, retry_after_s=300.0)
    assert (state.paused_until, state.asked_s) == (1300.0, 0.0)
    behind, _ = admit(rules, state, 999.95)
    assert behind.paused_until == 1300.0
    assert behind.asked_s == 0.0  # health never says the gateway asked for more


def test_a_later_shorter_429_does_not_shorten_a_hold_in_force() -> None:
    rules = pace_rules(retry_after_max_s=300.0, **EVERY_429)
    state, _ = observe(rules, PaceState(), 0.0, Result.THROTTLED, retry_after_s=HOUR)
    again, _ = observe(rules, state, 10.0, Result.THROTTLED, retry_after_s=5.0)
    assert again.paused_until == 300.0
    assert again.asked_s == HOUR


@pytest.mark.parametrize("paced", [False, True])
def test_a_deferred_hop_waits_at_most_the_cap_for_a_retry_after(paced: bool) -> None:
    deferral = Deferral(max_s=30.0, deadline_s=86_400.0, retry_after_max_s=300.0)
    assert deferral.delay(0, HOUR, 0.0, paced=paced) == pytest.approx(300.0)
    assert deferral.delay(0, 120.0, 0.0, paced=paced) == pytest.approx(120.0)


@pytest.mark.parametrize(
    "retry_after",
    [
        "86400",
        "Wed, 21 Oct 2099 07:28:00 GMT",  # an HTTP date far ahead
    ],
)
def test_through_the_adapter_a_huge_retry_after_holds_the_fleet_for_the_cap(
    retry_after: str,
) -> None:
    upstream = Upstream(httpx.Response(429, headers={"Retry-After": retry_after}))
    clock = ManualClock(seconds=1000.0)
    gateway, pace = adapter(upstream, pace_rules(retry_after_max_s=300.0, **EVERY_429), clock)

    with pytest.raises(TransientGatewayError, match="429"):
        gateway.status("ws-1")
    with pytest.raises(TransientGatewayError, match="Retry-After") as held:
        gateway.status("ws-1")
    assert held.value.retry_after_s == pytest.approx(300.0)
    clock.advance(300.0)
    assert gateway.status("ws-1") == "created"
    assert upstream.count == 2
    state, _ = pace.state()
    assert state.asked_s == pytest.approx(3600.0)  # the adapter believes an hour at most
    gateway.close()


def test_the_cap_is_a_setting_that_reaches_the_pace_and_the_deferral() -> None:
    assert Settings().retry_after_max_s == 300.0
    settings = Settings.from_env({"PROVISIONER_RETRY_AFTER_MAX_S": "120"})
    assert settings.pace().retry_after_max_s == 120.0
    assert settings.engine().deferral.retry_after_max_s == 120.0
    for bad in ("0", "3601", "an hour"):
        with pytest.raises(SettingsError, match="PROVISIONER_RETRY_AFTER_MAX_S"):
            Settings.from_env({"PROVISIONER_RETRY_AFTER_MAX_S": bad})


def _circuit(state: PaceState, now: float, cap_s: float = 300.0) -> str:
    check = circuit_check(lambda: (state, now), pace_rules(retry_after_max_s=cap_s, **EVERY_429))
    with pytest.raises(Degraded) as raised:
        check()
    return str(raised.value)


def test_health_says_when_a_hold_is_longer_than_the_setting() -> None:
    said = _circuit(PaceState(paused_until=1000.0 + HOUR), 1000.0)
    assert said.startswith("throttled: the gateway's Retry-After holds every call for 3600 s")
    assert "longer than PROVISIONER_RETRY_AFTER_MAX_S (300 s)" in said
    assert "the next call cuts it to 300 s" in said


def test_health_says_when_the_gateway_asked_for_longer_than_the_cap() -> None:
    said = _circuit(PaceState(paused_until=1300.0, asked_s=HOUR), 1000.0)
    assert said == (
        "throttled: the gateway's Retry-After holds every call for 300 s more (the gateway "
        "asked for 3600 s; PROVISIONER_RETRY_AFTER_MAX_S caps it at 300 s)"
    )
    plain = _circuit(PaceState(paused_until=1030.0), 1000.0)
    assert plain == "throttled: the gateway's Retry-After holds every call for 30 s more"
