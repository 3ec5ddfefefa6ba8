"""The reconciler re-publishes what should have happened and nothing else."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from domain.attempt import ProvisioningAttempt
from domain.policies import AttemptState, FailureReason, Provenance
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.settings.model import Settings
from infrastructure.store.eventstore import open_event_store
from infrastructure.views.queries import list_attempts
from infrastructure.views.store import VERSIONS, SqlViewStore
from tests.conftest import PARENT
from tests.integration.messaging_support import wait_for
from tests.readmodels import FATES, catch_up_all, seed_histories
from tests.support import RecordingBroker
from worker.reconciler import Reconciler, SweepReport
from worker.runtime import build


def caught_up(app: Any, store: SqlViewStore) -> SqlViewStore:
    store.setup()
    catch_up_all(app, store)
    return store


def test_a_sweep_republishes_overdue_hops_and_owed_releases_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    seed_histories(app, 4 * len(FATES))  # four brands of each fate
    broker = RecordingBroker()
    with SqlViewStore(url) as store:
        caught_up(app, store)
        now_report = Reconciler(url).sweep(store, broker)  # type: ignore[arg-type]
        later = datetime.now(UTC) + timedelta(hours=1)
        reconciler = Reconciler(url)
        with caplog.at_level(logging.WARNING, "provisioner.reconciler"):
            later_report = reconciler.sweep(store, broker, now=later)  # type: ignore[arg-type]
        again = reconciler.sweep(store, broker, now=later)  # type: ignore[arg-type]

    # Now: pending hops are due in 5 s and cancelled candidates became owed just now.
    assert (now_report.hops, now_report.releases, now_report.decommissions) == (0, 0, 0)
    # An hour later: every pending attempt's hop 1, every cancelled attempt's release.
    assert (later_report.hops, later_report.releases, later_report.decommissions) == (4, 4, 0)
    hops = [m for m in broker.sent if m.type == "hop"]
    assert {m.fields["hop"] for m in hops} == {1}
    assert all(m.type in ("hop", "release") for m in broker.sent)
    assert again.total == 0  # sent a moment ago: not again before resend_s
    # The line says why the hops went again, and whose they are.
    [line] = [r.getMessage() for r in caplog.records if "re-published 4 hops" in r.getMessage()]
    assert "overdue by more than" in line
    assert "is the relay running, and a worker?" in line
    assert all(brand in line for brand in later_report.hop_brands)
    assert len(later_report.hop_brands) == 4
    app.close()


@pytest.mark.rabbitmq
def test_a_lost_hop_is_republished_and_the_attempt_completes(
    tmp_path: Path, rabbit_url: str, fake: FakeGateway
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    settings = Settings.from_env(
        {
            "PROVISIONER_DATABASE_URL": url,
            "PROVISIONER_BROKER_URL": rabbit_url,
            "PROVISIONER_GATEWAY_URL": fake.url,
            "PROVISIONER_PARENT_IDS": ",".join(fake.parents),
            "PROVISIONER_GATEWAY_TOKEN": "x",
            "PROVISIONER_BACKOFF_BASE_S": "0.05",  # hop 1 is due 0.05 s after hop 0
        }
    )
    stop = threading.Event()
    with build(settings) as runtime:
        # No relay runs: no hop's message is ever published, as if each were lost.
        attempt_id = runtime.service.request_provisioning("b-lost", "Lost Hop Co", PARENT)
        reconciler, broker = runtime.reconciler(overdue_s=0.0)

        reports: list[SweepReport] = []

        def sweep() -> int:
            with SqlViewStore(url) as store:
                reports.append(reconciler.sweep(caught_up(runtime.app, store), broker))
            return reports[-1].hops

        def attempt_reaches(hop: int) -> bool:
            attempt = runtime.service.attempt(attempt_id)
            return attempt.state is not AttemptState.PENDING or attempt.expected_hop >= hop

        try:
            assert sweep() == 1  # hop 0
            runtime.start(runtime.worker(2).run, "worker", stop)
            try:
                wait_for(lambda: attempt_reaches(1), "hop 0 to run", timeout=20)
                # Hop 0 created the workspace and scheduled hop 1 to poll it: lost too.
                wait_for(sweep, "hop 1 to be overdue and re-published", interval=0.05)
                wait_for(lambda: attempt_reaches(2), "hop 1 to run", timeout=20)
            finally:
                stop.set()
                for thread in runtime.threads:
                    thread.join(30)
        finally:
            broker.close()
        assert [r.hops for r in reports if r.hops] == [1, 1]  # hop 0, then hop 1: once each
        assert runtime.service.attempt(attempt_id).state is AttemptState.PROMOTED


def test_stuck_attempts_are_paged_through_in_due_order(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    seed_histories(app, 6 * len(FATES))  # six pending attempts
    later = datetime.now(UTC) + timedelta(hours=1)
    with SqlViewStore(url) as store:
        caught_up(app, store)
        everything = list_attempts(store, stuck=True, now=later)
        first = list_attempts(store, stuck=True, now=later, limit=4)
        last = first[-1]
        rest = list_attempts(
            store, stuck=True, now=later, stuck_after=(last["next_hop_due"], last["attempt_id"])
        )

    assert len(everything) == 6
    assert [r["attempt_id"] for r in first + rest] == [r["attempt_id"] for r in everything]
    app.close()


def test_an_attempt_past_its_deadline_fails_and_what_it_created_is_released(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    fake.configure(settle_polls=5)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)
    created = service.run_hop(attempt_id, 0).workspace_id
    not_yet = service.expire(attempt_id, started_before=datetime.now(UTC) - timedelta(hours=1))

    expired = service.expire(attempt_id, started_before=datetime.now(UTC) + timedelta(seconds=1))
    again = service.expire(attempt_id, started_before=datetime.now(UTC) + timedelta(seconds=1))
    released = service.release(attempt_id)  # what the relay's release message does
    late_hop = service.run_hop(attempt_id, 1)

    attempt = service.attempt(attempt_id)
    assert (not_yet, expired, again) == (False, True, False)
    assert attempt.failure_reason is FailureReason.DEADLINE
    assert released == (created,)
    assert not attempt.release_owed
    assert late_hop.stand_down is not None  # a hop delivered late changes nothing
    assert service.attempt(attempt_id).version == attempt.version


def test_a_sweep_with_the_service_fails_the_attempts_past_their_deadline(
    tmp_path: Path, http_gateway: Any
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    service = ProvisioningService(app, http_gateway)
    seed_histories(app, 2 * len(FATES))  # two pending attempts
    later = datetime.now(UTC) + timedelta(hours=25)  # past the default deadline, a day
    broker = RecordingBroker()
    with SqlViewStore(url) as store:
        caught_up(app, store)
        report = Reconciler(url, service=service).sweep(store, broker, now=later)  # type: ignore[arg-type]
        caught_up(app, store)
        pending = list_attempts(store, state="pending")
        failed = list_attempts(store, state="failed")

    assert report.expired == 2
    assert [m for m in broker.sent if m.type == "hop"] == []  # failed, not re-driven
    assert pending == []
    assert sorted(r["failure_reason"] for r in failed) == [
        "deadline",
        "deadline",
        "exhausted",
        "exhausted",
    ]
    app.close()


def test_a_promoted_attempt_owing_a_surplus_release_is_swept_until_it_is_recorded(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    attempt = ProvisioningAttempt.start("b-surplus", "Surplus", PARENT, None, 5)
    attempt.accept_candidate("ws-kept", Provenance.CREATED, 0)
    attempt.promote(0)
    attempt.record_created("ws-surplus", 0)  # a create that lost its race: owed a release
    app.save(attempt)
    later = datetime.now(UTC) + timedelta(hours=1)
    broker = RecordingBroker()
    with SqlViewStore(url) as store:
        caught_up(app, store)
        owing = Reconciler(url).sweep(store, broker, now=later)  # type: ignore[arg-type]
        attempt.record_release("ws-surplus", 0)
        app.save(attempt)
        caught_up(app, store)
        settled = Reconciler(url).sweep(store, broker, now=later)  # type: ignore[arg-type]

    assert owing.releases == 1
    assert [(m.type, m.fields["attempt_id"]) for m in broker.sent] == [("release", attempt.id)]
    assert settled.releases == 0
    app.close()


def test_a_promoted_attempt_with_a_lost_create_is_searched_for_its_hour(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    attempt = ProvisioningAttempt.start("b-lost", "Lost", PARENT, None, 5)
    attempt.request_create(0, [], datetime.now(UTC))  # timed out, never confirmed
    attempt.request_create(1, [], datetime.now(UTC))  # the retry after the grace
    attempt.accept_candidate("ws-made", Provenance.CREATED, 1)
    attempt.promote(1)
    app.save(attempt)
    broker = RecordingBroker()
    with SqlViewStore(url) as store:
        caught_up(app, store)
        [row] = list_attempts(store, brand_id="b-lost")
        soon = Reconciler(url).sweep(  # type: ignore[arg-type]
            store, broker, now=datetime.now(UTC) + timedelta(minutes=2)
        )
        after_the_hour = Reconciler(url).sweep(  # type: ignore[arg-type]
            store, broker, now=datetime.now(UTC) + timedelta(hours=2)
        )

    assert attempt.create_lost
    assert (row["create_lost"], row["create_unresolved"], row["release_owed"]) == (1, 0, 0)
    assert (soon.rechecks, after_the_hour.rechecks) == (1, 0)
    assert soon.releases == 0  # nothing is owed: counted apart, as provisioner_releases_owed does
    app.close()


def test_an_exhausted_attempt_is_rechecked_for_its_hour(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    attempt = ProvisioningAttempt.start("b-shell", "Shell", PARENT, None, 5)
    attempt.accept_candidate("ws-shell", Provenance.CREATED, 0)
    attempt.fail(FailureReason.EXHAUSTED, "not confirmed after 6 hops; last: not ready", 5)
    attempt.record_release("ws-shell", 0)
    app.save(attempt)
    broker = RecordingBroker()
    with SqlViewStore(url) as store:
        caught_up(app, store)
        soon = Reconciler(url).sweep(  # type: ignore[arg-type]
            store, broker, now=datetime.now(UTC) + timedelta(minutes=2)
        )
        after_the_hour = Reconciler(url).sweep(  # type: ignore[arg-type]
            store, broker, now=datetime.now(UTC) + timedelta(hours=2)
        )

    assert (soon.rechecks, after_the_hour.rechecks) == (1, 0)
    assert soon.releases == 0
    app.close()


def test_a_release_still_owed_long_after_the_end_is_logged_as_stuck_with_its_brand(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    attempt = ProvisioningAttempt.start("b-owes", "Owes", PARENT, None, 5)
    attempt.accept_candidate("ws-owed", Provenance.CREATED, 0)
    attempt.fail(FailureReason.REJECTED, "create rejected", 0)
    app.save(attempt)
    broker = RecordingBroker()
    with SqlViewStore(url) as store, caplog.at_level(logging.WARNING, "provisioner.reconciler"):
        caught_up(app, store)
        soon = Reconciler(url).sweep(  # type: ignore[arg-type]
            store, broker, now=datetime.now(UTC) + timedelta(minutes=2)
        )
        later = Reconciler(url).sweep(  # type: ignore[arg-type]
            store, broker, now=datetime.now(UTC) + timedelta(minutes=20)
        )

    assert (soon.releases, soon.stuck, soon.rechecks) == (1, 0, 0)
    assert (later.releases, later.stuck) == (1, 1)
    [line] = [r.getMessage() for r in caplog.records if "still owed" in r.getMessage()]
    assert f"brand=b-owes attempt={attempt.id}" in line
    app.close()


def test_before_the_attempts_rebuild_switches_the_sweep_keeps_the_old_rule(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    attempt = ProvisioningAttempt.start("b-old", "Old", PARENT, None, 5)
    attempt.accept_candidate("ws-made", Provenance.CREATED, 0)
    attempt.fail(FailureReason.EXHAUSTED, "not confirmed after 6 hops; last: not ready", 5)
    app.save(attempt)
    broker = RecordingBroker()
    with SqlViewStore(url) as store:
        caught_up(app, store)
        with store._tx() as cur:  # a copy built by the code before version 2
            cur.execute(f"DELETE FROM {VERSIONS}")
        assert "attempts" in [p.name for p in store.outdated()]
        report = Reconciler(url).sweep(  # type: ignore[arg-type]
            store, broker, now=datetime.now(UTC) + timedelta(minutes=2)
        )

    assert report.releases == 1  # owed, by the rule its columns allow
    app.close()


def test_a_decommission_is_swept_only_once_its_retention_window_ended(tmp_path: Path) -> None:
    """Its message lost (or the broker restarted): the sweep sends it once the window
    ended, not before; a brand provisioned again inside the window is not sent."""
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    settings = EngineSettings(decommission_delay_s=3600.0)
    service = ProvisioningService(app, None, settings=settings)  # type: ignore[arg-type]
    for brand_id in ("b-window", "b-back"):
        attempt_id = service.request_provisioning(brand_id, "Acme", PARENT)
        brand = service.brand(brand_id)
        brand.bind(f"ws-{brand_id}", attempt_id)
        app.save(brand)
        service.deactivate(brand_id)
    service.request_provisioning("b-back", "Acme", PARENT)  # inside the window: kept
    broker = RecordingBroker()
    now = datetime.now(UTC)
    with SqlViewStore(url) as store:
        caught_up(app, store)
        sweep = Reconciler(url).sweep
        inside = sweep(store, broker, now=now + timedelta(minutes=30))  # type: ignore[arg-type]
        after = sweep(store, broker, now=now + timedelta(minutes=62))  # type: ignore[arg-type]
    app.close()

    assert inside.decommissions == 0
    assert after.decommissions == 1
    sent = [m.fields["brand_id"] for m in broker.sent if m.type == "decommission"]
    assert sent == ["b-window"]
