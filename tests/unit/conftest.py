"""The unit tests' layer under tests/conftest.py: the same `service` fixture, on an
event store in memory and the gateway in memory (`MemoryGateway`, one parent:
`PARENT`), with no sockets and no database. A module changes `gateway`,
`settings` or `jitter` by overriding that fixture alone."""

from __future__ import annotations

import pytest

from domain.waits import Backoff
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import ProvisionerApplication, open_event_store
from tests.memory_gateway import PARENT, MemoryGateway


@pytest.fixture
def app() -> ProvisionerApplication:
    return open_event_store("memory://")


@pytest.fixture
def gateway() -> MemoryGateway:
    return MemoryGateway(PARENT)


@pytest.fixture
def settings() -> EngineSettings:
    """A settle budget of 3 hops after the first, 5 s doubling between them; a
    decommission empties at once (a test of the retention window sets one)."""
    return EngineSettings(backoff=Backoff(5.0, 3), decommission_delay_s=0.0)
