"""The ownership story end to end, on PostgreSQL, RabbitMQ and the fake over HTTP
(docs/operations.md, "Ownership"): a brand's first create times out having made
nothing, the next one succeeds and the brand is promoted; then a person makes a
workspace with the brand's title under the parent by hand and puts projects in it.
The reconciler's orphan re-checks, `audit --fix --yes` at once, and the same 30
days later, all leave it as it is."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner

from domain.upstream_audit import Kind
from infrastructure.fake_gateway.config import FakeConfig
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.settings.model import Settings
from infrastructure.store.eventstore import open_event_store
from infrastructure.usecases.upstream_audit import audit_parent, fix
from infrastructure.views.store import init_read_models
from tests.conftest import TOKEN
from tests.integration.running import drained, running
from tests.support import ManualClock
from worker.cli.main import main

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


def calls(fake: FakeGateway, operation: str) -> int:
    counted: dict[str, int] = fake.state()["calls"]
    return counted.get(operation, 0)


def test_a_hand_made_workspace_beside_a_lost_create_is_never_emptied(
    pg_database: str, rabbit_url: str
) -> None:
    parent = f"org-{uuid.uuid4().hex[:10]}"
    title, brand = f"Hand Made {uuid.uuid4().hex[:6]}", f"brand-{uuid.uuid4().hex[:8]}"
    init_read_models(pg_database)
    env = {
        "PROVISIONER_DATABASE_URL": pg_database, "PROVISIONER_BROKER_URL": rabbit_url,
        "PROVISIONER_PARENT_IDS": parent, "PROVISIONER_GATEWAY_TOKEN": TOKEN,
        "PROVISIONER_GATEWAY_TIMEOUT_S": "1", "PROVISIONER_CREATE_GRACE_S": "2",
        "PROVISIONER_BACKOFF_BASE_S": "0.2",
    }  # fmt: skip
    with FakeGateway(FakeConfig(seed=uuid.uuid4().int % 2**31), parents=(parent,)) as fake:
        env["PROVISIONER_GATEWAY_URL"] = fake.url
        fake.script(title, "timeout_without_create")  # the first create makes nothing
        with running(Settings.from_env(env), resend_s=0.5) as service:
            attempt_id = service.request_provisioning(brand, title, parent)
            deadline = time.monotonic() + 20
            while calls(fake, "create") < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            fake.script(title, "")  # the next one, after the grace, succeeds
            drained(service, [brand], timeout_s=30)
            bound = service.brand(brand).workspace_id
            # A person makes a same-title workspace by hand and puts projects in it.
            hand_made = fake.seed_workspace(title, parent, status="created", projects=2)["id"]
            looked = calls(fake, "family")
            while calls(fake, "family") < looked + 2 and time.monotonic() < deadline + 30:
                time.sleep(0.1)  # the reconciler's orphan re-checks read the family
            rechecked = calls(fake, "family") - looked
        runner = CliRunner(env=env)
        at_once = runner.invoke(main, ["audit", "--parent", parent, "--fix", "--yes", "--json"])
        later = thirty_days_later(pg_database, fake, parent, attempt_id)
        state = {w["id"]: w for w in fake.state()["workspaces"] if w["title"] == title}

    attempt = later["attempt"]
    assert attempt.create_lost  # the first create was given up unconfirmed
    assert bound is not None
    assert bound != hand_made
    assert rechecked >= 2
    assert at_once.exit_code == 1, at_once.output
    [finding] = [f for f in json.loads(at_once.output) if f["workspace_id"] == hand_made]
    assert (finding["kind"], finding["action"], finding["projects"]) == ("unclear", "none", 2)
    assert (finding["title"], finding["brand_ids"]) == (title, [brand])
    assert "done" not in finding
    assert [f.kind for f in later["findings"] if f.workspace_id == hand_made] == [Kind.FOREIGN]
    assert later["released"] == ()
    assert later["fixed"] == []
    assert len(state[hand_made]["projects"]) == 2  # untouched, now and 30 days later
    assert hand_made not in attempt.created_ids
    assert calls(fake, "delete_project") == 0


def thirty_days_later(
    database_url: str, fake: FakeGateway, parent: str, attempt_id: Any
) -> dict[str, Any]:
    """The orphan search, the audit and its fix, run in-process with the clock 30 days on."""
    app = open_event_store(database_url, pool_size=2)
    clock = ManualClock()
    clock.advance(timedelta(days=30).total_seconds())
    try:
        with HttpGateway(fake.url, TOKEN, read_timeout=1.0, retries=1) as gateway:
            settings = EngineSettings(parent_ids=frozenset({parent}))
            service = ProvisioningService(app, gateway, clock=clock, settings=settings)
            released = service.release(attempt_id)
            found = audit_parent(service, parent)
            fixed = fix(service, found)
            return {"released": released, "findings": found.findings, "fixed": fixed,
                    "attempt": service.attempt(attempt_id)}  # fmt: skip
    finally:
        app.close()
