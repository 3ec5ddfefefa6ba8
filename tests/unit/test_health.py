"""Health checks, the probe endpoints and the metrics, with fakes: no sockets."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from domain.attempt import ProvisioningAttempt
from domain.pacing import PaceState
from domain.ports import TransientGatewayError, Unauthorized, WorkspaceGone
from infrastructure.gateway.adapter import HttpGateway
from tests.support import ManualClock, pace_rules
from worker.health import metrics
from worker.health.checks import (
    PROBE_WORKSPACE,
    GatewayCheck,
    circuit_check,
    projection_lag_check,
    relay_lag_check,
    stuck_check,
    stuck_releases_check,
)
from worker.health.probes import Probes
from worker.health.results import Degraded, Health, Unhealthy, healthy, report

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def failing(detail: str = "down") -> str:
    raise ConnectionRefusedError(detail)


def test_a_failing_check_says_what_and_since_when_it_first_failed() -> None:
    clock = ManualClock(T0)
    state = {"up": False}

    def database() -> str:
        if not state["up"]:
            raise ConnectionRefusedError("connection refused")
        return "reachable"

    health = Health([("database", database), ("broker", lambda: "reachable")], clock=clock.now)
    first = health.run()
    clock.advance(5 * 60)  # T0 + 5 minutes
    second = health.run()
    assert not healthy(second)
    assert second[0].since == T0  # since it first failed, not since this run
    assert "ConnectionRefusedError: connection refused" in second[0].detail
    assert second[1].ok
    assert first[0].line().startswith("FAILING  database: ")
    state["up"] = True
    assert healthy(health.run())
    state["up"] = False
    clock.advance(4 * 60)  # T0 + 9 minutes
    assert health.run()[0].since == T0 + timedelta(minutes=9)  # a new failure, a new since


def test_a_check_that_knows_since_when_says_so() -> None:
    known = T0 - timedelta(hours=1)

    def stuck() -> str:
        raise Unhealthy("3 attempts stuck", known)

    (result,) = Health([("stuck_attempts", stuck)], clock=ManualClock(T0).now).run()
    assert (result.ok, result.detail, result.since) == (False, "3 attempts stuck", known)
    body = report([result])
    assert body["status"] == "failing"
    assert body["checks"][0]["since"] == known.isoformat()


def test_a_failure_text_carries_no_password() -> None:
    def database() -> str:
        raise OSError("cannot reach postgresql://alice:s3cret@db/events")

    (result,) = Health([("database", database)]).run()
    assert "s3cret" not in result.detail


class ScriptedGateway:
    def __init__(self, *answers: BaseException) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    def status(self, workspace_id: str) -> str:
        self.asked.append(workspace_id)
        raise self.answers.pop(0)


def test_the_gateway_check_reads_a_status_that_cannot_exist_and_keeps_the_answer() -> None:
    gateway = ScriptedGateway(WorkspaceGone("404"))
    check = GatewayCheck(gateway, ttl_s=60)  # type: ignore[arg-type]
    assert check() == "reachable, token accepted"
    assert check() == "reachable, token accepted"
    assert gateway.asked == [PROBE_WORKSPACE]  # cached: one call


@pytest.mark.parametrize(
    ("error", "says", "degraded"),
    [
        (Unauthorized("status: credentials refused (HTTP 401)"), "the token is refused", False),
        # Down: degraded, not failing; hops are deferred and commands still consumed.
        (TransientGatewayError("status: ConnectError after 1 attempt(s)"), "no answer", True),
    ],
)
def test_the_gateway_check_names_a_refused_token_or_an_unreachable_gateway(
    error: BaseException, says: str, degraded: bool
) -> None:
    check = GatewayCheck(ScriptedGateway(error, error), ttl_s=0)  # type: ignore[arg-type]
    (first,) = Health([("gateway", check)]).run()
    assert first.ok is degraded
    assert first.degraded is degraded
    assert report([first])["status"] == ("degraded" if degraded else "failing")
    assert says in first.detail
    assert first.since is not None
    (again,) = Health([("gateway", check)]).run()
    assert again.since == first.since  # the gateway check's own since, kept while failing


def test_lag_checks_compare_events_behind_with_the_threshold() -> None:
    facts = {"relay_lag": 12, "projection_lag": {"attempts": 3, "brand_workspaces": 40}}
    results = Health(
        [
            ("relay_lag", relay_lag_check(lambda: facts, 10)),
            ("projection_lag", projection_lag_check(lambda: facts, 10)),
        ]
    ).run()
    assert [r.ok for r in results] == [False, False]
    assert "12 events behind (threshold 10)" in results[0].detail
    assert "brand_workspaces 40" in results[1].detail
    assert "attempts 3" not in results[1].detail
    ok = Health([("relay_lag", relay_lag_check(lambda: facts, 12))]).run()
    assert healthy(ok)


def test_stuck_attempts_fail_since_the_oldest_became_stuck() -> None:
    due = T0 - timedelta(hours=2)
    facts = {"pending": 5, "stuck": 2, "oldest_stuck_due": due, "oldest_stuck_id": "a-1"}
    (result,) = Health([("stuck_attempts", stuck_check(lambda: facts, 600))]).run()
    assert not result.ok
    assert "2 pending attempts overdue by more than 600s (oldest: a-1)" in result.detail
    assert result.since == due + timedelta(seconds=600)
    calm = {"pending": 5, "stuck": 0, "oldest_stuck_due": None, "oldest_stuck_id": None}
    assert healthy(Health([("stuck_attempts", stuck_check(lambda: calm, 600))]).run())


def test_releases_owed_long_after_their_end_warn_but_keep_the_service_ready() -> None:
    stuck = {"releases_owed": 4, "releases_stuck": 1}
    (result,) = Health([("stuck_releases", stuck_releases_check(lambda: stuck, 900))]).run()
    assert result.ok  # a warning: readiness holds
    assert result.degraded
    assert "1 ended attempts still owe a release more than 900s" in result.detail
    calm = {"releases_owed": 4, "releases_stuck": 0}
    (ok,) = Health([("stuck_releases", stuck_releases_check(lambda: calm, 900))]).run()
    assert ok.ok
    assert ok.detail == "4 releases owed, none for more than 900s"


# -- the endpoints, as a WSGI application ------------------------------------------


def call(
    app: Probes, path: str, method: str = "GET", token: str | None = None
) -> tuple[str, bytes]:
    seen: dict[str, Any] = {}

    def start(status: str, headers: list[tuple[str, str]]) -> None:
        seen["status"] = status

    environ = {"REQUEST_METHOD": method, "PATH_INFO": path}
    if token is not None:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    body: Iterable[bytes] = app(environ, start)
    return seen["status"], b"".join(body)


def test_readiness_is_503_naming_the_failing_check_and_200_when_all_pass() -> None:
    state = {"up": False}

    def database() -> str:
        if not state["up"]:
            raise ConnectionRefusedError("connection refused by db.example as app_user")
        return "reachable at postgresql://app_user@db.example/events"

    checks = [("database", database), ("broker", lambda: "ok")]
    probes = Probes(health=Health(checks), ttl_s=0)
    status, body = call(probes, "/readyz")
    assert status.startswith("503")
    assert json.loads(body) == {"status": "failing",
                                "checks": {"database": "failing", "broker": "ok"}}  # fmt: skip
    state["up"] = True
    status, body = call(probes, "/readyz")
    assert status.startswith("200")
    assert json.loads(body) == {"status": "ok", "checks": {"database": "ok", "broker": "ok"}}
    assert b"db.example" not in body


def test_readiness_details_need_the_web_token() -> None:
    def database() -> str:
        raise ConnectionRefusedError("connection refused by db.example")

    probes = Probes(health=Health([("database", database)]), token="s3cret-token")
    for token in (None, "wrong", "s3cret-tokenX"):
        status, body = call(probes, "/readyz", token=token)
        assert status.startswith("503")
        assert b"db.example" not in body
    status, body = call(probes, "/readyz", token="s3cret-token")
    assert status.startswith("503")
    (check,) = json.loads(body)["checks"]
    assert check["name"] == "database"
    assert "db.example" in check["detail"]
    assert check["since"]
    assert b"db.example" not in call(Probes(health=Health([("database", database)])), "/readyz")[1]


def test_readiness_runs_its_checks_at_most_once_per_ttl() -> None:
    runs: list[int] = []

    def database() -> str:
        runs.append(1)
        return "reachable"

    probes = Probes(health=Health([("database", database)]), ttl_s=60)
    for _ in range(50):
        assert call(probes, "/readyz")[0].startswith("200")
    assert len(runs) == 1  # a probe storm opens one connection, not fifty
    probes.health = Health([("database", database)])  # the parts built: run the new checks
    call(probes, "/readyz")
    assert len(runs) == 2
    probes.ttl_s = 0
    call(probes, "/readyz")
    assert len(runs) == 3


def test_a_degraded_check_is_ready_and_says_degraded() -> None:
    def gateway() -> str:
        raise Degraded("no answer from gw.example")

    checks = [("gateway_circuit", gateway), ("broker", lambda: "ok")]
    status, body = call(Probes(health=Health(checks)), "/readyz")
    assert status.startswith("200")
    checks_seen = {"gateway_circuit": "degraded", "broker": "ok"}
    assert json.loads(body) == {"status": "degraded", "checks": checks_seen}
    assert b"gw.example" not in body  # the detail still needs the token


def test_a_process_is_not_ready_until_its_parts_are_built() -> None:
    status, body = call(Probes(), "/readyz")
    assert status.startswith("503")
    assert json.loads(body) == {"status": "failing", "checks": {"startup": "failing"}}
    assert b"starting" in call(Probes(token="t0k"), "/readyz", token="t0k")[1]
    assert call(Probes(), "/healthz")[0].startswith("200")


def test_liveness_ignores_outages_and_fails_when_a_part_stopped() -> None:
    probes = Probes(health=Health([("database", failing)]))
    assert call(probes, "/healthz")[0].startswith("200")  # an outage never restarts a pod
    probes.live = lambda: "stopped: relay"
    status, body = call(probes, "/healthz")
    assert status.startswith("503")
    assert b"stopped: relay" in body


def test_any_other_path_is_404_and_metrics_stay_at_metrics() -> None:
    probes = Probes()
    for path in ("/", "/metrics/x", "/health", "/favicon.ico"):
        assert call(probes, path)[0].startswith("404")
    assert call(probes, "/readyz", "POST")[0].startswith("405")
    status, body = call(probes, "/metrics")
    assert status.startswith("200")
    assert b"provisioner_hops_total" in body


def test_the_state_gauges_are_read_when_scraped() -> None:
    probes = Probes()
    facts = {"relay_lag": 7, "projection_lag": {"attempts": 2}, "pending": 4, "stuck": 1,
             "releases_owed": 3, "releases_stuck": 1, "brands_degraded": 2}  # fmt: skip
    probes.watch_state(lambda: facts)
    body = call(probes, "/metrics")[1].decode()
    for line in ('provisioner_relay_lag_events 7.0',
                 'provisioner_projection_lag_events{projection="attempts"} 2.0',
                 'provisioner_attempts_pending 4.0', 'provisioner_attempts_stuck 1.0',
                 'provisioner_releases_owed 3.0', 'provisioner_releases_stuck 1.0',
                 'provisioner_brands_degraded 2.0'):  # fmt: skip
        assert line in body
    probes.watch_state(failing)  # type: ignore[arg-type]
    status, body = call(probes, "/metrics")
    assert status.startswith("200")
    assert b"provisioner_attempts_pending" not in body


# -- the metrics ---------------------------------------------------------------------


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_gateway_calls_are_counted_by_operation_and_status_class() -> None:
    calls: list[tuple[str, int | None, float]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/status"):
            return httpx.Response(401, json={"error": "no"})
        raise httpx.ConnectError("refused", request=request)

    gateway = HttpGateway(
        "http://gw.test", "tok", transport=httpx.MockTransport(answer), retries=0,
        observe=lambda *args: calls.append(args),
    )  # fmt: skip
    with gateway:
        with pytest.raises(Unauthorized):
            gateway.status("w1")
        with pytest.raises(TransientGatewayError):
            gateway.family("p1")
    assert [(op, code) for op, code, _ in calls] == [("status", 401), ("family", None)]
    assert all(seconds >= 0 for *_, seconds in calls)

    before = sample("provisioner_gateway_auth_failures_total", operation="status")
    errors = sample("provisioner_gateway_requests_total", operation="family", status_class="error")
    for op, code, seconds in calls:
        metrics.observe_gateway(op, code, seconds)
    metrics.observe_gateway("something new", 200, 0.1)
    assert sample("provisioner_gateway_auth_failures_total", operation="status") == before + 1
    assert (
        sample("provisioner_gateway_requests_total", operation="family", status_class="error")
        == errors + 1
    )
    assert sample("provisioner_gateway_requests_total", operation="other", status_class="2xx")
    assert sample("provisioner_gateway_request_duration_seconds_count", operation="status")


def test_status_classes_are_bounded() -> None:
    assert [metrics.status_class(c) for c in (200, 302, 404, 503, None, 999)] == [
        "2xx", "3xx", "4xx", "5xx", "error", "error",
    ]  # fmt: skip


def test_ended_attempts_are_counted_by_state_and_a_bounded_reason() -> None:
    def event(cls: type, **fields: Any) -> Any:
        return cls(originator_id=uuid.uuid4(), originator_version=2, timestamp=T0, **fields)

    failed = sample("provisioner_attempts_ended_total", state="failed", reason="unauthorized")
    other = sample("provisioner_attempts_ended_total", state="failed", reason="other")
    promoted = sample("provisioner_attempts_ended_total", state="promoted", reason="none")
    metrics.count_ended(event(ProvisioningAttempt.Failed, reason="unauthorized", message="m",
                              hop=1))  # fmt: skip
    metrics.count_ended(event(ProvisioningAttempt.Failed, reason="free text", message="m", hop=1))
    metrics.count_ended(event(ProvisioningAttempt.Promoted, workspace_id="w", hop=1))
    metrics.count_ended(event(ProvisioningAttempt.Cancelled, why="x"))
    metrics.count_ended(event(ProvisioningAttempt.HopScheduled, hop=1, not_before=T0,
                              last_status="", deferred=False, spent=True, paced=False))  # fmt: skip
    assert sample("provisioner_attempts_ended_total", state="failed",
                  reason="unauthorized") == failed + 1  # fmt: skip
    assert sample("provisioner_attempts_ended_total", state="failed", reason="other") == other + 1
    assert sample("provisioner_attempts_ended_total", state="promoted",
                  reason="none") == promoted + 1  # fmt: skip


def test_metric_names_follow_prometheus_conventions() -> None:
    registry = CollectorRegistry()
    registry.register(metrics.StateCollector(lambda: {"relay_lag": 0, "pending": 0}))
    text = (generate_latest(REGISTRY) + generate_latest(registry)).decode()
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE provisioner")}
    types = {line.split()[2]: line.split()[3] for line in text.splitlines()
             if line.startswith("# TYPE provisioner")}  # fmt: skip
    for name in names:
        if types[name] == "counter":
            assert name.endswith("_total"), name
        if types[name] == "histogram":
            assert name.endswith("_seconds"), name
    assert {"provisioner_hops_total", "provisioner_attempts_ended_total",
            "provisioner_gateway_requests_total", "provisioner_dead_letters_total",
            "provisioner_gateway_request_duration_seconds", "provisioner_relay_lag_events",
            "provisioner_attempts_pending"} <= names  # fmt: skip


def test_a_figure_that_cannot_be_read_fails_only_the_checks_that_read_it() -> None:
    facts = {"relay_lag": 3, "projection_lag": RuntimeError("no read models here")}
    results = Health(
        [
            ("relay_lag", relay_lag_check(lambda: facts, 10)),
            ("projection_lag", projection_lag_check(lambda: facts, 10)),
        ]
    ).run()
    assert [r.ok for r in results] == [True, False]
    assert "no read models here" in results[1].detail
    probes = Probes()
    probes.watch_state(lambda: facts)
    body = call(probes, "/metrics")[1].decode()
    assert "provisioner_relay_lag_events 3.0" in body
    assert "provisioner_projection_lag_events" not in body


def test_an_open_circuit_or_a_retry_after_is_degraded_and_a_closed_one_ok() -> None:
    rules = pace_rules(rate=20.0, probe_every_s=10.0)
    opened = PaceState(open_since=1_000.0, last_error="HTTP 503", unreachable=7)
    throttled = PaceState(paused_until=1_030.0)
    results = Health(
        [
            ("open", circuit_check(lambda: (opened, 1_005.0), rules)),
            ("paused", circuit_check(lambda: (throttled, 1_005.0), rules)),
            ("closed", circuit_check(lambda: (PaceState(), 1_005.0), rules)),
            ("unused", circuit_check(lambda: None, rules)),
        ]
    ).run()

    assert [(r.ok, r.degraded) for r in results] == [(True, True), (True, True),
                                                     (True, False), (True, False)]  # fmt: skip
    assert "circuit open" in results[0].detail
    assert "HTTP 503" in results[0].detail
    assert results[0].since == datetime.fromtimestamp(1_000.0, UTC)
    assert "25 s more" in results[1].detail
    assert results[2].detail == "circuit closed; pace 20 calls/s (configured)"
    assert results[0].line().startswith("DEGRADED open: circuit open")
    assert healthy(results)
    assert report(results)["status"] == "degraded"


def test_a_configured_rate_cut_by_429s_says_so() -> None:
    rules = pace_rules(rate=20.0, probe_every_s=10.0)
    cut = PaceState(learned=11.9, learned_at=1_000.0, ceiling=14.0)
    (result,) = Health([("cut", circuit_check(lambda: (cut, 1_000.0), rules))]).run()
    assert result.detail == (
        "circuit closed; pace 11.9 calls/s (cut by 429s under the configured 20)"
    )
    (result,) = Health([("back", circuit_check(lambda: (cut, 2_000.0), rules))]).run()
    assert result.detail == "circuit closed; pace 20 calls/s (configured)"


def test_a_metrics_port_another_process_holds_names_the_port_and_the_variable() -> None:
    import socket

    from infrastructure.failures import EXIT_CONFIGURATION, ConfigurationError
    from worker.health.probes import serve

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        with pytest.raises(ConfigurationError) as refused:
            serve("127.0.0.1", port, Probes())
    finally:
        held.close()
    assert f"PROVISIONER_METRICS_PORT={port}" in str(refused.value)
    assert refused.value.exit_code == EXIT_CONFIGURATION
