"""`make reliability` at 300 brands, with a fixed seed: separate worker, relay,
projections and reconciler processes against the fake gateway over HTTP, under
every fault at once (tests/reliability), end with every promise held.

The seed is fixed so that CI is repeatable; `make reliability` draws a new one
each time (printed first) and `ARGS='--seed N'` repeats a run.
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

SEED = 20261130
BRANDS = 300


@pytest.mark.postgres
@pytest.mark.rabbitmq
@pytest.mark.timeout(300)
def test_three_hundred_brands_under_fire_keep_every_promise() -> None:
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
         "--database-url", PG_ADMIN, "--broker-url", f"{BROKER}/"],
        cwd=ROOT, capture_output=True, text=True, timeout=280, check=False,
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
