"""`provisioner health` on PostgreSQL with a Retry-After hold in the fleet's shared row
that is longer than PROVISIONER_RETRY_AFTER_MAX_S (left by a process with a longer cap,
or a release that believed an hour): health says so, its own gateway call waits for
the pace (no call reaches the gateway), and the hold is cut to the setting."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from domain.pacing import PaceState
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.pacing import PgPaceStore
from tests.conftest import PARENT, new_pg_database
from tests.integration.test_cli_edges import clean_env, run_cli
from tests.integration.test_health import a_worker_alive


@pytest.fixture
def own_database() -> Iterator[str]:
    """A database of its own: the session's holds other tests' processes, and one
    stopped without a word (a relay killed by a test) reads failing a minute later,
    whatever the hold."""
    with new_pg_database("provisioner_holds") as url:
        yield url


def _health(env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    done = run_cli(env, "health", "--json")
    return done, {c["name"]: c for c in json.loads(done.stdout)["checks"]}


@pytest.mark.postgres
@pytest.mark.parametrize(("cap", "hold_s"), [(None, 3600.0), ("60", 200.0)])
def test_health_says_a_hold_longer_than_the_setting_and_cuts_it(
    own_database: str, fake: FakeGateway, cap: str | None, hold_s: float
) -> None:
    settings = {"PROVISIONER_RETRY_AFTER_MAX_S": cap} if cap else {}
    cap_s = float(cap or 300)
    env = clean_env(
        PROVISIONER_DATABASE_URL=own_database, PROVISIONER_GATEWAY_URL=fake.url,
        PROVISIONER_GATEWAY_TOKEN="t0ken-holds", PROVISIONER_PARENT_IDS=PARENT, **settings,
    )  # fmt: skip
    store = PgPaceStore(own_database, fake.url)
    try:
        store.update(lambda state, now: (replace(state, paused_until=now + hold_s), None))
        # A worker that had answers from the gateway (a 429 among them) is alive.
        with a_worker_alive(own_database):
            done, checks = _health(env)
        state, now = store.read()
        store.update(lambda _state, _now: (PaceState(), None))
    finally:
        store.close()

    assert done.returncode == 0, done.stdout + done.stderr  # degraded: hops wait it out
    circuit = checks["gateway_circuit"]
    assert circuit["degraded"], circuit
    asked = re.search(r"the gateway asked for (\d+) s", circuit["detail"])
    assert asked, circuit["detail"]
    assert hold_s - 30 < int(asked.group(1)) <= hold_s  # the hold in force when cut
    assert f"PROVISIONER_RETRY_AFTER_MAX_S caps it at {cap_s:g} s" in circuit["detail"]
    assert checks["gateway"]["degraded"], checks["gateway"]  # held by the pace, not sent
    assert fake.state()["calls_total"] == 0
    assert state.paused_until - now <= cap_s  # cut for the whole fleet
