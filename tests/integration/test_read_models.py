"""Read models: rebuild, resumption, exactly-once, readers during a switch, CLI queries.

Every other integration scenario already ends by comparing both projections with
the state replayed from the event log (tests/integration/conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.policies import Provenance
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import ProvisionerApplication, open_event_store
from infrastructure.views.log_source import LogSource
from infrastructure.views.queries import brand_workspace, list_attempts
from infrastructure.views.sql import POSITIONS, all_rows, one
from infrastructure.views.store import PROJECTIONS, REGISTRY, SqlViewStore
from projections.core import PositionConflict, catch_up, rebuild
from tests.conftest import PARENT
from tests.readmodels import assert_projections_match, catch_up_all, live_rows, seed_histories
from tests.support import ManualClock
from worker.cli.main import main
from worker.projector import Projector

ROOT = Path(__file__).resolve().parents[2]


def at(seconds: float) -> datetime:
    """A command time for hand-built histories."""
    return datetime(2030, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)


@pytest.fixture
def store(database_url: str) -> Iterator[SqlViewStore]:
    with SqlViewStore(database_url) as views:
        views.setup()
        yield views


def live_copy(store: SqlViewStore, name: str) -> str:
    [entry] = [e for e in _registry(store) if e["name"] == name]
    return str(entry["live"])


def _registry(store: SqlViewStore) -> list[dict[str, Any]]:
    with store._tx(immediate=False) as cur:
        return all_rows(cur, f"SELECT * FROM {REGISTRY}")


def test_rebuild_reproduces_the_live_projection_row_for_row(
    app: ProvisionerApplication, store: SqlViewStore
) -> None:
    seed_histories(app, 40)
    catch_up_all(app, store)
    seed_histories(app, 40)  # applied live in a second run of batches
    catch_up_all(app, store)
    before = live_rows(store)
    old = {name: live_copy(store, name) for name in PROJECTIONS}

    for projection in PROJECTIONS.values():
        rebuild(projection, LogSource(app, store), store, limit=37)

    assert live_rows(store) == before
    for name in PROJECTIONS:
        assert live_copy(store, name) != old[name]
        with store._tx(immediate=False) as cur, pytest.raises(Exception):  # noqa: B017, PT011
            cur.execute(f"SELECT 1 FROM {old[name]}")  # the old copy is gone


def test_an_interrupted_rebuild_resumes_where_it_stopped(
    app: ProvisionerApplication, store: SqlViewStore
) -> None:
    head = app.recorder.max_notification_id() or 0
    seed_histories(app, 30)
    catch_up_all(app, store)
    projection = PROJECTIONS["attempts"]
    seen: list[int] = []

    def interrupt_after_two_batches(progress: Any) -> None:
        seen.append(progress.done)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rebuild(
            projection, LogSource(app), store, limit=10, on_progress=interrupt_after_two_batches
        )
    building = next(e for e in _registry(store) if e["name"] == "attempts")["building"]
    assert building is not None
    resumed: list[int] = []

    copy = rebuild(
        projection, LogSource(app), store, limit=10, on_progress=lambda p: resumed.append(p.done)
    )

    assert copy == building
    assert resumed[0] == seen[-1] > 0  # started from the interrupted copy's position
    assert_projections_match(app, store, head)


class CrashingBatch:
    """A batch that dies after writing its rows, before its position is recorded."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.copy = inner.copy
        self.position = inner.position

    def load(self, column: str, values: set[str]) -> Any:
        return self.inner.load(column, values)

    def write(self, rows: Any) -> None:
        self.inner.write(rows)
        raise ConnectionError("killed mid-batch")

    def advance(self, to: int) -> None:  # pragma: no cover - never reached
        self.inner.advance(to)


class CrashOnce:
    def __init__(self, store: SqlViewStore) -> None:
        self.store = store
        self.position = store.position
        self.crashed = False

    @contextmanager
    def live_batch(self, projection: Any) -> Iterator[Any]:
        with self.store.live_batch(projection) as batch:
            if self.crashed:
                yield batch
            else:
                self.crashed = True
                yield CrashingBatch(batch)


def test_a_batch_killed_after_writing_leaves_nothing_and_is_applied_once_on_resume(
    app: ProvisionerApplication, store: SqlViewStore
) -> None:
    head = app.recorder.max_notification_id() or 0
    brand_ids = seed_histories(app, 12)
    for projection in PROJECTIONS.values():
        crashing = CrashOnce(store)
        with pytest.raises(ConnectionError):
            catch_up(projection, LogSource(app), crashing)  # type: ignore[arg-type]
        # The killed batch's rows were rolled back with it.
        assert store.rows(projection, "brand_id = ?", [brand_ids[0]]) == []
        catch_up(projection, LogSource(app), crashing)  # type: ignore[arg-type]
        assert len(store.rows(projection, "brand_id = ?", [brand_ids[0]])) == 1
    # Lists (created, released ids) would show a double application.
    assert_projections_match(app, store, head)


@pytest.mark.postgres
def test_two_runners_on_one_projection_never_apply_an_event_twice(pg_database: str) -> None:
    app = open_event_store(pg_database, pool_size=4)
    head = app.recorder.max_notification_id() or 0
    stop = threading.Event()
    conflicts: list[str] = []
    errors: list[BaseException] = []

    def runner() -> None:
        with SqlViewStore(pg_database) as own:
            while not stop.is_set():
                try:
                    catch_up_all(app, own)
                except PositionConflict as exc:
                    conflicts.append(str(exc))
                except BaseException as exc:
                    errors.append(exc)
                    return

    threads = [threading.Thread(target=runner) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(10):
            seed_histories(app, 10, per_save=4)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    with SqlViewStore(pg_database) as views:
        assert errors == []
        assert_projections_match(app, views, head)
    app.close()


def test_readers_keep_getting_answers_during_a_rebuild(
    app: ProvisionerApplication, store: SqlViewStore, database_url: str
) -> None:
    brand_ids = seed_histories(app, 40)
    promoted = brand_ids[0::4]  # seed_histories promotes every fourth brand
    catch_up_all(app, store)
    expected = {b: brand_workspace(store, b)["workspace_id"] for b in promoted}  # type: ignore[index]
    assert all(expected.values())
    stop = threading.Event()
    answers: list[bool] = []
    failures: list[str] = []

    def reader() -> None:
        with SqlViewStore(database_url) as own:
            while not stop.is_set():
                for brand_id, workspace_id in expected.items():
                    try:
                        row = brand_workspace(own, brand_id)
                        pending = list_attempts(own, state="pending", limit=5)
                    except Exception as exc:
                        failures.append(repr(exc))
                        continue
                    answers.append(row is not None and row["workspace_id"] == workspace_id)
                    answers.append(bool(pending))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for projection in PROJECTIONS.values():
            rebuild(projection, LogSource(app), store, limit=5)
    finally:
        stop.set()
        thread.join(30)

    assert failures == []
    assert len(answers) > 20
    assert all(answers)


@pytest.mark.postgres
def test_a_projection_process_killed_mid_batch_resumes_without_double_applying(
    pg_database: str, tmp_path: Path
) -> None:
    app = open_event_store(pg_database, pool_size=2)
    head = app.recorder.max_notification_id() or 0
    seed_histories(app, 600)
    target = app.recorder.max_notification_id()
    env = {**os.environ, "PROVISIONER_DATABASE_URL": pg_database, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "worker.cli.main", "projections", "run", "--batch", "5"]

    def positions() -> dict[str, int]:
        with SqlViewStore(pg_database) as views, views._tx(immediate=False) as cur:
            return {
                name: int(one(cur, f"SELECT position FROM {POSITIONS} WHERE copy = %s",
                                     live_copy(views, name))["position"])
                for name in PROJECTIONS
            }  # fmt: skip

    def behind() -> int:
        with SqlViewStore(pg_database) as views:
            return sum(item["behind"] for item in views.status(LogSource(app, views)))

    log = (tmp_path / "projections.log").open("w")

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=log)

    start = positions()
    process = spawn()
    try:
        deadline = time.monotonic() + 60
        while positions() == start and time.monotonic() < deadline:
            time.sleep(0.005)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        killed_at = positions()
        # Killed part-way through the backlog (brand_workspaces is caught up first).
        assert killed_at["brand_workspaces"] < target or killed_at["attempts"] < target
        process = spawn()
        deadline = time.monotonic() + 60
        while behind() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        log.close()
    assert behind() == 0, (tmp_path / "projections.log").read_text()
    with SqlViewStore(pg_database) as views:
        assert_projections_match(app, views, head, tries=1)
    app.close()


# --------------------------------------------------------------------------- CLI


def own_sqlite_store(
    tmp_path: Path, gateway: HttpGateway
) -> tuple[str, ProvisionerApplication, ProvisioningService, ManualClock]:
    """A SQLite event store of the test's own, so the CLI sees only its brands."""
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    clock = ManualClock()
    now = EngineSettings(decommission_delay_s=0.0)  # a decommission empties at once
    return url, app, ProvisioningService(app, gateway, clock=clock, settings=now), clock


def test_attempts_and_pointer_answer_from_the_command_line(
    tmp_path: Path, fake: FakeGateway, http_gateway: HttpGateway
) -> None:
    url, app, service, _ = own_sqlite_store(tmp_path, http_gateway)
    before = datetime.now(UTC)
    first = service.request_provisioning("b-cli", "Cli Co", PARENT)
    service.run_hop(first, 0)  # creates; hop 1 polls it
    done = service.run_hop(first, 1)
    bound_at = datetime.now(UTC)
    time.sleep(0.01)
    service.deactivate("b-cli")
    service.decommission("b-cli")
    fake.configure(settle_polls=5)
    waiting = service.request_provisioning("b-wait", "Wait Co", PARENT)
    service.run_hop(waiting, 0)  # creates; hop 1 due in 5 s
    runner = CliRunner(env={"PROVISIONER_DATABASE_URL": url, "COLUMNS": "200"})
    with SqlViewStore(url) as views:
        views.setup()
        catch_up_all(app, views)

    everything = json.loads(runner.invoke(main, ["attempts", "--json"]).output)
    mine = json.loads(runner.invoke(main, ["attempts", "--brand", "b-cli", "--json"]).output)
    pending = json.loads(runner.invoke(main, ["attempts", "--state", "pending", "--json"]).output)
    not_stuck = json.loads(runner.invoke(main, ["attempts", "--stuck", "--json"]).output)
    stuck = json.loads(
        runner.invoke(main, ["attempts", "--stuck", "--overdue", "-3600", "--json"]).output
    )
    later = json.loads(
        runner.invoke(main, ["attempts", "--since", "1d", "--limit", "1", "--json"]).output
    )
    at_bind = json.loads(
        runner.invoke(main, ["pointer", "b-cli", "--at", bound_at.isoformat(), "--json"]).output
    )
    now = json.loads(runner.invoke(main, ["pointer", "b-cli", "--at", "now", "--json"]).output)
    too_early = runner.invoke(
        main, ["pointer", "b-cli", "--at", (before - timedelta(days=1)).isoformat()]
    )
    bad_time = runner.invoke(main, ["attempts", "--since", "yesterday-ish"])
    table = runner.invoke(main, ["attempts"])

    assert {row["attempt_id"] for row in everything} == {str(first), str(waiting)}
    assert done.workspace_id is not None
    assert [row["state"] for row in mine] == ["promoted"]
    assert mine[0]["candidate_id"] == done.workspace_id
    assert [row["attempt_id"] for row in pending] == [str(waiting)]
    assert not_stuck == []  # due in 5 s, not overdue
    assert [row["attempt_id"] for row in stuck] == [str(waiting)]
    assert len(later) == 1
    assert at_bind["workspace_id"] == done.workspace_id
    assert at_bind["attempt_id"] == str(first)
    assert now["workspace_id"] is None
    assert now["attempt_id"] is None
    assert now["lifecycle"] == "deactivated"
    assert too_early.exit_code == 1
    assert "was not registered yet" in too_early.output
    assert bad_time.exit_code == 2
    assert "is not a time" in bad_time.output
    assert table.exit_code == 0
    assert "promoted" in table.output


def test_projections_status_and_rebuild_from_the_command_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    seed_histories(app, 8)
    runner = CliRunner(env={"PROVISIONER_DATABASE_URL": url})
    assert runner.invoke(main, ["db", "init"]).exit_code == 0  # read commands create nothing

    lagging = json.loads(runner.invoke(main, ["projections", "status", "--json"]).output)
    rebuilt = runner.invoke(main, ["projections", "rebuild", "attempts"])
    after = json.loads(runner.invoke(main, ["projections", "status", "--json"]).output)
    unknown = runner.invoke(main, ["projections", "rebuild", "nope"])

    by_name = {item["projection"]: item for item in lagging}
    assert by_name["attempts"]["head"] >= by_name["attempts"]["behind"] > 0
    assert by_name["attempts"]["rows"] == 0
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "readers now use attempts_g2" in rebuilt.output
    state = {item["projection"]: item for item in after}
    assert state["attempts"]["copy"] == "attempts_g2"
    assert state["attempts"]["behind"] == 0
    assert state["attempts"]["rows"] == 8
    assert state["brand_workspaces"]["behind"] > 0  # not rebuilt, not run
    assert unknown.exit_code == 1
    assert "no projection named 'nope'" in unknown.output
    app.close()


def test_the_audit_trail_tells_failed_cancelled_superseded_and_promoted_attempts(
    tmp_path: Path, fake: FakeGateway, http_gateway: HttpGateway
) -> None:
    url, app, service, clock = own_sqlite_store(tmp_path, http_gateway)
    # A title per attempt: emptied shells of earlier ones would make adoption ambiguous.
    fake.script("Story A", "creation_failed")
    failed = service.request_provisioning("b-story", "Story A", PARENT)
    hop = 0
    while (outcome := service.run_hop(failed, hop)).next_hop is not None:
        hop = outcome.next_hop  # every create fails: re-created until out of hops
    fake.configure(settle_polls=5)
    cancelled = service.request_provisioning("b-story", "Story B", PARENT)
    service.run_hop(cancelled, 0)
    service.deactivate("b-story")
    service.run_hop(cancelled, 1)  # stands down, releases its candidate
    superseded = service.request_provisioning("b-story", "Story C", PARENT)  # reactivates
    service.run_hop(superseded, 0)
    clock.advance(601)
    promoted = service.request_provisioning("b-story", "Story D", PARENT)
    fake.configure(settle_polls=0)
    service.run_hop(superseded, 1)
    service.run_hop(promoted, 0)  # creates; hop 1 polls it ready
    service.run_hop(promoted, 1)
    runner = CliRunner(env={"PROVISIONER_DATABASE_URL": url})
    with SqlViewStore(url) as views:
        views.setup()
        catch_up_all(app, views)
        rows = list_attempts(views, brand_id="b-story")

    story = json.loads(runner.invoke(main, ["history", "b-story", "--json"]).output)
    history = [item for item in story if item["kind"] == "attempt"]
    status = json.loads(runner.invoke(main, ["status", "b-story", "--json"]).output)

    order = [str(failed), str(cancelled), str(superseded), str(promoted)]
    assert [a["attempt_id"] for a in history] == order
    assert [a["state"] for a in history] == ["failed", "cancelled", "superseded", "promoted"]
    kinds = [[e["type"] for e in a["events"]] for a in history]
    assert "Failed" in kinds[0]
    assert [e["reason"] for e in history[0]["events"] if e["type"] == "Failed"] == ["exhausted"]
    assert kinds[1][-2:] == ["Cancelled", "CandidateReleased"]
    assert "Superseded" in kinds[2]
    assert kinds[3][-1] == "Promoted", history[3]
    assert status["status"] == "ready"
    assert {r["attempt_id"]: r["state"] for r in rows} == dict(
        zip(order, ["failed", "cancelled", "superseded", "promoted"], strict=True)
    )
    app.close()


@pytest.mark.postgres
def test_a_rebuild_beside_the_live_runner_under_writes_loses_and_doubles_nothing(
    pg_database: str,
) -> None:
    app = open_event_store(pg_database, pool_size=4)
    head = app.recorder.max_notification_id() or 0
    with SqlViewStore(pg_database) as views:
        old = {name: live_copy(views, name) for name in PROJECTIONS}
    stop = threading.Event()
    projector = Projector(app, pg_database, database_url=pg_database, batch=25)
    runner = threading.Thread(target=projector.run, args=(stop,))
    writer = threading.Thread(
        target=lambda: [seed_histories(app, 5, per_save=2) for _ in range(30)]
    )
    runner.start()
    writer.start()
    try:
        with SqlViewStore(pg_database) as views:
            for projection in PROJECTIONS.values():
                rebuild(projection, LogSource(app, views), views, limit=20)
            writer.join(60)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if all(item["behind"] == 0 for item in views.status(LogSource(app, views))):
                    break
                time.sleep(0.05)
            report = views.status(LogSource(app, views))
    finally:
        stop.set()
        runner.join(30)
    assert [item["behind"] for item in report] == [0, 0]  # the live runner followed the switch
    assert all(item["copy"] != old[item["projection"]] for item in report)
    with SqlViewStore(pg_database) as views:
        assert_projections_match(app, views, head, tries=1)
    app.close()


# --------------------------------------------------------------------------- review findings


def test_several_large_writes_in_one_transaction_keep_each_rows_latest_state(
    store: SqlViewStore,
) -> None:
    """The switch writes several batches in one transaction: a staged (COPY) write
    must not re-apply rows staged by an earlier write of the same transaction."""
    projection = PROJECTIONS["attempts"]
    now = datetime.now(UTC)

    def row(key: str, hops: int) -> dict[str, Any]:
        return {
            "attempt_id": key, "brand_id": "b-stage", "title": "T", "state": "pending",
            "hops_used": hops, "next_hop": 0, "candidate_id": None, "provenance": None,
            "failure_reason": None, "last_error": None, "started_at": now, "finished_at": None,
            "next_hop_due": now, "created_ids": [], "released_ids": [], "release_owed": 0,
            "released": 0, "updated_at": now,
        }  # fmt: skip

    class Rollback(Exception):
        pass

    seen: list[int] = []

    def write_three_batches_then_roll_back() -> None:
        with store.live_batch(projection) as batch:
            batch.write([row(f"stage-a-{n}", 0) for n in range(70)])  # staged
            batch.write([row("stage-a-0", 70)])  # one row: a plain upsert
            batch.write([row(f"stage-b-{n}", 0) for n in range(70)])  # staged again
            seen.extend(r["hops_used"] for r in batch.load("attempt_id", {"stage-a-0"}))
            raise Rollback  # leave the shared live copy as it was

    with pytest.raises(Rollback):
        write_three_batches_then_roll_back()
    assert seen == [70]


def test_a_workspace_handed_from_one_brand_to_another_within_one_batch(
    app: ProvisionerApplication, store: SqlViewStore
) -> None:
    head = app.recorder.max_notification_id() or 0
    suffix = uuid.uuid4().hex[:8]
    shared, other = f"ws-shared-{suffix}", f"ws-other-{suffix}"
    a = Brand.register(f"a-{suffix}", "A", "p")
    b = Brand.register(f"b-{suffix}", "B", "p")
    first = ProvisioningAttempt.start(a.brand_id, "A", "p", None, max_hop=3)
    a.begin_attempt(first.id, "A", "p", at(1))
    first.accept_candidate(shared, Provenance.CREATED, 0)
    first.promote(0)
    a.bind(shared, first.id)
    app.save(a, b, first)
    catch_up_all(app, store)  # both rows stored; A holds the workspace
    took = ProvisioningAttempt.start(b.brand_id, "B", "p", None, max_hop=3)
    b.begin_attempt(took.id, "B", "p", at(2))  # B's row now comes first in the batch
    a.deactivate(at(3))
    a.start_decommission()
    a.unbind("decommissioned", 0)
    took.accept_candidate(shared, Provenance.ADOPTED, 0)
    took.promote(0)
    b.bind(shared, took.id)
    a.reactivate()
    again = ProvisioningAttempt.start(a.brand_id, "A", "p", None, max_hop=3)
    a.begin_attempt(again.id, "A", "p", at(4))
    again.accept_candidate(other, Provenance.CREATED, 0)
    again.promote(0)
    a.bind(other, again.id)
    app.save(b, took)
    app.save(a, again)

    catch_up_all(app, store)  # one batch: used to fail SQLite's unique index forever

    assert brand_workspace(store, b.brand_id)["workspace_id"] == shared  # type: ignore[index]
    assert brand_workspace(store, a.brand_id)["workspace_id"] == other  # type: ignore[index]
    assert_projections_match(app, store, head)


def test_times_with_an_offset_select_the_same_attempts_as_utc(
    app: ProvisionerApplication, store: SqlViewStore
) -> None:
    [brand_id] = seed_histories(app, 1)
    catch_up_all(app, store)
    plus_two = timezone(timedelta(hours=2))
    minus_five = timezone(timedelta(hours=-5))

    earlier = datetime.now(plus_two) - timedelta(minutes=1)
    later = datetime.now(minus_five) + timedelta(minutes=1)

    assert len(list_attempts(store, since=earlier, brand_id=brand_id)) == 1
    assert list_attempts(store, since=later, brand_id=brand_id) == []
