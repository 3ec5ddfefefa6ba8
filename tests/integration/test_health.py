"""Health and metrics against real PostgreSQL and RabbitMQ, and real processes."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from domain.pacing import PaceState
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.pacing import PgPaceStore
from infrastructure.settings.model import Settings
from infrastructure.views.heartbeats import Heartbeat
from tests.integration.test_cli_edges import PROVISIONER, clean_env, forwarder, free_port, pg_url
from tests.support import rabbitmqctl
from worker.health.probes import Probes, serve
from worker.health.report import checks_for
from worker.health.results import Health

TOKEN = "t0ken-web-health"  # PROVISIONER_WEB_TOKEN: /readyz shows its details to it


def get(port: int, path: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def until(port: int, path: str, code: int, seconds: float = 30, token: str | None = None) -> str:
    deadline, last = time.monotonic() + seconds, (0, "")
    while time.monotonic() < deadline:
        last = get(port, path, token)
        if last[0] == code:
            return last[1]
        time.sleep(0.2)
    raise AssertionError(f"{path} never answered {code}: {last}")


def until_ok(port: int, seconds: float = 30) -> str:
    """/readyz once every check is ok: a part's first beat may come after the first run
    of the checks (its heartbeat never seen, degraded, until then)."""
    deadline, body = time.monotonic() + seconds, ""
    while time.monotonic() < deadline:
        body = until(port, "/readyz", 200, seconds)
        if json.loads(body)["status"] == "ok":
            return body
        time.sleep(0.5)
    return body


def failing(body: str) -> dict[str, Any]:
    return {c["name"]: c for c in json.loads(body)["checks"] if not c["ok"]}


def forget_heartbeats(url: str) -> None:
    """The session's database is shared: components other tests ran (and stopped) are
    forgotten, as an operator forgets one retired for good."""
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute("SELECT to_regclass('provisioner_processes')").fetchone()
        if found is not None and found[0] is not None:
            conn.execute("DELETE FROM provisioner_processes")


@contextmanager
def a_worker_alive(url: str) -> Iterator[None]:
    """A worker's row that reads alive for an hour (its clock ahead), and that has had
    answers from the gateway, removed on exit: the session's database holds other
    tests' pending attempts, which fail `workers` while no worker is alive."""
    worker = Heartbeat(url, "worker", every_s=0, clock=lambda: time.time() + 3600,
                       answered_at=time.time)  # fmt: skip
    worker.process = f"health-test:{uuid.uuid4().hex[:8]}"
    assert worker.beat()
    worker.close()
    try:
        yield
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DELETE FROM provisioner_processes WHERE process = %s", (worker.process,))


@pytest.mark.postgres
def test_a_process_is_not_ready_while_its_database_is_down(
    pg_database: str, tmp_path: Path
) -> None:
    """`projections run` reaches PostgreSQL through a forwarder that is stopped and
    started again: the server, as the process sees it, goes down and comes back."""
    dbname = pg_database.rsplit("/", 1)[1]
    db_port, port = free_port(), free_port()
    host = str(psycopg.conninfo.conninfo_to_dict(pg_database)["host"])
    env = clean_env(
        PROVISIONER_DATABASE_URL=pg_url(dbname, port=db_port), PROVISIONER_METRICS_PORT=str(port),
        PROVISIONER_WEB_TOKEN=TOKEN,
    )  # fmt: skip
    log = tmp_path / "projections.log"
    with forwarder(db_port, (host, 5432)), log.open("w") as out:
        proc = subprocess.Popen(
            [PROVISIONER, "projections", "run"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            body = until_ok(port)
            assert json.loads(body) == {
                "status": "ok",
                "checks": {"database": "ok", "projection_lag": "ok", "projections_heartbeat": "ok"},
            }  # fmt: skip
            assert get(port, "/healthz")[0] == 200
            assert get(port, "/")[0] == 404
            assert get(port, "/anything")[0] == 404
            status, metrics_text = get(port, "/metrics")
            assert status == 200
            assert 'provisioner_projection_lag_events{projection="attempts"}' in metrics_text
        except BaseException:
            proc.kill()
            raise
    try:
        body = until(port, "/readyz", 503)
        assert json.loads(body)["checks"]["database"] == "failing", body
        assert str(db_port) not in body  # no host, port or database name
        assert dbname not in body
        down = failing(until(port, "/readyz", 503, token=TOKEN))  # the details: to the token
        assert "database" in down, body
        assert down["database"]["since"]
        assert "pw" not in body
        assert get(port, "/healthz")[0] == 200  # an outage is not a reason to restart
        with forwarder(db_port, (host, 5432)):
            until(port, "/readyz", 200)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.postgres
def test_readiness_names_the_broker_when_its_vhost_is_deleted(pg_database: str) -> None:
    """The relay's checks, served on a real port, while its vhost exists and after."""
    forget_heartbeats(pg_database)
    vhost = f"provisioner_health_{uuid.uuid4().hex[:8]}"
    try:
        rabbitmqctl("add_vhost", vhost)
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"rabbitmqctl cannot make a vhost here: {exc}")
    settings = Settings.from_env(
        {
            "PROVISIONER_DATABASE_URL": pg_database,
            "PROVISIONER_BROKER_URL": f"amqp://guest:guest@127.0.0.1:5672/{vhost}",
        }
    )
    checks, facts = checks_for(settings, ("relay",), gateway=None)
    probes = Probes(health=Health(checks), token=TOKEN)
    probes.watch_state(facts)
    with a_worker_alive(pg_database):  # other tests' attempts wait in this database
        port = free_port()
        server = serve("127.0.0.1", port, probes)
        assert server is not None
        try:
            body = until(port, "/readyz", 200)
            assert json.loads(body)["checks"] == {  # no relay beats here: degraded, still ready
                "database": "ok", "broker": "ok", "relay_lag": "ok", "relay_heartbeat": "degraded",
                "workers": "ok",  # a worker alive
            }  # fmt: skip
            assert "provisioner_relay_lag_events" in get(port, "/metrics")[1]
            rabbitmqctl("delete_vhost", vhost)
            body = until(port, "/readyz", 503)  # once the last answer (kept 5 s) is stale
            assert json.loads(body)["checks"]["broker"] == "failing"
            assert vhost not in body
            down = failing(get(port, "/readyz", TOKEN)[1])
            assert list(down) == ["broker"]
            assert vhost in down["broker"]["detail"]
            assert down["broker"]["since"]
        finally:
            server.shutdown()
            server.server_close()
            with suppress(RuntimeError, OSError, subprocess.TimeoutExpired):  # gone already
                rabbitmqctl("delete_vhost", vhost)


@pytest.mark.postgres
def test_the_health_command_exits_0_when_healthy_and_1_naming_what_fails(
    pg_database: str, rabbit_session_url: str, fake: FakeGateway
) -> None:
    forget_heartbeats(pg_database)
    env = clean_env(
        PROVISIONER_DATABASE_URL=pg_database, PROVISIONER_BROKER_URL=rabbit_session_url,
        PROVISIONER_GATEWAY_URL=fake.url,
        PROVISIONER_PARENT_IDS=",".join(fake.parents), PROVISIONER_GATEWAY_TOKEN="t0ken-health",
    )  # fmt: skip
    with a_worker_alive(pg_database):
        _health_command(env, pg_database, fake)


def _health_command(env: dict[str, str], pg_database: str, fake: FakeGateway) -> None:
    ok = subprocess.run(
        [PROVISIONER, "health", "--json"], env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    checks = {c["name"]: c for c in json.loads(ok.stdout)["checks"]}
    assert set(checks) == {
        "database", "broker", "gateway", "gateway_circuit", "relay_lag", "projection_lag",
        "stuck_attempts", "stuck_releases", "relay_heartbeat", "projections_heartbeat",
        "reconciler_heartbeat", "workers",
    }  # fmt: skip
    assert not checks["stuck_releases"]["degraded"], checks["stuck_releases"]
    # None of them ever ran against this database: a warning, not a failure.
    assert checks["relay_heartbeat"]["degraded"], checks["relay_heartbeat"]
    assert checks["gateway"]["detail"] == "reachable, token accepted"
    assert not checks["gateway_circuit"]["degraded"]

    # The fleet's circuit is open (as a worker left it in the shared row, its next probe
    # not due yet): degraded, exit 0. Health's own call waits for the pace: held, not sent.
    # That worker had answers from the gateway before (its beat says so): an outage.
    store = PgPaceStore(pg_database, fake.url)
    calls_before = fake.state()["calls_total"]
    try:
        store.update(
            lambda state, now: (
                replace(state, open_since=now - 30, probe_at=now + 600, last_error="HTTP 503"),
                None,
            )
        )
        opened = subprocess.run(
            [PROVISIONER, "health", "--json"], env=env, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        store.update(lambda state, now: (PaceState(), None))
    finally:
        store.close()
    assert opened.returncode == 0, opened.stdout + opened.stderr
    report = json.loads(opened.stdout)
    circuit = next(c for c in report["checks"] if c["name"] == "gateway_circuit")
    assert report["status"] == "degraded"
    assert circuit["degraded"]
    assert "circuit open" in circuit["detail"]
    assert "HTTP 503" in circuit["detail"]
    gateway = next(c for c in report["checks"] if c["name"] == "gateway")
    assert gateway["degraded"], gateway
    assert fake.state()["calls_total"] == calls_before  # held by the fleet's pace

    down = dict(env, PROVISIONER_DATABASE_URL=pg_url("x", port=free_port()),
                PROVISIONER_BROKER_URL=f"amqp://guest:guest@127.0.0.1:{free_port()}//")  # fmt: skip
    bad = subprocess.run(
        [PROVISIONER, "health", "--json"], env=down, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 1, bad.stdout + bad.stderr
    names = failing(bad.stdout)
    assert {"database", "broker"} <= set(names)
    assert "gateway" not in names
    assert ":pw@" not in bad.stdout
    assert "t0ken-health" not in bad.stdout + ok.stdout

    text = subprocess.run(
        [PROVISIONER, "health"], env=down, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert text.returncode == 1
    assert any(line.startswith("FAILING  database: ") for line in text.stdout.splitlines())

    refused = subprocess.run(
        [PROVISIONER, "health"], env=dict(env, PROVISIONER_METRICS_HOST="a b"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 3  # a setting that cannot be used: the configuration code


@pytest.mark.postgres
def test_health_fails_within_the_threshold_once_the_relay_stops(
    pg_database: str, rabbit_session_url: str
) -> None:
    forget_heartbeats(pg_database)
    env = clean_env(
        PROVISIONER_DATABASE_URL=pg_database, PROVISIONER_BROKER_URL=rabbit_session_url,
        PROVISIONER_HEARTBEAT_MAX_AGE_S="2",
    )  # fmt: skip
    with a_worker_alive(pg_database):
        _relay_stops(env)


def _relay_stops(env: dict[str, str]) -> None:
    def health() -> tuple[int, dict[str, Any]]:
        done = subprocess.run(
            [PROVISIONER, "health", "--json"], env=env, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["checks"]}

    relay = subprocess.Popen(
        [PROVISIONER, "relay"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert relay.stdout is not None
        assert "running" in relay.stdout.readline()
        code, checks = health()
        assert code == 0, checks
        assert checks["relay_heartbeat"]["ok"], checks["relay_heartbeat"]
        assert not checks["relay_heartbeat"]["degraded"]
        assert checks["reconciler_heartbeat"]["degraded"]  # never ran here: a warning
    finally:
        relay.send_signal(signal.SIGTERM)
        _, stderr = relay.communicate(timeout=30)
    assert relay.returncode == 0, stderr
    assert "relay stopped (SIGTERM)" in stderr  # its last log line
    stopped_at = time.monotonic()
    time.sleep(max(0.0, 2.5 - (time.monotonic() - stopped_at)))
    code, checks = health()
    assert code == 1
    relay_check = checks["relay_heartbeat"]
    assert not relay_check["ok"]
    assert not relay_check["degraded"]
    assert relay_check["detail"].startswith("the relay has not beaten for "), relay_check
    assert relay_check["since"]
    assert [name for name, c in checks.items() if not c["ok"]] == ["relay_heartbeat"]


@pytest.mark.postgres
def test_health_fails_a_leftover_fake_with_postgresql_and_rabbitmq(
    pg_database: str, rabbit_session_url: str
) -> None:
    env = clean_env(PROVISIONER_DATABASE_URL=pg_database, PROVISIONER_BROKER_URL=rabbit_session_url,
                    PROVISIONER_FAKE_GATEWAY="1")  # fmt: skip

    def gateway_line(*args: str, **more: str) -> tuple[int, str]:
        done = subprocess.run(
            [PROVISIONER, *args, "health"], env=dict(env, **more), capture_output=True,
            text=True, timeout=60, check=False,
        )  # fmt: skip
        return done.returncode, next(x for x in done.stdout.splitlines() if "gateway:" in x)

    code, line = gateway_line()
    assert code == 1
    assert line.startswith("FAILING  gateway: PROVISIONER_FAKE_GATEWAY=1: the in-process fake")
    assert "pass --i-know-this-is-a-test" in line
    for flags, more in (
        (["--i-know-this-is-a-test"], {}),
        ([], {"PROVISIONER_FAKE_GATEWAY": "test"}),
    ):
        assert (
            gateway_line(*flags, **more)[1] == "ok       gateway: not checked (the in-process fake)"
        )


def test_metric_names_appear_after_a_small_run(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(
        PROVISIONER_DATABASE_URL=f"sqlite:///{tmp_path / 'events.sqlite'}",
        PROVISIONER_FAKE_GATEWAY="1", PROVISIONER_METRICS_PORT=str(port),
    )  # fmt: skip
    subprocess.run([PROVISIONER, "db", "init"], env=env, check=True, capture_output=True)
    with subprocess.Popen([PROVISIONER, "run"], env=env, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert "running" in proc.stdout.readline()
            subprocess.run(
                [PROVISIONER, "provision", "b1", "--title", "B1", "--parent", "org-parent",
                 "--wait", "--timeout", "60"],
                env=env, capture_output=True, timeout=90, check=False,
            )  # fmt: skip
            until(port, "/readyz", 200)
            deadline, text = time.monotonic() + 30, ""
            while time.monotonic() < deadline and "provisioner_attempts_ended_total{" not in text:
                text = get(port, "/metrics")[1]
                time.sleep(0.2)
            for name in (
                "provisioner_hops_total{", "provisioner_attempts_ended_total{",
                "provisioner_gateway_requests_total{", "provisioner_gateway_auth_failures_total",
                "provisioner_gateway_request_duration_seconds_bucket{",
                "provisioner_relay_lag_events", "provisioner_projection_lag_events{",
                "provisioner_attempts_pending", "provisioner_attempts_stuck",
                "provisioner_releases_owed", "provisioner_dead_letters_total",
                'provisioner_component_heartbeat_age_seconds{component="relay"}',
            ):  # fmt: skip
                assert name in text, name
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
