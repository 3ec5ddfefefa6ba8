"""The restore drill (docs/operations.md, "Backups and restore"), against PostgreSQL,
RabbitMQ and the fake over HTTP: brands provisioned, the database dumped, more
brands provisioned, one deactivated, creates that time out after creating; the dump
restored into a fresh database; `provisioner audit --fix`; the service started on
it and the producers' commands since the backup sent again; then every active brand
is bound to one ready workspace, every workspace the fake made for our titles is
bound or released on record, and the audit reports nothing."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.ids import brand_aggregate_id
from domain.policies import StatusClass, classify_status
from infrastructure.fake_gateway.config import FakeConfig
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.settings.model import Settings
from infrastructure.store.eventstore import ProvisionerApplication, init_database, open_event_store
from infrastructure.views.store import init_read_models
from tests.audit_support import lose_a_create
from tests.conftest import PG_ADMIN, TOKEN, unavailable
from tests.integration.running import drained, running
from tests.support import drive
from worker.cli.main import main

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


@pytest.fixture
def databases() -> Iterator[tuple[str, str]]:
    """Two databases of the drill's own: the one backed up, and the one restored into."""
    names = [f"provisioner_drill_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    base = PG_ADMIN.rsplit("/", 1)[0]
    try:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as conn:
            for name in names:
                conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        unavailable("PostgreSQL", exc)
    yield f"{base}/{names[0]}", f"{base}/{names[1]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg(*args: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def brand_story(app: ProvisionerApplication, brand_id: str) -> tuple[Brand, list[Any], set[str]]:
    """The brand, every attempt it began, and what its decommissions emptied."""
    events: list[Any] = list(app.events.get(brand_aggregate_id(brand_id)))
    brand: Any = None
    for event in events:
        brand = event.mutate(brand)
    begun = [e.attempt_id for e in events if isinstance(e, Brand.AttemptBegun)]
    emptied = {
        e.workspace_id
        for e in events
        if isinstance(e, Brand.WorkspaceUnbound) and e.reason == "decommissioned"
    }
    return brand, [app.repository.get(a) for a in begun], emptied


def test_a_restore_loses_no_workspace(
    databases: tuple[str, str], rabbit_url: str, tmp_path: Path
) -> None:
    backed_up, restored = databases
    parent = f"org-{uuid.uuid4().hex[:10]}"
    run = uuid.uuid4().hex[:6]
    title = {n: f"Drill {n} {run}" for n in range(1, 7)}
    brand = {n: f"drill-{n}-{run}" for n in range(1, 7)}
    init_database(backed_up)
    init_read_models(backed_up)
    with FakeGateway(FakeConfig(seed=uuid.uuid4().int % 2**31), parents=(parent,)) as fake:
        # 1. Brands 1-3 provisioned; brand 4's create made a workspace whose answer
        #    was lost, then the brand was deactivated: its attempt ended cancelled.
        app = open_event_store(backed_up, pool_size=2)
        with HttpGateway(fake.url, TOKEN, read_timeout=0.5, retries=1) as gateway:
            engine = EngineSettings(parent_ids=frozenset({parent}), decommission_delay_s=0.0)
            service = ProvisioningService(app, gateway, settings=engine)
            for n in (1, 2, 3):
                drive(service, service.request_provisioning(brand[n], title[n], parent))
            lost = lose_a_create(service, brand[4], title[4], parent)
            # 2. The backup.
            dump = tmp_path / "backup.dump"
            pg("pg_dump", "--format=custom", f"--file={dump}", backed_up)
            # 3. After it: brands 5 and 6 (whose create times out after creating),
            #    brand 2 deactivated.
            fake.script(title[6], "timeout_after_create")
            for n in (5, 6):
                drive(service, service.request_provisioning(brand[n], title[n], parent))
            service.deactivate(brand[2])
            fake.script(title[6], "")
        app.close()
        creates_before = dict(fake.state()["creates"])
        # 4. The dump restored into a fresh database.
        pg("pg_restore", "--no-owner", f"--dbname={restored}", str(dump))
        env = {
            "PROVISIONER_DATABASE_URL": restored, "PROVISIONER_BROKER_URL": rabbit_url,
            "PROVISIONER_GATEWAY_URL": fake.url, "PROVISIONER_GATEWAY_TOKEN": TOKEN,
            "PROVISIONER_PARENT_IDS": parent,
        }  # fmt: skip
        runner = CliRunner(env=env)
        # 5. The audit (before the workers: nothing else acts meanwhile), then the
        #    service, and the producers' commands since the backup once more.
        plan_file = str(tmp_path / "restore-plan.json")
        planned = runner.invoke(main, ["audit", "--fix", "--plan", plan_file])
        fixed = runner.invoke(main, ["audit", "--apply", plan_file, "--json"])
        with running(Settings.from_env(env)) as service:
            for n in (5, 6):
                service.request_provisioning(brand[n], title[n], parent)
            service.deactivate(brand[2])
            drained(service, [brand[n] for n in (1, 3, 5, 6)])
        clean = runner.invoke(main, ["audit", "--json"])
        final = fake.state()

    assert planned.exit_code == 1, planned.output
    assert "plan: 1 steps (nothing done)" in planned.output
    assert f"to do it: provisioner audit --apply {plan_file}" in planned.output
    assert title[4] in planned.output  # each step names its title and brand
    assert brand[4] in planned.output
    assert fixed.exit_code == 1, fixed.output
    problems = [f for f in json.loads(fixed.output) if f["problem"]]
    assert [(f["kind"], f["attempt_id"]) for f in problems] == [("orphan", str(lost))]
    assert problems[0]["done"] == f"recorded and released by attempt {lost}"
    assert clean.exit_code == 0, clean.output
    assert json.loads(clean.output) == []
    app = open_event_store(restored, pool_size=1)
    try:
        stories = {n: brand_story(app, brand[n]) for n in brand}
    finally:
        app.close()
    upstream = {w["id"]: w for w in final["workspaces"] if w["title"] in title.values()}
    bound = [b.workspace_id for b, _, _ in stories.values() if b.workspace_id]
    for n in (1, 3, 5, 6):  # every active brand: bound to one ready workspace
        active, _, _ = stories[n]
        assert active.is_active
        status = upstream[active.workspace_id]["status"]
        assert classify_status(status) is StatusClass.READY
    assert len(bound) == len(set(bound))  # one brand per workspace
    released = {
        ws for _, attempts, _ in stories.values() for a in attempts for ws in a.released_ids
    }
    released |= {ws for _, _, emptied in stories.values() for ws in emptied}
    assert set(upstream) == set(bound) | released  # every one of ours: bound or released
    orphan = next(iter(set(app_attempt(stories, lost).released_ids)))
    assert upstream[orphan]["projects"] == []
    for n in (5, 6):  # adopted after the restore, not created again
        assert final["creates"][title[n]] == creates_before[title[n]]


def app_attempt(stories: dict[int, Any], attempt_id: Any) -> Any:
    for _, attempts, _ in stories.values():
        for attempt in attempts:
            if isinstance(attempt, ProvisioningAttempt) and attempt.id == attempt_id:
                return attempt
    raise AssertionError(f"attempt {attempt_id} is not on record")
