"""A full database at start-up is a wait, not an exit: `provisioner run` started
while PostgreSQL refuses every new client ("sorry, too many clients already",
53300) says so once at WARNING, keeps waiting, and starts once connections free;
the fleet's pace store waits the same way. Both on a private cluster whose every
connection this test holds (tests/services.py), never on the shared server.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from infrastructure.failures import ServiceUnavailable
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.pacing import PgPaceStore
from infrastructure.store.eventstore import init_database
from infrastructure.views.store import init_read_models
from tests.integration.test_messaging import wait_for
from tests.integration.test_outages import env_of, process, provision_all, ready
from tests.services import PgCluster, _private

# Room for `run --concurrency 2` (about 20) with a margin; all of it is held below.
MAX_CONNECTIONS = 30


def _small(cluster: PgCluster) -> None:
    cluster.init()
    with (cluster.data / "postgresql.conf").open("a") as conf:
        conf.write(f"\nmax_connections = {MAX_CONNECTIONS}\n")
    cluster.start()


@pytest.fixture(scope="module")
def small_cluster() -> Iterator[PgCluster]:
    """A private cluster of MAX_CONNECTIONS connections (the superuser's included)."""
    yield from _private("a private PostgreSQL cluster", "prov-pg-full-", PgCluster, _small)


@pytest.fixture(scope="module")
def full_url(small_cluster: PgCluster) -> str:
    url = small_cluster.create_database(f"full_{uuid.uuid4().hex[:8]}")
    init_database(url)
    init_read_models(url)
    return url


@pytest.fixture
def hold_all(small_cluster: PgCluster) -> Iterator[list[psycopg.Connection[object]]]:
    """Every connection the cluster has, held until the test closes them (or its end)."""
    held: list[psycopg.Connection[object]] = []
    try:
        while True:
            try:
                held.append(psycopg.connect(small_cluster.url(), connect_timeout=3))
            except psycopg.OperationalError as exc:
                refused = str(exc)
                break
        assert "too many clients" in refused, refused
        yield held
    finally:
        release(held)


def release(held: list[psycopg.Connection[object]]) -> None:
    while held:
        held.pop().close()


@pytest.mark.rabbitmq
@pytest.mark.postgres
def test_run_started_on_a_full_database_waits_says_so_once_and_starts_when_it_frees(
    small_cluster: PgCluster, full_url: str, rabbit_url: str, fake: FakeGateway,
    hold_all: list[psycopg.Connection[object]], tmp_path: Path,
) -> None:  # fmt: skip
    assert len(hold_all) == MAX_CONNECTIONS
    log_path = tmp_path / "run.log"
    env = {**env_of(full_url, rabbit_url, fake), "PROVISIONER_CONCURRENCY": "2"}
    brand = f"full-{uuid.uuid4().hex[:10]}"
    where = f"postgresql://postgres@127.0.0.1:{small_cluster.port}/{full_url.rsplit('/', 1)[1]}"
    # Without -v: the wait and the connection show at the default level.
    with process(env, log_path, "run", verbose=False) as proc:
        wait_for(lambda: "full (too many clients)" in log_path.read_text(), "the wait", 15)
        time.sleep(2)  # still waiting: nothing in the wait has a timeout of its own
        assert proc.poll() is None, log_path.read_text()
        release(hold_all)
        wait_for(lambda: "running; Ctrl-C" in log_path.read_text(), "the start", 20)
        provision_all(rabbit_url, [brand])
        wait_for(lambda: ready(full_url, [brand]) == 1, "the brand ready", 30)
        assert proc.poll() is None, log_path.read_text()
    log = log_path.read_text()
    waits = [ln for ln in log.splitlines() if "full (too many clients)" in ln]
    assert len(waits) == 1, log
    assert " WARNING " in waits[0]
    assert f"database at {where} full (too many clients); waiting" in waits[0]
    assert "max_connections" in waits[0]
    assert "Database connections" in waits[0]
    connected = [ln for ln in log.splitlines() if f"database at {where}: connected after" in ln]
    assert len(connected) == 1, log
    assert " INFO " in connected[0]
    assert "Error:" not in log
    assert "Traceback" not in log


@pytest.mark.postgres
def test_the_pace_store_of_a_long_running_process_waits_for_a_full_database(
    small_cluster: PgCluster, full_url: str, hold_all: list[psycopg.Connection[object]],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    stop, made = threading.Event(), []
    stop.set()  # a stop (SIGTERM) during the wait ends it with the outage
    with pytest.raises(ServiceUnavailable, match="too many clients"):
        PgPaceStore(full_url, "http://gw", stop=stop)
    stop.clear()
    caplog.clear()
    opening = threading.Thread(
        target=lambda: made.append(PgPaceStore(full_url, "http://gw", stop=stop)), daemon=True
    )
    with caplog.at_level(logging.INFO, logger="provisioner.connect"):
        opening.start()
        wait_for(lambda: "full (too many clients)" in caplog.text, "the wait", 10)
        assert opening.is_alive()
        assert not made
        release(hold_all)
        opening.join(10)
    assert made, caplog.text
    try:
        assert made[0].read()[0] is not None  # the row is there, the pool answers
    finally:
        made[0].close()
    assert "connected after waiting" in caplog.text
