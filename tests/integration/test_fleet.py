"""The fleet against real services: a dead worker seen by `health` and `workers`, a
gateway URL that never answered, and the reconciler saying the relay is silent."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.model import Settings
from infrastructure.store.eventstore import init_database, open_event_store
from infrastructure.views.heartbeats import Heartbeat
from infrastructure.views.store import SqlViewStore, init_read_models
from tests.conftest import PARENT, new_pg_database
from tests.integration.test_cli_edges import PROVISIONER, clean_env, free_port
from tests.readmodels import FATES, seed_histories
from tests.support import RecordingBroker
from worker.cli.main import main
from worker.health.report import checks_for
from worker.health.results import CheckResult, Health
from worker.projector import Projector
from worker.reconciler import Reconciler
from worker.runtime import build

MAX_AGE = "1"  # PROVISIONER_HEARTBEAT_MAX_AGE_S: silent after a second, beats every 0.25 s


@pytest.fixture
def fresh_pg() -> Iterator[str]:
    """A database of the test's own: no beat, no attempt of another test in it."""
    with new_pg_database("provisioner_fleet") as url:
        yield url


def checks(done: Any) -> dict[str, Any]:
    return {c["name"]: c for c in json.loads(done.stdout)["checks"]}


class WorkerThread:
    """`provisioner worker`'s parts on a thread of this process (its pid the test's)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with build(self.settings, parts=("worker",), concurrency=1, stop=self.stop) as rt:
                rt.watch_gateway(self.stop)  # as `provisioner worker` does
                rt.worker(1).run(self.stop)
        except BaseException as exc:  # the test asserts there was none
            self.failures.append(exc)

    def __enter__(self) -> WorkerThread:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.failures, self.failures


def until(predicate: Any, seconds: float = 20) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("never")


@pytest.mark.postgres
@pytest.mark.rabbitmq
def test_a_dead_worker_fails_health_once_work_waits_and_a_live_one_clears_it(
    fresh_pg: str, rabbit_url: str, fake: FakeGateway
) -> None:
    values = {
        "PROVISIONER_DATABASE_URL": fresh_pg, "PROVISIONER_BROKER_URL": rabbit_url,
        "PROVISIONER_GATEWAY_URL": fake.url, "PROVISIONER_GATEWAY_TOKEN": "t0ken-fleet",
        "PROVISIONER_PARENT_IDS": PARENT, "PROVISIONER_HEARTBEAT_MAX_AGE_S": MAX_AGE,
    }  # fmt: skip
    settings = Settings.from_env(values)
    runner = CliRunner(env=values)

    def cli(*args: str) -> Any:
        return runner.invoke(main, list(args), terminal_width=100)

    def workers() -> list[dict[str, Any]]:
        listed = cli("workers", "--json")
        assert listed.exit_code == 0, listed.output
        return [row for row in json.loads(listed.stdout) if row["kind"] == "worker"]

    with WorkerThread(settings):
        # Alive, and its start-up probe of the gateway had an answer.
        [alive] = until(lambda: [r for r in workers() if r["state"] == "alive"
                                 and r["gateway_answered_s"] is not None])  # fmt: skip
    assert (alive["pid"], alive["concurrency"], alive["version"]) == (os.getpid(), 1, "0.1.0")
    time.sleep(1.2)  # the beat grows older than PROVISIONER_HEARTBEAT_MAX_AGE_S
    [gone] = workers()
    assert gone["state"] == "silent"
    text = cli("workers")
    assert "silent" in text.stdout
    assert "0 of 1 alive" in text.stdout

    # Nothing waits: no worker is fine.
    idle = cli("health", "--json")
    assert checks(idle)["workers"]["ok"], idle.stdout

    # A provision waits, and no worker is alive: health fails, naming the last one.
    app = open_event_store(fresh_pg)
    try:
        unused = HttpGateway("http://127.0.0.1:9", "unused")  # the request path calls none
        ProvisioningService(app, unused).request_provisioning("b-fleet", "Fleet Co", PARENT)
        with SqlViewStore(fresh_pg) as store:
            Projector(app, fresh_pg, database_url=fresh_pg).step(store)
    finally:
        app.close()
    failed = cli("health", "--json")
    assert failed.exit_code == 1, failed.output
    down = checks(failed)["workers"]
    assert not down["ok"]
    assert not down["degraded"]
    assert down["detail"].startswith("no worker alive: 1 attempt pending, last worker beat ")
    assert f"({alive['process']}); start `provisioner worker`" in down["detail"]
    assert down["since"]
    assert [n for n, c in checks(failed).items() if not c["ok"]] == ["workers"]
    stuck = checks(failed)["stuck_attempts"]  # none overdue yet, but not "all well"
    assert stuck["degraded"], stuck
    assert stuck["detail"].endswith("but no worker is alive to run them (see `workers`)")
    said = cli("health")
    assert any(line.startswith("FAILING  workers: no worker alive: ")
               for line in said.stdout.splitlines())  # fmt: skip

    with WorkerThread(settings):
        until(lambda: [r for r in workers() if r["state"] == "alive"])
        back = cli("health", "--json")
    assert back.exit_code == 0, back.output
    assert checks(back)["workers"]["detail"].startswith("1 alive (1 threads, ")


@pytest.mark.postgres
@pytest.mark.rabbitmq
def test_a_gateway_url_that_never_answered_fails_health_and_the_worker_says_so(
    fresh_pg: str, rabbit_session_url: str, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    port = free_port()
    env = clean_env(
        PROVISIONER_DATABASE_URL=fresh_pg, PROVISIONER_BROKER_URL=rabbit_session_url,
        PROVISIONER_GATEWAY_URL=url, PROVISIONER_GATEWAY_TOKEN="t0ken-fleet",
        PROVISIONER_PARENT_IDS=PARENT, PROVISIONER_METRICS_PORT=str(port),
        PROVISIONER_WEB_TOKEN="t0ken-web",
    )  # fmt: skip
    done = CliRunner(env=env).invoke(main, ["health"])
    assert done.exit_code == 1, done.output
    [line] = [x for x in done.stdout.splitlines() if "gateway:" in x]
    assert line.startswith(
        f"FAILING  gateway: the gateway at {url} has never answered any process of this "
        "deployment, nor this check (connection refused): check PROVISIONER_GATEWAY_URL"
    ), line

    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen([PROVISIONER, "worker", "--concurrency", "1"], env=env,
                                  stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        errors = until(lambda: [json.loads(x) for x in log.read_text().splitlines()
                                if '"ERROR"' in x], 30)  # fmt: skip
        ready = until(lambda: get_json(port, "/readyz", "t0ken-web"), 30)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    assert errors[0]["logger"] == "provisioner.gateway.lifecycle"
    assert errors[0]["message"] == (
        f"the gateway at {url} has never answered since this process started (connection "
        "refused); check PROVISIONER_GATEWAY_URL"
    )
    assert "t0ken-fleet" not in log.read_text()
    assert ready["status"] == "failing"  # the worker's readiness: a setting is wrong
    gateway = next(c for c in ready["checks"] if c["name"] == "gateway")
    assert gateway["detail"].startswith(f"the gateway at {url} has never answered"), gateway


def get_json(port: int, path: str, token: str) -> dict[str, Any] | None:
    """The answer's JSON, whatever its status; None while nothing answers."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except OSError:
        return None
    found: dict[str, Any] = json.loads(body)
    if found.get("checks") and any(c.get("name") == "startup" for c in found["checks"]):
        return None  # still starting
    return found


def test_a_silent_relay_fails_its_own_readiness_and_degrades_those_that_wait_on_it(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    init_database(url)
    init_read_models(url)
    relay = Heartbeat(url, "relay", every_s=0, clock=lambda: time.time() - 600)
    assert relay.beat()
    relay.close()
    settings = Settings.from_env({"PROVISIONER_DATABASE_URL": url})

    def relay_check(*parts: str) -> CheckResult:
        checks, _ = checks_for(settings, parts, gateway=None)
        return next(r for r in Health(checks).run() if r.name == "relay_heartbeat")

    for waits in (relay_check("worker"), relay_check("reconciler")):
        assert (waits.ok, waits.degraded) == (True, True)  # ready: the reconciler re-publishes
        assert waits.detail.startswith("the relay has not beaten for 600 s")
    for runs in (relay_check("relay"), relay_check("worker", "relay", "projections",
                                                   "reconciler")):  # fmt: skip
        assert (runs.ok, runs.degraded) == (False, False)
    checks, _ = checks_for(settings, ("projections",), gateway=None)
    assert "relay_heartbeat" not in [name for name, _ in checks]


def test_the_reconciler_says_the_relay_is_silent_and_since_when(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    seed_histories(app, len(FATES))
    relay = Heartbeat(url, "relay", every_s=0)
    assert relay.beat()  # beat now: an hour later, silent for most of it
    relay.close()
    later = datetime.now(UTC) + timedelta(hours=1)
    try:
        with SqlViewStore(url) as store:
            store.setup()
            Projector(app, url, database_url=url).step(store)
            with caplog.at_level(logging.WARNING, "provisioner.reconciler"):
                report = Reconciler(url).sweep(store, RecordingBroker(), now=later)  # type: ignore[arg-type]
    finally:
        app.close()
    assert report.hops
    [line] = [r.getMessage() for r in caplog.records if "hops were overdue" in r.getMessage()]
    since = datetime.fromtimestamp(relay.started_at + 60, UTC).strftime("%H:%M")
    assert f"the relay is silent since {since}" in line, line
    assert f"(last beat in {relay.process})" in line
    assert "no worker has ever beaten in this database" in line
