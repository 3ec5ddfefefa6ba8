"""Shared fixtures: real PostgreSQL databases, the fake gateway over HTTP, the service.

A test that needs PostgreSQL or RabbitMQ skips on a laptop without them, and
FAILS when PROVISIONER_REQUIRE_SERVICES=1 (set by .ci/run) or CI is set.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, settings

from domain.ports import Gateway
from domain.waits import Backoff, Deferral
from infrastructure.fake_gateway.config import FakeConfig
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import ProvisionerApplication, init_database, open_event_store
from infrastructure.views.store import init_read_models
from tests.support import ManualClock

# Hypothesis: `default` (what `make test` runs) is deterministic, with no example
# database and no deadline; `deep` (HYPOTHESIS_PROFILE=deep) searches far wider,
# for runs by hand. The property tests size themselves from the loaded profile.
_EVERY_PROFILE: dict[str, Any] = {
    "database": None,
    "deadline": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow],
    "phases": [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
}
settings.register_profile("default", derandomize=True, max_examples=100, **_EVERY_PROFILE)
settings.register_profile("deep", derandomize=False, max_examples=2_000, **_EVERY_PROFILE)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# The suite mixes the embedded default with real services on purpose (PostgreSQL with
# the in-process broker, SQLite with RabbitMQ), for CliRunner and the subprocesses
# that inherit this environment; the tests of the rule itself unset it.
os.environ.setdefault("PROVISIONER_ALLOW_MIXED_EMBEDDED", "1")
PG_ADMIN = os.environ.get("PROVISIONER_TEST_PG", "postgresql://root@127.0.0.1:5432/postgres")
TOKEN = "test-token-s3cr3t"
PARENT = "org-parent"


def services_required() -> bool:
    return bool(os.environ.get("PROVISIONER_REQUIRE_SERVICES") or os.environ.get("CI"))


def unavailable(what: str, exc: BaseException) -> None:
    message = f"{what} is not reachable: {exc}"
    if services_required():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@contextmanager
def new_pg_database(prefix: str) -> Iterator[str]:
    """A PostgreSQL database of its own, with the event store's and the read models'
    tables, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        unavailable("PostgreSQL", exc)
    url = f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    init_database(url)
    init_read_models(url)
    try:
        yield url
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped afterwards."""
    with new_pg_database("provisioner_test") as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'events.sqlite'}"
    url: str = request.getfixturevalue("pg_database")
    return url


@pytest.fixture
def app(database_url: str) -> Iterator[ProvisionerApplication]:
    application = open_event_store(database_url, pool_size=8)
    yield application
    application.close()


@pytest.fixture
def fake() -> Iterator[FakeGateway]:
    # A fresh seed per test: workspace ids (and so claim ids) never repeat across
    # tests that share one PostgreSQL database.
    with FakeGateway(FakeConfig(seed=uuid.uuid4().int % 2**31), parents=(PARENT,)) as gateway:
        yield gateway


@pytest.fixture
def http_gateway(fake: FakeGateway) -> Iterator[HttpGateway]:
    with HttpGateway(
        fake.url, TOKEN, connect_timeout=1.0, read_timeout=0.5, retries=1, retry_backoff_s=0.0
    ) as gateway:
        yield gateway


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def settings() -> EngineSettings:
    # A deadline of 10 minutes: an outage the tests keep up ends in a few dozen deferrals.
    return EngineSettings(
        backoff=Backoff(base_s=5.0, max_requeues=5),
        deferral=Deferral(base_s=2.0, max_s=30.0, deadline_s=600.0, retry_after_max_s=300.0),
        stale_after_s=600.0,
        decommission_delay_s=0.0,  # emptied at once; a test of the retention window sets it
    )


@pytest.fixture
def gateway(http_gateway: HttpGateway) -> Gateway:
    """The gateway the service calls: the fake over HTTP (tests/unit/conftest.py puts
    one in memory in its place)."""
    return http_gateway


@pytest.fixture
def jitter() -> Callable[[], float]:
    """Where in its spread a deferred hop falls: at random, as in production."""
    return random.random


@pytest.fixture
def service(
    app: ProvisionerApplication,
    gateway: Gateway,
    clock: ManualClock,
    settings: EngineSettings,
    jitter: Callable[[], float],
) -> ProvisioningService:
    """The one service fixture: the use cases on the `app`, `gateway`, `clock`,
    `settings` and `jitter` fixtures; a test module changes one of those, never this."""
    return ProvisioningService(app, gateway, clock=clock, settings=settings, jitter=jitter)


@pytest.fixture
def title() -> str:
    """A workspace title no other test uses (title slots live in the shared database)."""
    return f"Acme Shoes {uuid.uuid4().hex[:8]}"


@pytest.fixture
def brand_id() -> str:
    """A brand id no other test uses (tests share the session's database)."""
    return f"brand-{uuid.uuid4().hex[:12]}"
