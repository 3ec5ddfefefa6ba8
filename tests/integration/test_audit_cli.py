"""The audit commands read the story of a brand straight from the event store."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.store.eventstore import open_event_store
from infrastructure.views.log_source import LogSource
from infrastructure.views.store import PROJECTIONS, SqlViewStore
from projections.core import catch_up
from tests.conftest import PARENT
from tests.support import ManualClock
from worker.cli.main import main


def test_status_history_and_attempt_tell_a_brands_story(
    tmp_path: Path, fake: FakeGateway, http_gateway: HttpGateway
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    clock = ManualClock()
    service = ProvisioningService(open_event_store(url), http_gateway, clock=clock)
    fake.configure(settle_polls=5)
    first = service.request_provisioning("b-audit", "Audit Co", PARENT)
    service.run_hop(first, 0)
    clock.advance(601)
    second = service.request_provisioning("b-audit", "Audit Co", PARENT)  # supersedes
    fake.configure(settle_polls=0)
    service.run_hop(first, 1)  # stands down, releases what it created
    promoted = service.run_hop(second, 0)
    env = {"PROVISIONER_DATABASE_URL": url}
    runner = CliRunner(env=env)

    status = json.loads(runner.invoke(main, ["status", "b-audit", "--json"]).output)
    story = json.loads(runner.invoke(main, ["history", "b-audit", "--json"]).output)
    history = [item for item in story if item["kind"] == "attempt"]
    one = json.loads(runner.invoke(main, ["attempt", str(first), "--json"]).output)
    unknown = runner.invoke(main, ["status", "nobody"])
    bad_id = runner.invoke(main, ["attempt", "not-a-uuid"])
    with SqlViewStore(url) as store:  # the attempts read model, for an id's prefix
        store.setup()
        for name in ("attempts", "brand_workspaces"):
            catch_up(PROJECTIONS[name], LogSource(service.app), store)
    by_prefix = json.loads(runner.invoke(main, ["attempt", str(first)[:8], "--json"]).output)
    no_such = runner.invoke(main, ["attempt", "0000"])
    listed = json.loads(runner.invoke(main, ["brands", "--status", "ready", "--json"]).output)
    failed = json.loads(runner.invoke(main, ["brands", "--reason", "exhausted", "--json"]).output)
    table = runner.invoke(main, ["brands"], terminal_width=120)

    assert status["lifecycle"] == "active"
    assert status["status"] == "ready"
    assert status["workspace_id"] == promoted.workspace_id
    assert status["attempt_id"] == str(second)
    assert [a["attempt_id"] for a in history] == [str(first), str(second)]
    assert [a["state"] for a in history] == ["superseded", "promoted"]
    assert [e["type"] for e in one["events"]][-2:] == ["Superseded", "CandidateReleased"]
    superseded = next(e for e in one["events"] if e["type"] == "Superseded")
    assert superseded["reason"] == f"superseded by attempt {second}"
    accepted = next(e for e in one["events"] if e["type"] == "CandidateAccepted")
    assert accepted["provenance"] == "created"
    assert set(accepted) == {
        "at", "type", "hop", "workspace_id", "provenance", "reason", "message", "deferred",
        "spent",
    }  # fmt: skip
    assert accepted["spent"] is None  # no wait; a scheduled hop says whether it spent budget
    # Its one wait followed its create: no settle budget spent (decision 049).
    assert [e["spent"] for e in one["events"] if e["type"] == "HopScheduled"] == [False]
    assert [item["type"] for item in story if item["kind"] == "brand"] == [
        "Registered", "WorkspaceBound"
    ]  # fmt: skip
    assert unknown.exit_code == 1
    assert "no brand 'nobody'" in unknown.output
    assert bad_id.exit_code == 1
    assert "not an attempt id" in bad_id.output
    assert by_prefix["attempt_id"] == str(first)
    assert [(b["brand_id"], b["status"]) for b in listed] == [("b-audit", "ready")]
    assert listed[0]["workspace_id"] == promoted.workspace_id
    assert failed == []
    assert table.exit_code == 0, table.output
    assert "b-audit" in table.output
    assert "1 brands" in table.output
    assert no_such.exit_code == 1
    assert "no attempt has an id starting with '0000'" in no_such.output
    text = runner.invoke(main, ["history", "b-audit"])
    assert text.exit_code == 0
    assert "Superseded" in text.output
