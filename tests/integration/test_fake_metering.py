"""The fake gateway's rate limit and outages over real HTTP: 429 with Retry-After
beyond the token bucket, 503 or refused connections during an outage, and the
counters of both in /_fake/state."""

from __future__ import annotations

import time

import httpx
import pytest
from click.testing import CliRunner

from infrastructure.fake_gateway.server import FakeGateway
from tests.integration.test_fake_gateway import (
    AUTH,
    PARENT,
    create,
    http_client,
    workspaces_titled,
)

STATUS = f"/v1/workspaces/{PARENT}/status"


def codes(http: httpx.Client, calls: int) -> list[int]:
    return [http.get(STATUS).status_code for _ in range(calls)]


def serving_again(fake: FakeGateway, within_s: float) -> float:
    """Poll until a gateway call is answered; the time it took (fails after within_s)."""
    began = time.monotonic()
    while time.monotonic() - began < within_s:
        try:
            with http_client(fake.url, headers=AUTH, timeout=1.0) as http:
                assert http.get(STATUS).status_code == 200
            return time.monotonic() - began
        except httpx.ConnectError:
            time.sleep(0.02)
    pytest.fail(f"the fake does not serve again within {within_s} s")


# ---------------------------------------------------------------- rate limit


def test_the_bucket_admits_burst_calls_then_429s_with_retry_after(fake: FakeGateway) -> None:
    fake.configure(rate_limit=10, burst=3)
    with http_client(fake.url, headers=AUTH) as http:
        assert codes(http, 3) == [200, 200, 200]
        throttled = http.get(STATUS)
        fake.configure(rate_limit=0.25, burst=1)  # a new rate refills the bucket
        assert codes(http, 1) == [200]
        slow = http.get(STATUS)
    assert throttled.status_code == 429
    assert throttled.headers["Retry-After"] == "1"  # the next token is 0.1 s away
    assert throttled.headers["Content-Type"] == "application/json"
    assert "error" in throttled.json()
    assert slow.status_code == 429
    assert slow.headers["Retry-After"] == "4"  # 1 token at 0.25/s: whole seconds, rounded up


def test_the_bucket_refills_at_the_rate_up_to_burst(fake: FakeGateway) -> None:
    fake.configure(rate_limit=10, burst=2)
    with http_client(fake.url, headers=AUTH) as http:
        assert codes(http, 3) == [200, 200, 429]
        time.sleep(0.15)  # 1.5 tokens
        assert codes(http, 2) == [200, 429]
        time.sleep(0.4)  # 4 tokens, but the bucket holds 2
        assert codes(http, 3) == [200, 200, 429]


def test_throttled_calls_are_counted_and_admin_calls_never_throttled(fake: FakeGateway) -> None:
    fake.configure(rate_limit=1, burst=1)
    with http_client(fake.url, headers=AUTH) as http:
        assert codes(http, 4) == [200, 429, 429, 429]
        assert http.get(f"/v1/workspaces/{PARENT}/family").status_code == 429
        assert {http.get("/_fake/state").status_code for _ in range(5)} == {200}
        state = http.get("/_fake/state").json()
    assert state["throttled"] == 4
    assert state["rate_limit"] == {"rate": 1, "burst": 1, "window": 0}
    assert state["faults"] == {}  # the random throttle_rate is counted there, not this
    assert state["calls"]["status"] == 4
    assert state["calls"]["family"] == 1
    assert state["calls_total"] == 5 == sum(state["calls"].values())


def test_a_quota_a_window_tells_each_call_past_it_to_wait_for_the_window_end(
    fake: FakeGateway,
) -> None:
    fake.configure(rate_limit=2, rate_window=3)  # 6 calls in each 3 s
    with http_client(fake.url, headers=AUTH) as http:
        assert codes(http, 6) == [200] * 6
        refused = http.get(STATUS)
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "3"
        time.sleep(1.2)
        assert http.get(STATUS).headers["Retry-After"] == "2"  # the same window's end
    assert fake.state()["rate_limit"] == {"rate": 2, "burst": 1, "window": 3}
    assert fake.state()["throttled"] == 2


def test_a_throttled_create_creates_nothing(fake: FakeGateway) -> None:
    fake.configure(rate_limit=0.5, burst=1)
    with http_client(fake.url, headers=AUTH) as http:
        assert create(http, "Brand A").status_code == 200
        refused = create(http, "Brand B")
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "2"
    assert len(workspaces_titled(fake, "Brand A")) == 1
    assert workspaces_titled(fake, "Brand B") == []
    assert fake.state()["creates"] == {"Brand A": 1, "Brand B": 1}  # received, refused


def test_the_bucket_is_checked_before_any_fault_and_the_token(fake: FakeGateway) -> None:
    fake.configure(rate_limit=0.5, burst=1, unauthorized_rate=1.0)
    with http_client(fake.url, headers=AUTH) as http, http_client(fake.url) as anonymous:
        assert codes(http, 2) == [401, 429]
        assert anonymous.get(STATUS).status_code == 429
    state = fake.state()
    assert state["faults"] == {"unauthorized": 1}
    assert state["throttled"] == 2


def test_rate_limit_and_burst_are_checked_knobs(fake: FakeGateway) -> None:
    with http_client(fake.url) as http:
        config = http.post("/_fake/config", json={"rate_limit": 20, "burst": 5}).json()
        assert (config["rate_limit"], config["burst"]) == (20.0, 5)
        for bad in ({"burst": 0}, {"burst": 1.5}, {"rate_limit": -1}, {"rate_limit": "fast"}):
            refused = http.post("/_fake/config", json=bad)
            assert refused.status_code == 400, bad
            assert next(iter(bad)) in refused.json()["error"]
        assert http.post("/_fake/config", json={"rate_limit": 0}).json()["rate_limit"] == 0.0


def test_the_command_takes_the_new_knobs_and_names_the_admin_endpoints() -> None:
    from worker.cli.main import main

    runner = CliRunner()
    shown = runner.invoke(main, ["fake-gateway", "--help"])
    assert shown.exit_code == 0
    for flag in ("--rate-limit", "--burst"):
        assert flag in shown.output
    for endpoint in ("state", "reset", "config", "scripts", "workspaces", "outage"):
        assert f"/_fake/{endpoint}" in shown.output
    refused = runner.invoke(main, ["fake-gateway", "--port", "0", "--burst", "0"])
    assert refused.exit_code == 2
    assert "burst must be at least 1" in refused.output


# ---------------------------------------------------------------- outages


def test_a_503_outage_answers_every_gateway_call_then_ends(fake: FakeGateway) -> None:
    with http_client(fake.url, headers=AUTH) as http:
        began = http.post("/_fake/outage", json={"seconds": 0.5, "mode": "503"})
        assert began.status_code == 200
        assert began.json()["mode"] == "503"
        assert began.json()["calls"] == 0
        assert 0.4 < began.json()["ends_in_s"] <= 0.5
        down = http.get(STATUS)
        assert create(http, "Brand A").status_code == 503
        assert http.get("/_fake/state").status_code == 200  # admin calls still work
        time.sleep(0.55)
        assert http.get(STATUS).status_code == 200
    assert down.status_code == 503
    assert "error" in down.json()
    assert int(down.headers["Retry-After"]) >= 1
    assert workspaces_titled(fake, "Brand A") == []
    state = fake.state()
    assert state["outage"] == {"mode": "503", "ends_in_s": 0.0, "calls": 2}  # the last one
    assert state["outage_calls"] == 2
    assert state["calls_total"] == 3
    assert state["throttled"] == 0


def test_an_outage_comes_before_the_bucket_and_seconds_zero_ends_it(fake: FakeGateway) -> None:
    fake.configure(rate_limit=0.5, burst=1)
    with http_client(fake.url, headers=AUTH) as http:
        http.post("/_fake/outage", json={"seconds": 30})  # mode 503 by default
        assert codes(http, 3) == [503, 503, 503]
        ended = http.post("/_fake/outage", json={"seconds": 0}).json()
        assert codes(http, 2) == [200, 429]  # the bucket was never drawn on
    assert ended == {"mode": "503", "ends_in_s": 0.0, "calls": 3}
    assert fake.state()["outage_calls"] == 3


def test_outage_bodies_are_checked(fake: FakeGateway) -> None:
    with http_client(fake.url) as http:
        assert http.post("/_fake/outage", json={"seconds": 0}).json() is None  # none yet
        for bad in (
            {},
            {"seconds": -1},
            {"seconds": "1"},
            {"seconds": True},
            {"seconds": 1, "mode": "down"},
            {"seconds": 1, "mode": 503},
            {"seconds": 1, "for": "ever"},
            [1],
        ):
            refused = http.post("/_fake/outage", json=bad)
            assert refused.status_code == 400, bad
            assert "error" in refused.json()
        assert http.get("/_fake/state").json()["outage"] is None


def test_a_refuse_outage_refuses_connections_then_serves_on_the_same_port(
    fake: FakeGateway,
) -> None:
    url = fake.url
    with http_client(url, headers=AUTH) as http, http_client(url, headers=AUTH) as other:
        assert other.get(STATUS).status_code == 200  # a keep-alive connection, open
        began = time.monotonic()
        answer = http.post("/_fake/outage", json={"seconds": 0.6, "mode": "refuse"})
        assert answer.status_code == 200
        assert answer.json()["mode"] == "refuse"
        for client in (http, other):
            with pytest.raises(httpx.ConnectError):
                client.get(STATUS)
        with pytest.raises(httpx.ConnectError):
            http.get("/_fake/state")  # the admin calls too: the outage ends by itself
    waited = serving_again(fake, within_s=3.0)
    assert time.monotonic() - began >= 0.6
    assert waited < 1.0
    assert fake.url == url
    state = fake.state()
    assert state["outage"] == {"mode": "refuse", "ends_in_s": 0.0, "calls": 0}
    assert state["outage_calls"] == 0
    assert state["calls"]["status"] == 2  # one before, one after: refused calls are unseen


def test_reset_clears_the_counters_and_ends_an_outage(fake: FakeGateway) -> None:
    fake.configure(rate_limit=0.5, burst=1)
    with http_client(fake.url, headers=AUTH) as http:
        assert codes(http, 2) == [200, 429]
        http.post("/_fake/outage", json={"seconds": 30})
        assert codes(http, 1) == [503]
        cleared = http.post("/_fake/reset").json()
        assert codes(http, 2) == [200, 429]  # no outage, and a full bucket
    assert cleared["throttled"] == 0
    assert cleared["outage"] is None
    assert cleared["outage_calls"] == 0
    assert cleared["calls_total"] == 0
    assert fake.state()["throttled"] == 1


def test_in_process_outages_and_reset_end_a_refuse_outage(fake: FakeGateway) -> None:
    assert fake.outage(30, "refuse") == {"mode": "refuse", "ends_in_s": 30.0, "calls": 0}
    with pytest.raises(httpx.ConnectError), http_client(fake.url, headers=AUTH) as http:
        http.get(STATUS)
    fake.reset()
    assert serving_again(fake, within_s=2.0) < 0.5
    fake.outage(30, "refuse")
    began = time.monotonic()
    fake.stop()  # does not wait for the outage to end
    assert time.monotonic() - began < 1.0
