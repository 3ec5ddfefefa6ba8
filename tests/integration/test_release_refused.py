"""A release the gateway refuses for good, end to end: PostgreSQL, RabbitMQ, the worker
and the relay, and the fake over HTTP answering the project deletes of one workspace
409. The refusal is a decision on record (`ReleaseRefused`, with the gateway's words),
the workspace keeps its projects, and nothing sends the release again: not a
redelivered release, not the reconciler. What an operator reads says so."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest
from click.testing import CliRunner

from domain.attempt import ProvisioningAttempt
from domain.policies import AttemptState
from infrastructure.broker import messages
from infrastructure.broker.publisher import Broker
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.settings.model import Settings
from infrastructure.views.queries import list_attempts
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


def refusals(runtime: Runtime, attempt_id: UUID) -> list[ProvisioningAttempt.ReleaseRefused]:
    return [
        e
        for e in runtime.app.events.get(attempt_id)
        if isinstance(e, ProvisioningAttempt.ReleaseRefused)
    ]


def deletes(fake: FakeGateway) -> tuple[int, int]:
    """(project deletes received, of them refused), as the fake counts them."""
    state = fake.state()
    return state["calls"]["delete_project"], state["faults"].get("delete_refused", 0)


def test_a_release_refused_for_good_is_recorded_once_and_never_sent_again(
    pg_database: str, rabbit_url: str, fake: FakeGateway, brand_id: str, title: str
) -> None:
    # A created workspace that never settles keeps the attempt pending with its
    # candidate; hop 1 is a minute away, so nothing but the release touches it.
    fake.script(title, "zombie")
    env = environment(pg_database, rabbit_url, fake, PROVISIONER_BACKOFF_BASE_S="60")
    with build(Settings.from_env(env)) as runtime:
        publisher = Broker(rabbit_url, runtime.topology, scheduler=None)
        try:
            with components(runtime, relay=True) as running:
                assert running.worker is not None
                stats = running.worker.stats
                attempt_id = runtime.service.request_provisioning(brand_id, title, PARENT)
                workspace_id: str = wait_for(
                    lambda: runtime.service.attempt(attempt_id).candidate_id or "",
                    "the first hop to create the candidate",
                    timeout=20,
                )
                projects = [fake.add_project(workspace_id) for _ in range(2)]
                fake.refuse_deletes(workspace_id, 409, LOCKED)

                publisher.publish(messages.deactivate(brand_id))  # cancels: owes the release
                [refused] = wait_for(
                    lambda: refusals(runtime, attempt_id), "the refusal on record", timeout=20
                )
                after_refusal = deletes(fake)
                publisher.publish(messages.release(attempt_id))  # as a redelivery would
                wait_for(lambda: stats.by_type.get("release", 0) >= 2, "the second release")
                attempt = runtime.service.attempt(attempt_id)
                claim = runtime.service.claim(workspace_id)
                dead = stats.dead_lettered
        finally:
            publisher.close()
        later = datetime.now(UTC) + timedelta(hours=2)  # past any grace, window or deadline
        with SqlViewStore(pg_database) as store:
            store.setup()
            catch_up_all(runtime.app, store)
            swept = RecordingBroker()
            Reconciler(pg_database).sweep(store, swept, now=later)  # type: ignore[arg-type]
            [row] = list_attempts(store, brand_id=brand_id)
    runner = CliRunner(env={"PROVISIONER_DATABASE_URL": pg_database, "COLUMNS": "200"})
    story = runner.invoke(main, ["attempt", str(attempt_id), "--json"])
    shown = runner.invoke(main, ["attempt", str(attempt_id)])

    # On record, once, with the gateway's own words; the attempt owes nothing more.
    assert refused.workspace_id == workspace_id
    assert "HTTP 409" in refused.message
    assert LOCKED in refused.message
    assert attempt.state is AttemptState.CANCELLED
    assert attempt.refused_ids == (workspace_id,)
    assert attempt.owed_releases == ()
    assert claim is not None
    assert claim.brand_id is None  # given back: not ours to hold while it cannot be emptied
    # One delete asked and refused; the redelivered release asked for none.
    assert after_refusal == (1, 1)
    assert deletes(fake) == (1, 1)
    assert dead == 0
    left = upstream_workspace(fake, workspace_id)
    assert left["projects"] == projects  # nothing deleted
    assert left["refuse_deletes"] == {"status": 409, "message": LOCKED}
    # The reconciler sends no release for it, however late.
    assert [m.type for m in swept.sent if m.fields.get("attempt_id") == attempt_id] == []
    assert row["release_owed"] == 0
    assert row["state"] == "cancelled"
    # The operator reads the refusal and its message on the attempt's story.
    assert story.exit_code == 0, story.output
    [event] = [e for e in json.loads(story.output)["events"] if e["type"] == "ReleaseRefused"]
    assert event["workspace_id"] == workspace_id
    assert LOCKED in event["message"]
    assert shown.exit_code == 0, shown.output
    words = " ".join(shown.output.split())
    assert "ReleaseRefused" in words
    assert LOCKED in words
