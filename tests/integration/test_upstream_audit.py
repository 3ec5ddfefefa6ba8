"""The upstream audit against the fake over HTTP: it finds an orphan of ours, releases
it once through the release use case, and never touches someone else's workspace or
the parent."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import REGISTRY

from domain.ports import FamilyMember, WorkspaceGone
from domain.upstream_audit import Action, Kind
from infrastructure.fake_gateway.config import FakeConfig
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.settings.model import Settings
from infrastructure.store.eventstore import init_database
from infrastructure.usecases.upstream_audit import audit_parent, fix, parents_on_record
from infrastructure.views.audit_findings import read_audits
from infrastructure.views.connection import ViewConnection
from infrastructure.views.store import init_read_models
from tests.audit_support import lose_a_create
from tests.conftest import TOKEN
from tests.support import Intercepting, drive, upstream
from worker.cli.main import main
from worker.runtime import build


@pytest.fixture
def parent() -> str:
    """A parent of this test's own: the session's PostgreSQL database is shared, and the
    audit reads every brand and attempt under a parent."""
    return f"org-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def fake(parent: str) -> Iterator[FakeGateway]:
    with FakeGateway(FakeConfig(seed=uuid.uuid4().int % 2**31), parents=(parent,)) as gateway:
        yield gateway


@pytest.fixture
def settings(parent: str) -> EngineSettings:
    """The service acts under this test's parent alone; a decommission empties at once."""
    return EngineSettings(parent_ids=frozenset({parent}), decommission_delay_s=0.0)


def upstream_by_id(fake: FakeGateway, title: str) -> dict[str, dict[str, Any]]:
    return {w["id"]: w for w in upstream(fake, title)}


def test_an_orphan_of_ours_is_found_recorded_and_released_once(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str, parent: str
) -> None:
    bound = service.request_provisioning(brand_id, title, parent)
    drive(service, bound)
    [mine] = upstream_by_id(fake, title)
    others = fake.seed_workspace(title, parent, status="created", projects=1)["id"]
    lost = lose_a_create(service, f"{brand_id}-lost", title, parent)
    [orphan] = set(upstream_by_id(fake, title)) - {mine, others}

    found = audit_parent(service, parent)
    done = fix(service, found)
    head = service.app.recorder.max_notification_id()
    again = audit_parent(service, parent)
    fix(service, again)

    assert parent in parents_on_record(service)
    by_kind = {(f.kind, f.workspace_id) for f in found.findings}
    assert by_kind == {(Kind.ORPHAN, orphan), (Kind.FOREIGN, others)}
    assert [f.kind for f in found.problems] == [Kind.ORPHAN]
    assert found.problems[0].attempt_id == str(lost)
    assert found.problems[0].projects == 0
    assert [d.done for d in done] == [f"recorded and released by attempt {lost}"]
    attempt = service.attempt(lost)
    assert orphan in attempt.created_ids
    assert orphan in attempt.inferred_ids  # ours by inference, not proof
    assert orphan in attempt.released_ids
    assert again.problems == ()
    assert [(f.kind, f.workspace_id) for f in again.findings] == [(Kind.FOREIGN, others)]
    assert dict(again.clean) == {"bound_ready": 1, "bound_settling": 0, "released_empty": 1}
    assert service.app.recorder.max_notification_id() == head  # nothing more recorded
    state = upstream_by_id(fake, title)
    assert len(state[others]["projects"]) == 1  # someone else's: never touched
    root = next(w for w in fake.state()["workspaces"] if w["id"] == parent)
    assert len(root["projects"]) == 1  # the parent: untouched


def test_an_orphan_someone_started_using_is_unclear_and_never_emptied(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str, parent: str
) -> None:
    lost = lose_a_create(service, brand_id, title, parent)
    [orphan] = upstream_by_id(fake, title)
    fake.add_project(orphan)  # credited by inference only if empty: a person decides

    found = audit_parent(service, parent)
    done = fix(service, found)
    released = service.release(lost)  # the reconciler's orphan re-check

    assert [(f.kind, f.workspace_id, f.action) for f in found.problems] == [
        (Kind.UNCLEAR, orphan, Action.NONE)
    ]
    assert "holds 1 projects" in found.problems[0].detail
    assert done == []
    assert released == ()
    assert len(upstream_by_id(fake, title)[orphan]["projects"]) == 1
    assert orphan not in service.attempt(lost).created_ids


def test_the_command_exits_1_on_findings_and_0_once_fixed(
    service: ProvisioningService,
    fake: FakeGateway,
    brand_id: str,
    title: str,
    parent: str,
    database_url: str,
) -> None:
    lose_a_create(service, brand_id, title, parent)
    [orphan] = upstream_by_id(fake, title)
    runner = CliRunner(env={
        "PROVISIONER_DATABASE_URL": database_url, "PROVISIONER_GATEWAY_URL": fake.url,
        "PROVISIONER_GATEWAY_TOKEN": TOKEN, "PROVISIONER_PARENT_IDS": parent,
    })  # fmt: skip

    listed = runner.invoke(main, ["audit", "--parent", parent, "--json"])
    planned = runner.invoke(main, ["audit", "--parent", parent, "--fix"])
    fixed = runner.invoke(main, ["audit", "--parent", parent, "--fix", "--yes", "--json"])
    clean = runner.invoke(main, ["audit", "--parent", parent])
    foreign = runner.invoke(main, ["audit", "--parent", "org-not-ours"])

    assert listed.exit_code == 1, listed.output
    [finding] = [f for f in json.loads(listed.output) if f["workspace_id"] == orphan]
    assert finding["kind"] == "orphan"
    assert finding["action"] == "release"
    assert finding["problem"] is True
    assert finding["brand_ids"] == [brand_id]
    assert finding["title"] == title
    assert planned.exit_code == 1, planned.output
    assert "plan: 1 steps (nothing done)" in planned.output
    assert "to do it: provisioner audit --fix --yes" in planned.output
    assert fixed.exit_code == 1, fixed.output
    [done] = [f["done"] for f in json.loads(fixed.output) if f["workspace_id"] == orphan]
    assert done.startswith("recorded and released")
    assert clean.exit_code == 0, clean.output
    assert "0 findings" in clean.output
    assert foreign.exit_code == 3, foreign.output
    assert "PROVISIONER_PARENT_IDS" in foreign.output
    assert TOKEN not in listed.output + planned.output + fixed.output + clean.output


def test_the_reconciler_audits_on_its_schedule_and_counts_the_findings(
    tmp_path: Path, fake: FakeGateway, parent: str, title: str
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    init_database(url)
    init_read_models(url)
    env = {
        "PROVISIONER_DATABASE_URL": url, "PROVISIONER_GATEWAY_URL": fake.url,
        "PROVISIONER_GATEWAY_TOKEN": TOKEN, "PROVISIONER_PARENT_IDS": parent,
        "PROVISIONER_AUDIT_EVERY_S": "0.5",
    }  # fmt: skip
    off = Settings.from_env({**env, "PROVISIONER_AUDIT_EVERY_S": "0"})
    with build(off, parts=("reconciler",)) as runtime:
        assert runtime.reconciler()[0].audit is None
    with build(Settings.from_env(env), parts=("reconciler",)) as runtime:
        lose_a_create(runtime.service, "b-scheduled", title, parent)
        reconciler, broker = runtime.reconciler(interval_s=0.2)
        assert reconciler.audit is not None
        stop = threading.Event()
        thread = threading.Thread(target=reconciler.run, args=(stop, broker))
        thread.start()
        try:
            deadline = time.monotonic() + 10
            while reconciler.audit.runs < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            thread.join(10)
            broker.close()

    assert reconciler.audit.runs >= 1
    sample = REGISTRY.get_sample_value
    assert sample("provisioner_audit_findings", {"kind": "orphan"}) == 1
    assert sample("provisioner_audit_findings", {"kind": "foreign"}) == 0
    [workspace] = upstream_by_id(fake, title).values()
    assert workspace["projects"] == []  # counted, never fixed: nothing was emptied


class Vanishing(Intercepting):
    """The fake, but for workspaces gone upstream (the fake cannot delete one)."""

    def __init__(self, inner: Any, gone: set[str]) -> None:
        super().__init__(inner)
        self.gone = gone

    def family(self, parent_id: str, title: str | None = None) -> list[FamilyMember]:
        return [m for m in super().family(parent_id, title) if m.id not in self.gone]

    def status(self, workspace_id: str) -> str:
        if workspace_id in self.gone:
            raise WorkspaceGone(f"workspace {workspace_id}: 404")
        return super().status(workspace_id)


def test_a_brand_whose_workspace_vanished_is_unbound_and_provisioned_again(
    service: ProvisioningService, brand_id: str, title: str, parent: str
) -> None:
    drive(service, service.request_provisioning(brand_id, title, parent))
    gone = service.brand(brand_id).workspace_id
    assert gone is not None
    service.gateway = Vanishing(service.gateway, {gone})

    found = audit_parent(service, parent)
    [done] = fix(service, found)
    unbound = service.brand(brand_id)
    assert unbound.current_attempt_id is not None
    drive(service, unbound.current_attempt_id)
    again = audit_parent(service, parent)

    assert [(f.kind, f.workspace_id, f.action) for f in found.problems] == [
        (Kind.BOUND_MISSING, gone, Action.PROVISION)
    ]  # fmt: skip
    assert done.done.startswith("unbound; provisioned again")
    assert unbound.workspace_id is None
    claim = service.claim(gone)
    assert claim is not None
    assert claim.brand_id is None
    assert service.brand(brand_id).workspace_id not in (None, gone)
    assert again.problems == ()
    assert again.clean["bound_ready"] == 1


def test_the_cli_audit_records_its_findings_and_says_what_a_person_should_do(
    service: ProvisioningService,
    fake: FakeGateway,
    brand_id: str,
    title: str,
    parent: str,
    database_url: str,
) -> None:
    """`audit` exits 1 with `released_not_empty`: the web view's record says the same,
    and the finding names its brand, its title and what to do (`--fix` cannot act)."""
    attempt_id = service.request_provisioning(brand_id, title, parent)
    drive(service, attempt_id)
    bound = service.brand(brand_id).workspace_id
    assert bound is not None
    fake.add_project(bound)
    service.deactivate(brand_id)
    service.decommission(brand_id)  # emptied, unbound
    fake.add_project(bound)  # someone puts a project in it again
    runner = CliRunner(env={
        "PROVISIONER_DATABASE_URL": database_url, "PROVISIONER_GATEWAY_URL": fake.url,
        "PROVISIONER_GATEWAY_TOKEN": TOKEN, "PROVISIONER_PARENT_IDS": parent,
    })  # fmt: skip

    listed = runner.invoke(main, ["audit", "--parent", parent, "--json"])
    text = runner.invoke(main, ["audit", "--parent", parent], terminal_width=200)
    with ViewConnection(database_url, wait_s=0) as conn:
        [recorded] = [a for a in read_audits(conn) if a.parent_id == parent]

    assert listed.exit_code == 1, listed.output
    [finding] = json.loads(listed.output)
    assert finding["kind"] == "released_not_empty"
    assert (finding["brand_ids"], finding["title"]) == ([brand_id], title)
    assert "never empties it again" in finding["advice"]
    assert "to do:" in text.output
    assert title in text.output
    assert [(f.kind, f.workspace_id, f.brand_ids) for f in recorded.findings] == [
        ("released_not_empty", bound, (brand_id,))
    ]
    assert "to do" in recorded.findings[0].evidence
