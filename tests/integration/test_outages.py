"""Outages with real restarts: `provisioner run` rides out RabbitMQ stopped for
seconds and PostgreSQL restarted mid-run, and a worker refused for good (wrong
password, no such vhost) stops at once instead of retrying forever.

The restarts are of private servers (tests/services.py), never the shared ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from infrastructure.broker import messages
from infrastructure.broker.publisher import Broker
from infrastructure.failures import ServiceRefused
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.store.eventstore import init_database
from infrastructure.views.store import PROJECTIONS, SqlViewStore, init_read_models
from tests.conftest import PARENT, TOKEN
from tests.integration.messaging_support import wait_for
from tests.services import PgCluster, RabbitNode, pg_cluster, rabbit_node
from worker.projector import Projector
from worker.reconciler import Reconciler

__all__ = ["pg_cluster", "rabbit_node"]  # fixtures

ROOT = Path(__file__).resolve().parents[2]
PROVISIONER = ROOT / ".venv" / "bin" / "provisioner"
# 60 in `make test`; the 300 by hand: PROVISIONER_TEST_OUTAGE_BRANDS=300.
BRANDS = int(os.environ.get("PROVISIONER_TEST_OUTAGE_BRANDS", "60"))
COMPONENTS = ("worker", "relay", "projections", "reconciler")


def env_of(database_url: str, broker_url: str, fake: FakeGateway) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
    return {
        **base,
        "PROVISIONER_ALLOW_MIXED_EMBEDDED": "1",  # SQLite with RabbitMQ, on purpose
        "PROVISIONER_DATABASE_URL": database_url,
        "PROVISIONER_BROKER_URL": broker_url,
        "PROVISIONER_GATEWAY_URL": fake.url,
        "PROVISIONER_PARENT_IDS": ",".join(fake.parents),
        "PROVISIONER_GATEWAY_TOKEN": TOKEN,
        "PROVISIONER_GATEWAY_TIMEOUT_S": "5",
        "PROVISIONER_LOG_FORMAT": "text",  # the lines below are read as text
        "PROVISIONER_BACKOFF_BASE_S": "0.05",
        "PROVISIONER_CONCURRENCY": "8",
    }


def command() -> list[str]:
    if PROVISIONER.exists():
        return [str(PROVISIONER)]
    return [sys.executable, "-m", "worker.cli.main"]


@contextmanager
def process(
    env: dict[str, str], log: Path, *args: str, verbose: bool = True
) -> Iterator[subprocess.Popen[str]]:
    """`provisioner [-v] ARGS` in a subprocess, its output in `log`; stopped on exit."""
    flags = ["-v"] if verbose else []
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*command(), *flags, *args], cwd=ROOT, env=env, stdout=out,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


def provision_all(broker_url: str, brands: list[str]) -> None:
    broker = Broker(broker_url, scheduler=None)
    try:
        for brand in brands:
            broker.publish(messages.provision(brand, f"Outage {brand}", PARENT))
    finally:
        broker.close()


def ready(database_url: str, brands: list[str]) -> int:
    marks = ", ".join("?" for _ in brands)
    with SqlViewStore(database_url) as store:
        rows = store.rows(
            PROJECTIONS["brand_workspaces"],
            f"status = 'ready' AND workspace_id IS NOT NULL AND brand_id IN ({marks})",
            brands,
        )
    return len(rows)


def creates_per_title(fake: FakeGateway, brands: list[str]) -> dict[str, int]:
    state = httpx.get(f"{fake.url}/_fake/state", timeout=5).json()
    return {brand: int(state["creates"].get(f"Outage {brand}", 0)) for brand in brands}


def outage_lines(log: str, component: str, service: str) -> tuple[list[str], list[str]]:
    """(outage lines, 'connected to' lines) a component logged about a service
    (a URL's start, as logged: credentials redacted)."""
    lines = [ln for ln in log.splitlines() if f" {component}: " in ln]
    down = [ln for ln in lines if f"{component}: {service}" in ln and " unavailable (" in ln]
    up = [ln for ln in lines if f"{component}: connected to {service}" in ln]
    return down, up


def run_through(
    env: dict[str, str], tmp_path: Path, database_url: str, broker_url: str, fake: FakeGateway,
    outage: Callable[[], None],
) -> str:  # fmt: skip
    """Provision BRANDS brands through `provisioner run` with `outage` in the middle;
    check that nothing was lost or doubled and the process is still running."""
    brands = [f"outage-{uuid.uuid4().hex[:10]}" for _ in range(BRANDS)]
    before, after = brands[:-10], brands[-10:]  # the last ones need the process back up
    fake.configure(latency_ms=100, settle_polls=2)  # several seconds of work
    log_path = tmp_path / "run.log"
    with process(env, log_path, "run") as proc:
        provision_all(broker_url, before)
        wait_for(lambda: ready(database_url, before) >= 3, "the first brands", timeout=30)
        in_flight = len(before) - ready(database_url, before)
        outage()
        provision_all(broker_url, after)
        wait_for(lambda: ready(database_url, brands) == BRANDS, "every brand ready", timeout=BRANDS)
        assert proc.poll() is None, log_path.read_text()[-3000:]
    assert in_flight >= 10, "the outage came too late to test anything"
    log = log_path.read_text()
    assert creates_per_title(fake, brands) == dict.fromkeys(brands, 1), "a workspace twice"
    assert "Traceback" not in log, log[-3000:]
    return log


@pytest.mark.rabbitmq
@pytest.mark.postgres
def test_run_rides_out_rabbitmq_stopped_for_seconds(
    rabbit_node: RabbitNode, pg_database: str, fake: FakeGateway, tmp_path: Path
) -> None:
    env = env_of(pg_database, rabbit_node.url, fake)

    def outage() -> None:
        rabbit_node.stop_app()
        time.sleep(5)  # the outage itself; nothing is asserted on time
        rabbit_node.start_app()

    log = run_through(env, tmp_path, pg_database, rabbit_node.url, fake, outage)

    redacted = f"amqp://guest:***@127.0.0.1:{rabbit_node.port}//"
    assert "guest:guest@" not in log
    down, up = outage_lines(log, "worker", redacted)
    assert len(down) == 1, log[-3000:]
    assert len(up) == 2, up  # at start, and once back
    for component in ("relay", "reconciler"):
        down, up = outage_lines(log, component, redacted)
        assert len(down) <= 1, (component, down)
        assert len(up) == len(down), (component, down, up)


@pytest.mark.rabbitmq
@pytest.mark.postgres
def test_run_rides_out_postgresql_stopped_for_seconds(
    pg_cluster: PgCluster, rabbit_url: str, fake: FakeGateway, tmp_path: Path
) -> None:
    database_url = pg_cluster.create_database(f"outage_{uuid.uuid4().hex[:8]}")
    init_database(database_url)
    init_read_models(database_url)
    env = env_of(database_url, rabbit_url, fake)

    def outage() -> None:
        pg_cluster.stop()  # fast shutdown: every connection is dropped
        time.sleep(4)  # the outage itself; nothing is asserted on time
        pg_cluster.start()

    log = run_through(env, tmp_path, database_url, rabbit_url, fake, outage)

    redacted = f"postgresql://postgres@127.0.0.1:{pg_cluster.port}/"
    for component in COMPONENTS:
        down, up = outage_lines(log, component, redacted)
        assert len(down) <= 1, (component, down)
        assert len(up) == len(down), (component, down, up)
    down, up = outage_lines(log, "projections", redacted)
    assert len(down) == 1, log[-3000:]


# ------------------------------------------------------------------ refused for good, or not yet up


@pytest.mark.rabbitmq
@pytest.mark.postgres
@pytest.mark.parametrize(
    ("broker_url", "words"),
    [
        ("amqp://guest:not-the-password@127.0.0.1:5672//", "403 ACCESS_REFUSED"),
        ("amqp://guest:guest@127.0.0.1:5672/no-such-vhost-{tag}", "530"),
    ],
    ids=["wrong-password", "no-such-vhost"],
)
def test_a_worker_refused_for_good_exits_at_once_with_one_line(
    broker_url: str, words: str, pg_database: str, fake: FakeGateway, tmp_path: Path
) -> None:
    broker_url = broker_url.format(tag=uuid.uuid4().hex[:6])  # a vhost nobody made
    env = env_of(pg_database, broker_url, fake)
    started = time.monotonic()
    with process(env, tmp_path / "worker.log", "worker") as proc:
        code = proc.wait(30)
    elapsed = time.monotonic() - started
    log = (tmp_path / "worker.log").read_text()

    assert code == 4, log  # infrastructure.failures.EXIT_REFUSED
    stopped = "worker stopped: RabbitMQ at"
    refusals = [ln for ln in log.splitlines() if words in ln and stopped in ln]
    assert len(refusals) == 1, log
    assert "not-the-password" not in log
    assert " unavailable (" not in log, "it retried a refusal"
    assert elapsed < 25, log


@pytest.mark.rabbitmq
@pytest.mark.postgres
def test_a_worker_started_before_the_broker_waits_for_it_then_works(
    rabbit_node: RabbitNode, pg_database: str, fake: FakeGateway, tmp_path: Path
) -> None:
    env = env_of(pg_database, rabbit_node.url, fake)
    brand = f"late-{uuid.uuid4().hex[:10]}"
    log_path = tmp_path / "run.log"
    rabbit_node.stop_app()  # the node is there, its port refuses connections
    try:
        # Without -v: the outage and the recovery show at the default level.
        with process(env, log_path, "run", verbose=False) as proc:
            wait_for(lambda: " unavailable (" in log_path.read_text(), "the outage line", 20)
            rabbit_node.start_app()
            provision_all(rabbit_node.url, [brand])
            wait_for(lambda: ready(pg_database, [brand]) == 1, "the brand ready", 60)
            assert proc.poll() is None
    finally:
        rabbit_node.start_app()  # idempotent; the module's next test needs it
    log = log_path.read_text()
    down, up = outage_lines(log, "worker", "amqp://guest:***@")
    assert len(down) == 1, log[-3000:]
    assert "ConnectionRefusedError" in down[0]
    assert len(up) == 1, log[-3000:]


@pytest.mark.postgres
def test_projections_and_reconciler_stop_on_a_database_that_refuses_for_good(
    pg_database: str,
) -> None:
    missing = pg_database.rsplit("/", 1)[0] + f"/no_such_db_{uuid.uuid4().hex[:6]}"
    projector = Projector(None, missing, database_url=missing)  # type: ignore[arg-type]
    reconciler = Reconciler(missing, interval_s=0.1)
    stop = threading.Event()
    try:
        with pytest.raises(ServiceRefused, match="does not exist"):
            projector.run(stop)
        with pytest.raises(ServiceRefused, match="does not exist"):
            reconciler.run(stop, Broker("memory://", scheduler=None))
    finally:
        stop.set()
