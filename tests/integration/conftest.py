"""RabbitMQ fixtures for the messaging tests.

`rabbit_url` checks that the broker answers (a test skips on a laptop without
it and FAILS in CI, as with PostgreSQL), and empties the project's queues
(provisioning.hops, .commands, .dead and every provisioning.wait.<ms>) before
and after each test, so that no message of one test reaches another.

Isolation from other users of the same broker: when `rabbitmqctl` works (root
on the test machines) the session runs in a virtual host of its own, created
here and deleted at the end, so that purging queues and closing connections
never touch a benchmark or a second test run on the default vhost. Without
`rabbitmqctl`, or with PROVISIONER_TEST_AMQP set, the tests use that URL (by
default the default vhost) as is.

Wait queues have no fixed names; they are listed with `rabbitmqctl` when it is
available and otherwise remembered from earlier listings. They are purged
first: a message expiring from one while the work queue is being purged would
otherwise land in the next test.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from kombu import Connection

from infrastructure.broker.topology import (
    COMMANDS_QUEUE,
    DEAD_QUEUE,
    HOPS_QUEUE,
    WAIT_PREFIX,
    Topology,
)
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.store.eventstore import open_event_store
from infrastructure.views.store import SqlViewStore
from tests.conftest import unavailable
from tests.integration.messaging_support import (
    Vhost,
    apply_permissions,
    cli,
    cli_env,
    environment,
    list_queues,
    remove_vhost,
    sqlite_url,
    user_url,
)
from tests.readmodels import assert_projections_match
from tests.support import rabbitmqctl

BROKER = "amqp://guest:guest@127.0.0.1:5672"
FIXED_QUEUES = (HOPS_QUEUE, COMMANDS_QUEUE, DEAD_QUEUE)

# Wait queues seen in any listing of this session (they are never deleted).
_known_wait_queues: set[str] = set()
_listed: list[bool] = []  # non-empty once a listing was attempted this session


# The longest modules first (seconds alone, 2026-12): `make test` runs this suite on both
# cores, one module per core at a time (`-n 2 --dist loadfile`), and a long module handed
# out last would leave one core idle while it runs.
LONGEST_FIRST = (
    "test_reliability.py",  # ~115 s
    "test_health.py",  # ~60 s
    "test_outages.py",  # ~55 s
    "test_cli_crowd.py",  # ~37 s
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every other module keeps its order


def purge(url: str, *, list_wait_queues: bool) -> None:
    """Empty the wait queues first, then the work, command and dead-letter queues."""
    if list_wait_queues:
        _listed.append(True)
        listed = list_queues(url)
        if listed is not None:
            _known_wait_queues.update(q for q in listed if q.startswith(WAIT_PREFIX))
    with Connection(url, connect_timeout=3) as conn:
        conn.ensure_connection(max_retries=1)
        channel = conn.channel()
        Topology().declare(channel)
        for name in sorted(_known_wait_queues):
            try:
                channel.queue_purge(name)
            except conn.channel_errors:  # deleted meanwhile: forget it
                _known_wait_queues.discard(name)
                channel = conn.channel()
        for name in FIXED_QUEUES:
            channel.queue_purge(name)


def _reachable(url: str) -> None:
    with Connection(url, connect_timeout=3) as conn:
        conn.ensure_connection(max_retries=1)


@pytest.fixture(scope="session")
def rabbit_session_url() -> Iterator[str]:
    """The broker URL for this session: a fresh vhost when rabbitmqctl can make one."""
    given = os.environ.get("PROVISIONER_TEST_AMQP")
    if given:
        yield given
        return
    try:
        _reachable(f"{BROKER}//")
    except Exception as exc:  # any failure to reach the broker
        unavailable("RabbitMQ", exc)
    vhost = f"provisioner_test_{uuid.uuid4().hex[:10]}"
    try:
        rabbitmqctl("add_vhost", vhost)
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    except (OSError, RuntimeError, subprocess.TimeoutExpired):
        yield f"{BROKER}//"  # no rabbitmqctl here: share the default vhost
        return
    try:
        yield f"{BROKER}/{quote(vhost, safe='')}"
    finally:
        rabbitmqctl("delete_vhost", vhost)


@pytest.fixture
def rabbit_url(rabbit_session_url: str) -> Iterator[str]:
    """The broker's URL, with the project's queues empty before and after the test."""
    try:
        _reachable(rabbit_session_url)
    except Exception as exc:  # any failure to reach the broker
        unavailable("RabbitMQ", exc)
    purge(rabbit_session_url, list_wait_queues=not _listed)
    yield rabbit_session_url
    purge(rabbit_session_url, list_wait_queues=True)


@pytest.fixture(autouse=True)
def projections_match_replay(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every scenario on an event store: both projections, caught up, equal the
    state replayed from the event log for every brand and attempt the test touched."""
    names = request.fixturenames
    source = next((n for n in ("database_url", "pg_database") if n in names), None)
    if source is None or request.node.get_closest_marker("raw_events"):
        yield
        return
    url: str = request.getfixturevalue(source)
    app = open_event_store(url, pool_size=2)
    try:
        head = app.recorder.max_notification_id() or 0
        yield
        with SqlViewStore(url) as store:
            store.setup()
            assert_projections_match(app, store, head)
    finally:
        app.close()


@pytest.fixture
def pg_env(pg_database: str, rabbit_url: str, fake: FakeGateway) -> dict[str, str]:
    """The settings of a test on the session's PostgreSQL and its RabbitMQ vhost."""
    return environment(pg_database, rabbit_url, fake)


@pytest.fixture
def vhost(tmp_path: Path, fake: FakeGateway) -> Iterator[Vhost]:
    """A vhost of the test's own, with a service user and a producer user made by the
    lines `provisioner broker init --print-permissions` prints, and the topology
    declared by the service user; all removed at the end, whatever happened."""
    if shutil.which("rabbitmqctl") is None:
        unavailable("rabbitmqctl", FileNotFoundError("rabbitmqctl is not on PATH"))
    tag = uuid.uuid4().hex[:10]
    name, service, producer = f"perm_test_{tag}", f"perm_svc_{tag}", f"perm_producer_{tag}"
    passwords = {user: secrets.token_hex(16) for user in (service, producer)}
    env = cli_env(sqlite_url(tmp_path), "memory://", fake)
    printed = cli(env, "broker", "init", "--print-permissions",
                  "--producer", producer, "--service-user", service, "--vhost", name)  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    try:
        try:
            apply_permissions(printed.stdout, passwords)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            unavailable("RabbitMQ (rabbitmqctl)", exc)
        service_url = user_url(service, passwords[service], name)
        init = cli(cli_env(sqlite_url(tmp_path), service_url, fake), "broker", "init")
        assert init.returncode == 0, init.stderr  # the service may declare its topology
        yield Vhost(name, service_url, user_url(producer, passwords[producer], name))
    finally:
        left = remove_vhost(name, [service, producer])
    assert not left, f"the clean-up left things behind: {left}"
