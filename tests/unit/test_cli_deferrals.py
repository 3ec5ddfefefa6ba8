"""`provisioner attempt` and `provisioner history` as text, for an attempt whose hops
the gateway did not answer: the deferrals in a row are one row that says how many,
why and since when, and the title counts them apart from the settle budget."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from domain.ports import TransientGatewayError
from domain.waits import Backoff, Deferral
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import init_database, open_event_store
from tests.memory_gateway import MemoryGateway
from tests.support import ManualClock, words
from worker.cli.main import main

PARENT = "parent-1"


@pytest.fixture
def deferred(tmp_path: Path) -> dict[str, Any]:
    """Brand b1 in a SQLite event store: its attempt deferred 7 times (the family
    listing answered 503), then settled and promoted."""
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    init_database(url)
    gateway = MemoryGateway(PARENT)
    gateway.new_statuses = ["not ready", "ready"]
    gateway.fail["family"] = [TransientGatewayError("family: HTTP 503") for _ in range(7)]
    clock = ManualClock()
    deferral = Deferral(2.0, max_s=30.0, deadline_s=3600.0, retry_after_max_s=300.0)
    settings = EngineSettings(backoff=Backoff(5.0, 3), deferral=deferral)
    app = open_event_store(url)
    try:
        service = ProvisioningService(app, gateway, clock, settings, jitter=lambda: 0.5)
        attempt_id = service.request_provisioning("b1", "Acme", PARENT)
        hop = 0
        while (outcome := service.run_hop(attempt_id, hop)).next_hop is not None:
            clock.advance(outcome.delay_s or 0)
            hop = outcome.next_hop
    finally:
        app.close()
    runner = CliRunner(env={"PROVISIONER_DATABASE_URL": url, "COLUMNS": "100"})
    return {"runner": runner, "attempt": str(attempt_id)}


def _run(runner: CliRunner, *args: str) -> str:
    result = runner.invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _since(runner: CliRunner, attempt_id: str) -> str:
    """HH:MM:SS of the first deferral, from the JSON of the same story."""
    story = json.loads(_run(runner, "attempt", attempt_id, "--json"))
    [folded] = [e for e in story["events"] if e["deferred"]]
    assert folded["deferred"] == 7
    return str(folded["at"][11:19])


@pytest.mark.parametrize("command", ["attempt", "history"])
def test_deferrals_in_a_row_read_as_one_row_and_are_counted_in_the_title(
    deferred: dict[str, Any], command: str
) -> None:
    runner, attempt_id = deferred["runner"], deferred["attempt"]
    since = _since(runner, attempt_id)

    text = words(_run(runner, command, attempt_id if command == "attempt" else "b1"))

    assert (
        f"attempt {attempt_id} of brand b1: promoted; settle hops 1 of 3, "
        "7 deferred (the gateway did not answer)"
    ) in text
    assert f"deferred ×7: gateway unavailable: family: HTTP 503 since {since}" in text
    assert text.count("deferred ×") == 1  # one row, not seven
    assert re.search(r"HopScheduled 7 deferred ×7", text), text  # at the last deferred hop
