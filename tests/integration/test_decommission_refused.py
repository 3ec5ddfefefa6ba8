"""A decommission the gateway refuses for good, end to end: PostgreSQL, RabbitMQ, the
worker and the relay, and the fake over HTTP answering the project deletes of the
brand's workspace 409. The refusal is a decision on record (`DecommissionRefused`,
with the gateway's words): the workspace keeps its projects, stays bound and
claimed, nothing is dead-lettered and the reconciler sends no decommission for
it. Once the refusal is lifted upstream, the operator's `deactivate --purge-now`
empties and unbinds it."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from domain.brand import Brand
from domain.ids import brand_aggregate_id
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.settings.model import Settings
from infrastructure.views.store import SqlViewStore
from tests.conftest import PARENT
from tests.integration.messaging_support import components, environment, wait_for
from tests.readmodels import catch_up_all
from tests.support import RecordingBroker, upstream_workspace
from worker.cli.main import main
from worker.reconciler import Reconciler
from worker.runtime import Runtime, build

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]
LOCKED = "project locked by a legal hold"


def refusals(runtime: Runtime, brand_id: str) -> list[Brand.DecommissionRefused]:
    events = runtime.app.events.get(brand_aggregate_id(brand_id))
    return [e for e in events if isinstance(e, Brand.DecommissionRefused)]


def refuse_deletes_over_http(fake: FakeGateway, workspace_id: str, status: int) -> None:
    request = urllib.request.Request(
        f"{fake.url}/_fake/workspaces/{workspace_id}/refuse-deletes",
        data=json.dumps({"status": status}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 200


def swept_decommissions(database_url: str, runtime: Runtime) -> list[str]:
    """The brands a reconciler sweep, well past every grace, sends a decommission for."""
    with SqlViewStore(database_url) as store:
        store.setup()
        catch_up_all(runtime.app, store)
        swept = RecordingBroker()
        later = datetime.now(UTC) + timedelta(hours=2)
        Reconciler(database_url).sweep(store, swept, now=later)  # type: ignore[arg-type]
    return [m.fields["brand_id"] for m in swept.sent if m.type == "decommission"]


def test_a_refused_decommission_is_kept_until_the_operator_deactivates_it_again(
    pg_database: str, rabbit_url: str, fake: FakeGateway, brand_id: str, title: str
) -> None:
    env = environment(pg_database, rabbit_url, fake)
    runner = CliRunner(env={**env, "COLUMNS": "250"})
    with build(Settings.from_env(env)) as runtime, components(runtime, relay=True) as running:
        assert running.worker is not None
        stats = running.worker.stats
        runtime.service.request_provisioning(brand_id, title, PARENT)
        workspace_id: str = wait_for(
            lambda: runtime.service.brand(brand_id).workspace_id or "",
            "the brand to be bound",
            timeout=20,
        )
        projects = [fake.add_project(workspace_id) for _ in range(2)]
        fake.refuse_deletes(workspace_id, 409, LOCKED)

        runtime.service.deactivate(brand_id, purge_now=True)  # the relay sends the decommission
        [refused] = wait_for(lambda: refusals(runtime, brand_id), "the refusal", timeout=20)
        wait_for(lambda: stats.by_type.get("decommission"), "the decommission to be handled")
        brand = runtime.service.brand(brand_id)
        claim = runtime.service.claim(workspace_id)
        left = upstream_workspace(fake, workspace_id)
        sent = swept_decommissions(pg_database, runtime)
        status = runner.invoke(main, ["status", brand_id, "--json"])
        status_text = runner.invoke(main, ["status", brand_id])
        history = runner.invoke(main, ["history", brand_id, "--json"])
        history_text = runner.invoke(main, ["history", brand_id])
        dead = stats.dead_lettered
        handled = stats.by_type.get("decommission")

        refuse_deletes_over_http(fake, workspace_id, 0)  # fixed upstream
        retry = runner.invoke(main, ["deactivate", brand_id, "--purge-now"])
        wait_for(
            lambda: runtime.service.brand(brand_id).workspace_id is None,
            "the workspace to be emptied and unbound",
            timeout=20,
        )
        after = runtime.service.brand(brand_id)
        claim_after = runtime.service.claim(workspace_id)
        dead_after = stats.dead_lettered

    # On record with the gateway's words; the workspace kept, bound and ours.
    assert refused.workspace_id == workspace_id
    assert "HTTP 409" in refused.message
    assert LOCKED in refused.message
    assert brand.workspace_id == workspace_id
    assert brand.emptying_refused == refused.message
    assert brand.decommissioning is None
    assert claim is not None
    assert claim.brand_id == brand_id
    assert left["projects"] == projects
    # Not retried, not dead-lettered; the reconciler sends none for it, however late.
    assert handled == 1
    assert dead == 0
    assert brand_id not in sent
    # What the operator reads: the refusal, its words, and what to do.
    assert status.exit_code == 0, status.output
    assert json.loads(status.output)["emptying_refused"] == refused.message
    assert status_text.exit_code == 0, status_text.output
    words = " ".join(status_text.output.split())
    assert LOCKED in words
    assert f"provisioner deactivate {brand_id} --purge-now" in words
    assert history.exit_code == 0, history.output
    [entry] = [e for e in json.loads(history.output) if e.get("type") == "DecommissionRefused"]
    assert LOCKED in entry["reason"]
    assert "DecommissionRefused" in " ".join(history_text.output.split())
    # Lifted upstream, the operator's retry empties and unbinds it.
    assert retry.exit_code == 0, retry.output
    assert after.emptying_refused is None
    assert upstream_workspace(fake, workspace_id)["projects"] == []
    assert claim_after is not None
    assert claim_after.brand_id is None
    assert dead_after == 0
