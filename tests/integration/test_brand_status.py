"""`brand_workspaces` answers the host platform truthfully: a bound brand reads `ready`
until it is unbound, whatever its latest attempt, unless a re-confirm saw the gateway
report it terminal (`degraded`); a deactivated brand stops reading
`ready` at its `Deactivated` event. The live runner, a rebuild and the audit trail
agree; a copy built by older code is rebuilt by the runner on start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from domain.outcomes import Outcome
from domain.releases import DecommissionKind
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import ProvisionerApplication, open_event_store
from infrastructure.views.audit import brand_history, brand_status
from infrastructure.views.log_source import LogSource
from infrastructure.views.queries import brand_workspace, count_degraded
from infrastructure.views.store import PROJECTIONS, VERSIONS, SqlViewStore
from projections.core import catch_up, rebuild
from tests.conftest import PARENT
from tests.support import ManualClock
from worker.projector import Projector

BW = PROJECTIONS["brand_workspaces"]


def row_of(app: ProvisionerApplication, url: str, brand_id: str) -> dict[str, Any]:
    """The brand's row, with the live runner caught up."""
    with SqlViewStore(url) as store:
        store.setup()
        catch_up(BW, LogSource(app), store)
        row = brand_workspace(store, brand_id)
    assert row is not None
    return row


def bound(service: ProvisioningService, brand_id: str, title: str) -> str:
    """The brand bound: hop 0 creates its workspace and waits (never ready the instant
    its create returns), hop 1 polls it and promotes it."""
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    created = service.run_hop(attempt_id, 0)
    assert (created.outcome, created.next_hop) == (Outcome.SCHEDULED, 1)
    promoted = service.run_hop(attempt_id, 1)
    assert promoted.outcome is Outcome.PROMOTED
    workspace_id = service.brand(brand_id).workspace_id
    assert workspace_id is not None
    assert workspace_id == promoted.workspace_id == created.workspace_id
    return workspace_id


def test_a_failed_reconfirm_keeps_a_bound_brand_ready(
    service: ProvisioningService,
    fake: FakeGateway,
    database_url: str,
    brand_id: str,
    title: str,
) -> None:
    workspace_id = bound(service, brand_id, title)
    again = service.request_provisioning(brand_id, title, PARENT)  # re-confirms it
    pending = row_of(service.app, database_url, brand_id)
    fake.configure(unauthorized_rate=1.0)
    assert service.run_hop(again, 0).outcome is Outcome.FAILED
    fake.configure(unauthorized_rate=0.0)

    row = row_of(service.app, database_url, brand_id)

    assert (pending["status"], pending["attempt_state"]) == ("ready", "pending")
    assert (row["status"], row["workspace_id"]) == ("ready", workspace_id)
    assert row["attempt_state"] == "failed"  # the last attempt's outcome, on its own
    status = brand_status(service, brand_id)
    assert (status["status"], status["attempt_state"]) == ("ready", "failed")


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_reconfirm_that_sees_a_terminal_status_degrades_the_brand_and_keeps_its_id(
    service: ProvisioningService,
    fake: FakeGateway,
    database_url: str,
    brand_id: str,
    title: str,
) -> None:
    workspace_id = bound(service, brand_id, title)
    again = service.request_provisioning(brand_id, title, PARENT)  # re-confirms it
    # The gateway now reports the bound workspace broken (as a scripted fate would).
    fake._state.workspaces[workspace_id].fixed_status = "failed"

    assert service.run_hop(again, 0).outcome is Outcome.FAILED
    row = row_of(service.app, database_url, brand_id)
    with SqlViewStore(database_url) as store:
        ready = store.rows(BW, "status = 'ready' AND brand_id = ?", [brand_id])
        degraded = count_degraded(store)

    assert (row["status"], row["workspace_id"]) == ("degraded", workspace_id)
    assert (row["attempt_state"], row["failure_reason"]) == ("failed", "terminal_status")
    assert ready == []  # the host platform's query no longer returns it
    assert degraded >= 1
    assert brand_status(service, brand_id)["status"] == "degraded"


def test_a_deactivated_brand_stops_reading_ready_at_its_deactivation(
    service: ProvisioningService, database_url: str, brand_id: str, title: str
) -> None:
    workspace_id = bound(service, brand_id, title)
    service.deactivate(brand_id)

    deactivated = row_of(service.app, database_url, brand_id)
    audit = brand_status(service, brand_id)
    service.decommission(brand_id)
    decommissioned = row_of(service.app, database_url, brand_id)

    # Still shown (the platform must stop using it), but no longer `ready`.
    assert (deactivated["status"], deactivated["workspace_id"]) == ("deactivated", workspace_id)
    assert audit["status"] == "deactivated"
    assert (decommissioned["status"], decommissioned["workspace_id"]) == ("deactivated", None)


def test_a_rebuild_agrees_with_the_live_rows_and_an_outdated_copy_is_rebuilt_on_start(
    tmp_path: Path, fake: FakeGateway, http_gateway: HttpGateway
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    service = ProvisioningService(app, http_gateway, clock=ManualClock())
    bound(service, "b-ready", "Ready Co")
    bound(service, "b-gone", "Gone Co")
    service.deactivate("b-gone")
    service.request_provisioning("b-new", "New Co", PARENT)
    service.deactivate("b-never-seen")
    try:
        with SqlViewStore(url) as store:
            store.setup()
            catch_up(BW, LogSource(app), store)
            live = store.rows(BW, order="id")
            rebuild(BW, LogSource(app, store), store)
            rebuilt = store.rows(BW, order="id")
            # A deployment whose copy older code built: no version recorded, old meaning.
            with store._tx() as cur:
                cur.execute(f"DELETE FROM {VERSIONS}")
                cur.execute("UPDATE brand_workspaces_g2 SET status = 'ready'")
            # (`attempts` too: version 2 added `create_lost`.)
            assert [p.name for p in store.outdated()] == ["brand_workspaces", "attempts"]
            Projector(app, url, database_url=url).step(store)
            upgraded = store.rows(BW, order="id")
            outdated_after = store.outdated()
    finally:
        app.close()

    by_brand = {row["brand_id"]: row["status"] for row in live}
    assert by_brand == {
        "b-ready": "ready",
        "b-gone": "deactivated",
        "b-new": "pending",
        "b-never-seen": "deactivated",
    }
    assert rebuilt == live
    assert upgraded == live
    assert outdated_after == []


def test_a_deactivated_brand_shows_when_its_workspace_is_to_be_emptied(
    app: ProvisionerApplication,
    http_gateway: HttpGateway,
    database_url: str,
    brand_id: str,
    title: str,
) -> None:
    settings = EngineSettings(decommission_delay_s=3600.0)
    service = ProvisioningService(app, http_gateway, clock=ManualClock(), settings=settings)
    workspace_id = bound(service, brand_id, title)
    result = service.deactivate(brand_id)

    row = row_of(service.app, database_url, brand_id)
    status = brand_status(service, brand_id)
    [deactivated] = [e for e in brand_history(service, brand_id) if e.get("type") == "Deactivated"]

    due = result.to_be_emptied_at
    assert due is not None
    assert (row["status"], row["workspace_id"], row["purge_at"]) == (
        "deactivated",
        workspace_id,
        due,
    )
    assert status["to_be_emptied_at"] == due.isoformat()
    assert deactivated["reason"] == f"to be emptied at {due.isoformat(timespec='seconds')}"
    assert service.decommission(brand_id).kind is DecommissionKind.NOT_DUE  # not yet


def test_status_says_the_relay_is_silent_and_a_deactivated_brand_is_not_bound(
    tmp_path: Path, http_gateway: HttpGateway
) -> None:
    """A dead relay is named in a pending brand's advice; a deactivated brand whose
    workspace is kept for its retention window is told so, not "nothing to do"."""
    import json
    import time

    from click.testing import CliRunner

    from domain.liveness import Beat
    from infrastructure.views.connection import ViewConnection
    from infrastructure.views.heartbeats import _create, record
    from worker.cli.main import main

    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    settings = EngineSettings(decommission_delay_s=86_400.0)
    service = ProvisioningService(open_event_store(url), http_gateway, settings=settings)
    service.request_provisioning("b-waiting", "Waiting Co", PARENT)  # its hop never runs
    bound(service, "b-kept", "Kept Co")
    service.deactivate("b-kept")
    long_ago = time.time() - 600
    with ViewConnection(url, wait_s=0) as conn:
        _create(conn, time.time())
        record(conn, Beat("relay", "host:1", long_ago, long_ago))
    runner = CliRunner(env={"PROVISIONER_DATABASE_URL": url})

    waiting = json.loads(runner.invoke(main, ["status", "b-waiting", "--json"]).output)
    kept = json.loads(runner.invoke(main, ["status", "b-kept", "--json"]).output)

    assert "the relay is silent since" in waiting["advice"]
    assert "`provisioner relay`" in waiting["advice"]
    assert "is kept until" in kept["advice"]
    assert "nothing to do" not in kept["advice"]
