"""The event store contract the engine relies on, run against SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import stat
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from eventsourcing.persistence import IntegrityError

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.claim import WorkspaceClaim
from domain.policies import AttemptState, FailureReason, Provenance
from infrastructure.settings.table import DEFAULT_DATABASE_URL
from infrastructure.store.eventstore import (
    DatabaseNotInitialised,
    ProvisionerApplication,
    open_event_store,
)
from infrastructure.views.store import SqlViewStore
from tests.conftest import PG_ADMIN
from worker.cli.main import main

# Storage contract tests save hand-made aggregates (brands begin attempts that never
# start); the projections-equal-replay check is for engine and messaging scenarios.
pytestmark = pytest.mark.raw_events

ROOT = Path(__file__).resolve().parents[2]
SYNCHRONISED_INIT = """
import sys, time
from infrastructure.store.eventstore import init_database
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
init_database(sys.argv[1])
"""


def new_brand() -> Brand:
    return Brand.register(f"brand-{uuid.uuid4().hex[:10]}", "Acme", "parent")


def test_every_event_round_trips_and_replays_to_the_same_state(app: ProvisionerApplication) -> None:
    brand = new_brand()
    attempt = ProvisioningAttempt.start(brand.brand_id, "Acme", "parent", None, max_hop=5)
    brand.begin_attempt(attempt.id, "Acme", "parent", datetime(2030, 1, 1, tzinfo=UTC))
    attempt.request_create(0, ["zombie-1"], datetime(2030, 1, 1, tzinfo=UTC))
    attempt.accept_candidate("w1", Provenance.CREATED, 0)
    attempt.schedule_hop(1, datetime(2030, 1, 1, tzinfo=UTC), "not ready")
    attempt.fail(FailureReason.EXHAUSTED, "gave up", 1)
    attempt.record_release("w1", 2)
    claim = WorkspaceClaim.open("w1-" + brand.brand_id)
    claim.claim(brand.brand_id, attempt.id)
    claim.release("done")
    app.save(brand, attempt, claim)

    again = app.repository.get(attempt.id)

    assert again.state is AttemptState.FAILED
    assert not again.create_unresolved  # resolved by the accepted candidate
    assert again.not_before == datetime(2030, 1, 1, tzinfo=UTC)
    assert again.released_ids == ("w1",)
    assert again.version == attempt.version
    assert app.repository.get(claim.id).brand_id is None
    assert app.repository.get(brand.id).current_attempt_id == attempt.id


def test_a_multi_aggregate_save_is_atomic(app: ProvisionerApplication) -> None:
    brand = new_brand()
    app.save(brand)
    stale = app.repository.get(brand.id)
    brand.deactivate(datetime(2030, 1, 1, tzinfo=UTC))
    app.save(brand)
    attempt = ProvisioningAttempt.start(brand.brand_id, "Acme", "parent", None, max_hop=5)
    stale.begin_attempt(attempt.id, "Acme", "parent", datetime(2030, 1, 2, tzinfo=UTC))

    with pytest.raises(IntegrityError):
        app.save(stale, attempt)

    assert app.repository.get(brand.id).version == brand.version
    with pytest.raises(Exception, match="not found"):
        app.repository.get(attempt.id)


def test_save_takes_aggregates_events_and_none_like_the_library(
    app: ProvisionerApplication,
) -> None:
    brand, other = new_brand(), new_brand()
    (event,) = other.collect_events()  # a domain event given on its own
    saves = app.saves

    recordings = app.save(brand, None, event)

    assert [r.domain_event.originator_id for r in recordings] == [brand.id, other.id]
    assert not brand.collect_events()  # collected: a second save records nothing
    assert app.save(brand) == []
    assert app.saves == saves + 1  # only saves that recorded something count
    assert app.repository.get(other.id).brand_id == other.brand_id


def test_a_second_claim_of_the_same_workspace_conflicts(app: ProvisionerApplication) -> None:
    workspace = f"w-{uuid.uuid4().hex[:8]}"
    first, second = WorkspaceClaim.open(workspace), WorkspaceClaim.open(workspace)
    first.claim("b1", uuid.uuid4())
    second.claim("b2", uuid.uuid4())
    app.save(first)
    with pytest.raises(IntegrityError):
        app.save(second)


def test_the_notification_log_keeps_commit_order(app: ProvisionerApplication) -> None:
    head = app.recorder.max_notification_id() or 0
    brands = [new_brand() for _ in range(3)]
    for brand in brands:
        app.save(brand)
    notes = app.recorder.select_notifications(start=head + 1, limit=10)
    assert [n.originator_id for n in notes] == [b.id for b in brands]
    assert all(n.topic.endswith("Brand.Registered") for n in notes)


def test_a_save_returns_the_notification_ids_the_log_gave_its_events(
    app: ProvisionerApplication,
) -> None:
    brand = new_brand()
    brand.begin_attempt(uuid.uuid4(), "Acme", "parent", datetime.now(UTC))
    claim = WorkspaceClaim.open(f"w-{uuid.uuid4().hex[:8]}")

    recordings = app.save(brand, claim)

    ids = [r.notification.id for r in recordings]
    notes = app.recorder.select_notifications(start=ids[0], limit=len(ids))
    assert [(n.id, n.originator_id, n.originator_version) for n in notes] == [
        (r.notification.id, r.domain_event.originator_id, r.domain_event.originator_version)
        for r in recordings
    ]
    assert ids == sorted(ids)
    assert len(set(ids)) == 3


def test_history_is_readable_with_timestamps_and_time_travel(app: ProvisionerApplication) -> None:
    brand = new_brand()
    attempt_id = uuid.uuid4()
    brand.begin_attempt(attempt_id, "Acme", "parent", datetime.now(UTC))
    brand.bind("w1", attempt_id)
    app.save(brand)
    brand.unbind("decommissioned", 1)
    app.save(brand)

    events = app.events.get(brand.id)
    assert [type(e).__name__ for e in events] == [
        "Registered",
        "AttemptBegun",
        "WorkspaceBound",
        "WorkspaceUnbound",
    ]
    assert all(e.timestamp.tzinfo is not None for e in events)
    assert app.repository.get(brand.id, version=3).workspace_id == "w1"
    assert app.repository.get(brand.id).workspace_id is None


@pytest.mark.postgres
def test_a_postgres_store_without_tables_says_to_run_db_init(pg_database: str) -> None:
    name = f"provisioner_empty_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
        with pytest.raises(DatabaseNotInitialised, match="provisioner db init"):
            open_event_store(url)
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.postgres
def test_four_concurrent_db_inits_on_an_empty_database_all_succeed(pg_database: str) -> None:
    name = f"provisioner_init_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    try:
        # All four call init at the same instant, after their imports: without
        # the advisory lock this fails with "tuple concurrently updated".
        start_at = str(time.time() + 2.0)
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", SYNCHRONISED_INIT, url, start_at],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        outputs = [p.communicate(timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs
        app = open_event_store(url)
        brand = new_brand()
        app.save(brand)
        assert app.repository.get(brand.id).brand_id == brand.brand_id
        app.close()
        cli = subprocess.run(
            [sys.executable, "-m", "worker.cli.main", "db", "init", "--database-url", url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert cli.returncode == 0, cli.stderr
        assert "event store ready" in cli.stdout
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_default_sqlite_store_is_made_private_to_its_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`db init` on the default URL makes ./var 0700 and the store 0600; the files SQLite
    adds beside it (-wal, -shm) take the store's mode."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PROVISIONER_DATABASE_URL", raising=False)
    result = CliRunner().invoke(main, ["db", "init"])
    assert result.exit_code == 0, result.output
    with SqlViewStore(DEFAULT_DATABASE_URL) as store:  # WAL: -wal and -shm appear
        store.setup()
    folder = tmp_path / "var"

    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    assert files["provisioner.sqlite"] == 0o600
    assert set(files.values()) == {0o600}, files


def test_an_existing_sqlite_store_keeps_its_mode_and_a_readable_one_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    path = folder / "events.sqlite"
    path.touch(mode=0o644)
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="provisioner.connect"):
        open_event_store(f"sqlite:///{path}").close()

    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not ours to change
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert f"the event store {path} is readable by every user: chmod 600 it" in caplog.text
    path.chmod(0o600)
    caplog.clear()
    open_event_store(f"sqlite:///{path}").close()
    assert "readable by every user" not in caplog.text
