"""`make reliability` at 120 brands, with a fixed seed: separate worker, relay,
projections and reconciler processes against the fake gateway over HTTP, under
every fault at once (tests/reliability), end with every promise held.

The seed is fixed so that CI is repeatable; `make reliability` draws a new one
each time (printed first) and `ARGS='--seed N'` repeats a run. Its outage is
shortened to 17 s, still longer than the run's settle budget (15.75 s): the
attempts in flight must ride it out deferred, none failed `exhausted`.

120 brands, not `make reliability`'s 300: every fault still fires (the test
asserts each one did), and the suite stays within its ten minutes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg
import pytest
from kombu import Connection

from tests.conftest import PG_ADMIN, unavailable
from tests.integration.conftest import BROKER
from tests.reliability.processes import ROOT
from tests.reliability.run import SETTLE_BUDGET_S

SEED = 20261130
BRANDS = 120
OUTAGE_S = 17.0


@pytest.mark.postgres
@pytest.mark.rabbitmq
@pytest.mark.timeout(660)
def test_a_hundred_and_twenty_brands_under_fire_keep_every_promise() -> None:
    try:
        psycopg.connect(PG_ADMIN, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        unavailable("PostgreSQL", exc)
    try:
        with Connection(f"{BROKER}//", connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # any failure to reach the broker
        unavailable("RabbitMQ", exc)
    done = subprocess.run(
        [sys.executable, "-m", "tests.reliability", "--brands", str(BRANDS), "--seed", str(SEED),
         "--database-url", PG_ADMIN, "--broker-url", f"{BROKER}/", "--outage-s", str(OUTAGE_S)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines, output[-5000:]
    assert lines[0] == f"seed {SEED}"
    summary = json.loads(lines[-1])
    assert summary["violations"] == {}, output[-8000:]
    assert done.returncode == 0, output[-5000:]
    assert summary["brands"] == BRANDS
    assert sum(summary["attempts"].values()) >= BRANDS
    # The faults happened: a run that injected nothing would prove nothing.
    assert summary["kills"] > 0, summary
    assert summary["backend_terminations"] > 0, summary
    assert summary["connection_closes"] > 0, summary
    assert summary["faults"]["hops_duplicated"] > 0, summary
    assert summary["faults"]["create_timeout_after_create"] > 0, summary
    # The gateway was metered and went down, for longer than the settle budget.
    assert OUTAGE_S > SETTLE_BUDGET_S
    gateway = summary["gateway"]
    assert gateway["pace"] == "configured" or gateway["rate_limited"] > 0, gateway
    assert summary["outages"], summary
    for outage in summary["outages"]:
        assert outage["seconds"] == OUTAGE_S, outage
        if outage["mode"] == "503":
            assert outage["calls"] > 0, outage
        else:
            assert outage["refused_seen"], outage
