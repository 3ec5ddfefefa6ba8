"""The fake gateway's token bucket on an injected clock, Retry-After rounding, and
the order in which an outage, the bucket and the faults answer a call (no HTTP)."""

from __future__ import annotations

import pytest

from infrastructure.fake_gateway.config import FakeConfig, InvalidKnobError
from infrastructure.fake_gateway.metering import FixedWindow, TokenBucket, retry_after
from infrastructure.fake_gateway.replies import BadRequestError, Request
from infrastructure.fake_gateway.state import FakeState
from tests.support import ManualClock


def takes(bucket: TokenBucket | FixedWindow, calls: int) -> list[float]:
    return [round(bucket.take(), 6) for _ in range(calls)]


def test_a_rate_of_zero_admits_everything() -> None:
    assert takes(TokenBucket(0.0, 1, ManualClock(seconds=100.0)), 1000) == [0.0] * 1000


def test_burst_at_once_then_the_wait_for_the_next_token() -> None:
    clock = ManualClock(seconds=100.0)
    bucket = TokenBucket(4.0, 3, clock)
    assert takes(bucket, 5) == [0.0, 0.0, 0.0, 0.25, 0.25]  # refused calls take nothing
    clock.advance(0.1)
    assert takes(bucket, 1) == [0.15]


def test_tokens_come_at_the_rate_and_never_beyond_burst() -> None:
    clock = ManualClock(seconds=100.0)
    bucket = TokenBucket(2.0, 2, clock)
    takes(bucket, 2)
    clock.advance(0.75)  # 1.5 tokens
    assert takes(bucket, 2) == [0.0, 0.25]
    clock.advance(60.0)  # would be 120.5 tokens: the bucket holds 2
    assert takes(bucket, 3) == [0.0, 0.0, 0.5]


def test_refill_makes_the_bucket_full_with_the_new_rate_and_burst() -> None:
    clock = ManualClock(seconds=100.0)
    bucket = TokenBucket(1.0, 1, clock)
    takes(bucket, 1)
    bucket.refill(10.0, 2)
    assert takes(bucket, 3) == [0.0, 0.0, 0.1]
    bucket.refill()
    assert takes(bucket, 3) == [0.0, 0.0, 0.1]


def test_a_window_admits_its_quota_then_tells_the_wait_to_its_end() -> None:
    """A quota of "600 a minute" at the small scale: 2 calls/s over 3 s windows, 6 a
    window; a call past them waits until the window ends, however early it came."""
    clock = ManualClock(seconds=100.0)
    window = FixedWindow(2.0, 3.0, clock)
    assert takes(window, 7) == [0.0] * 6 + [3.0]
    clock.advance(2.5)
    assert takes(window, 1) == [0.5]  # refused calls count nothing
    clock.advance(0.5)  # the next window
    assert takes(window, 7) == [0.0] * 6 + [3.0]
    clock.advance(7.0)  # two windows on, on the same grid: this one ends in 2 s
    assert takes(window, 7) == [0.0] * 6 + [2.0]
    window.refill()  # a reset starts a window from now
    assert takes(window, 7) == [0.0] * 6 + [3.0]


def test_a_window_quota_is_one_call_at_the_least() -> None:
    window = FixedWindow(0.1, 2.0, ManualClock(seconds=0.0))
    assert takes(window, 2) == [0.0, 2.0]


def test_the_rate_window_knob_makes_the_limit_a_quota_a_window() -> None:
    state = FakeState(FakeConfig(rate_limit=2.0), ["p"])
    assert isinstance(state.bucket, TokenBucket)
    state.configure({"rate_window": 3.0})
    assert isinstance(state.bucket, FixedWindow)
    assert state.snapshot()["rate_limit"] == {"rate": 2.0, "burst": 1, "window": 3.0}
    assert [call(state) for _ in range(7)] == [200] * 6 + [429]
    state.configure({"rate_window": 0})
    assert isinstance(state.bucket, TokenBucket)
    with pytest.raises(InvalidKnobError, match="rate_window"):
        state.configure({"rate_window": -1})


@pytest.mark.parametrize(
    ("wait_s", "header"),
    [(0.001, 1), (0.5, 1), (1.0, 1), (1.0 + 1e-12, 1), (1.01, 2), (3.9996, 4), (4.0, 4)],
)
def test_retry_after_is_whole_seconds_rounded_up_at_least_one(wait_s: float, header: int) -> None:
    assert retry_after(wait_s) == header


def test_burst_is_at_least_one_and_rate_limit_not_negative() -> None:
    config = FakeConfig()
    assert (config.rate_limit, config.burst) == (0.0, 1)
    with pytest.raises(InvalidKnobError, match="burst must be at least 1"):
        FakeConfig(burst=0)
    with pytest.raises(InvalidKnobError, match="rate_limit"):
        config.update({"rate_limit": -0.5})
    config.update({"rate_limit": 3, "burst": 2.0})
    assert (config.rate_limit, config.burst) == (3.0, 2)
    assert isinstance(config.rate_limit, float)
    assert isinstance(config.burst, int)


def call(state: FakeState, authorization: str = "Bearer t") -> int:
    request = Request("GET", "/v1/workspaces/p/status", {}, authorization, b"")
    _latency, fault = state.begin_call("status", request)
    return 200 if fault is None else fault.status


def test_a_503_outage_answers_first_then_the_bucket_then_the_faults() -> None:
    clock = ManualClock(seconds=100.0)
    state = FakeState(FakeConfig(rate_limit=1.0, burst=1, unauthorized_rate=1.0), ["p"])
    state.bucket = TokenBucket(1.0, 1, clock)
    state.start_outage(30)
    assert [call(state), call(state, "")] == [503, 503]
    state.start_outage(0)
    # The outage took no token; once it is spent, 429 comes before the token check.
    assert [call(state, ""), call(state), call(state)] == [401, 429, 429]
    clock.advance(1.0)
    assert call(state) == 401
    shown = state.snapshot()
    assert shown["outage"] == {"mode": "503", "ends_in_s": 0.0, "calls": 2}
    assert (shown["outage_calls"], shown["throttled"], shown["calls_total"]) == (2, 2, 6)
    assert shown["faults"] == {"unauthorized": 1}  # a missing token is not a drawn fault


def test_a_refuse_outage_closes_calls_on_open_connections_and_counts_none() -> None:
    state = FakeState(FakeConfig(), ["p"])
    state.start_outage(30, "refuse")
    request = Request("GET", "/v1/workspaces/p/status", {}, "Bearer t", b"")
    _latency, fault = state.begin_call("status", request)
    assert fault is not None
    assert fault.timeout  # closed unanswered
    assert fault.hold_s == 0
    assert 29 < state.refusing_s() <= 30
    shown = state.snapshot()
    assert shown["outage"]["calls"] == shown["outage_calls"] == 0
    state.reset()
    assert state.refusing_s() == 0.0
    assert state.snapshot()["outage"] is None


@pytest.mark.parametrize(
    ("seconds", "mode"), [(-1, "503"), (float("inf"), "503"), (True, "503"), (1, "down")]
)
def test_outage_arguments_are_checked(seconds: object, mode: object) -> None:
    state = FakeState(FakeConfig(), ["p"])
    with pytest.raises(BadRequestError):
        state.start_outage(seconds, mode)
    assert state.snapshot()["outage"] is None
