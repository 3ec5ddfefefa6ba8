"""A one-shot use of the event store (every /readyz probe, a CLI read) says nothing at
INFO; a long-running process says "connected to ..." once, at start."""

from __future__ import annotations

import logging

import pytest

from infrastructure.store.eventstore import init_database, open_event_store

pytestmark = pytest.mark.postgres


def test_only_a_long_running_store_says_it_connected(
    pg_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    init_database(pg_database)
    caplog.set_level(logging.INFO, logger="provisioner")

    for _ in range(3):  # three probes
        open_event_store(pg_database, one_shot=True, read_only=True, wait_s=0).close()
    probes = [r for r in caplog.records if "connected to" in r.getMessage()]
    open_event_store(pg_database, pool_size=1).close()
    started = [r for r in caplog.records if "connected to" in r.getMessage()]

    assert probes == []
    assert len(started) == 1
    assert started[0].levelno == logging.INFO
