"""A decommission the gateway refuses for good: on record (`DecommissionRefused`) with
the gateway's words, the workspace kept, bound and claimed, and nothing sends it
again until an operator deactivates the brand again (`deactivate --purge-now`),
reactivates it, or it is unbound."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

import pytest

from domain.brand import Brand
from domain.errors import CommandRefused
from domain.outcomes import Outcome
from domain.ports import RequestRejected, TransientGatewayError
from domain.releases import DecommissionKind
from domain.stored import MAX_MESSAGE_CHARS
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import open_event_store
from infrastructure.views.audit import brand_history, brand_status
from infrastructure.views.store import VERSIONS, SqlViewStore
from projections.brand_workspaces import BrandWorkspaces
from tests.memory_gateway import PARENT, MemoryGateway
from tests.readmodels import catch_up_all, project
from tests.support import ManualClock, RecordingBroker, new_service
from worker.reconciler import Reconciler

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LOCKED = "HTTP 409: project locked by a legal hold"


def bound_brand(purge_at: datetime | None = None) -> Brand:
    """A brand bound to ws-1, deactivated at T0 (emptied at `purge_at`, default T0)."""
    brand = Brand.register("b1", "Acme", PARENT)
    brand.begin_attempt(uuid4(), "Acme", PARENT, T0 - timedelta(days=1))
    assert brand.current_attempt_id is not None
    brand.bind("ws-1", brand.current_attempt_id)
    brand.deactivate(T0, purge_at)
    return brand


def refused_brand() -> Brand:
    brand = bound_brand()
    brand.start_decommission()
    brand.refuse_decommission(LOCKED)
    return brand


# The aggregate.


def test_a_refused_decommission_is_not_due_and_holds_nothing_back() -> None:
    brand = refused_brand()

    assert brand.emptying_refused == LOCKED
    assert brand.workspace_id == "ws-1"  # still bound
    assert brand.decommissioning is None  # nothing under way
    assert not brand.decommission_due(T0 + timedelta(days=365))
    assert brand.to_be_emptied_at is None  # not until an operator says
    brand.check_provision_possible(PARENT)  # a provision is not told to retry later


def test_a_move_to_another_parent_says_the_emptying_was_refused() -> None:
    brand = refused_brand()

    with pytest.raises(Exception, match="emptying was refused: HTTP 409"):
        brand.check_provision_possible("parent-2")


def test_without_the_refusal_the_decommission_is_due_as_before() -> None:
    brand = bound_brand(T0 + timedelta(hours=1))

    assert brand.emptying_refused is None
    assert not brand.decommission_due(T0)
    assert brand.decommission_due(T0 + timedelta(hours=1))
    brand.start_decommission()
    assert brand.decommission_due(T0)  # begun: goes on
    assert brand.to_be_emptied_at == T0 + timedelta(hours=1)


def test_a_refusal_is_recorded_only_while_the_decommission_is_under_way() -> None:
    brand = bound_brand()
    with pytest.raises(CommandRefused, match="no decommission under way"):
        brand.refuse_decommission(LOCKED)  # not started
    brand.start_decommission()
    brand.unbind("decommissioned")
    with pytest.raises(CommandRefused, match="no decommission under way"):
        brand.refuse_decommission(LOCKED)  # nothing bound
    refused = refused_brand()
    with pytest.raises(CommandRefused, match="no decommission under way"):
        refused.refuse_decommission(LOCKED)  # already refused: not under way any more


def test_the_gateways_words_are_stored_on_one_bounded_line() -> None:
    brand = bound_brand()
    brand.start_decommission()

    brand.refuse_decommission("HTTP 409:\n" + "x" * 10_000)

    assert brand.emptying_refused is not None
    assert "\n" not in brand.emptying_refused
    assert len(brand.emptying_refused) == MAX_MESSAGE_CHARS


def test_a_newer_deactivation_clears_the_refusal_and_the_decommission_is_due_again() -> None:
    brand = refused_brand()

    brand.deactivate(T0 + timedelta(minutes=5), T0 + timedelta(minutes=5))  # --purge-now

    assert brand.emptying_refused is None
    assert brand.decommission_due(T0 + timedelta(minutes=5))


def test_a_reactivation_or_an_unbind_clears_the_refusal() -> None:
    reactivated = refused_brand()
    reactivated.reactivate()
    unbound = refused_brand()
    unbound.unbind("emptied by hand")

    assert reactivated.emptying_refused is None
    assert reactivated.is_active
    assert reactivated.workspace_id == "ws-1"
    assert unbound.emptying_refused is None
    assert unbound.workspace_id is None


def test_the_refusal_replays_from_the_log_and_a_log_without_it_loads_as_before() -> None:
    app = open_event_store("memory://")
    try:
        plain = bound_brand()
        refused = Brand.register("b2", "Acme", PARENT)
        refused.begin_attempt(uuid4(), "Acme", PARENT, T0 - timedelta(days=1))
        assert refused.current_attempt_id is not None
        refused.bind("ws-2", refused.current_attempt_id)
        refused.deactivate(T0)
        refused.start_decommission()
        refused.refuse_decommission(LOCKED)
        app.save(plain, refused)

        plain_again: Brand = app.repository.get(plain.id)
        refused_again: Brand = app.repository.get(refused.id)
    finally:
        app.close()

    assert plain_again.emptying_refused is None
    assert plain_again.decommission_due(T0)
    assert refused_again.emptying_refused == LOCKED
    assert refused_again.decommissioning is None
    assert not refused_again.decommission_due(T0 + timedelta(days=1))


# The use case, on the memory gateway.


@pytest.fixture
def settings(settings: EngineSettings) -> EngineSettings:
    return replace(settings, parent_ids=frozenset({PARENT}))


def provisioned(service: ProvisioningService, gateway: MemoryGateway, brand_id: str) -> str:
    """Provision the brand (created by hop 0, polled and bound by hop 1: ready at its
    first poll), give its workspace two projects."""
    attempt_id = service.request_provisioning(brand_id, f"Title {brand_id}", PARENT)
    created = service.run_hop(attempt_id, 0)
    assert created.outcome is Outcome.SCHEDULED
    polled = service.run_hop(attempt_id, 1)
    assert (polled.outcome, polled.workspace_id) == (Outcome.PROMOTED, created.workspace_id)
    bound = polled.workspace_id
    assert bound is not None
    gateway.workspaces[bound].projects = [f"{bound}-p1", f"{bound}-p2"]
    return bound


def refused(service: ProvisioningService, gateway: MemoryGateway, brand_id: str) -> str:
    """A provisioned brand deactivated to be emptied now, whose emptying the gateway
    refused for good: its bound workspace."""
    bound = provisioned(service, gateway, brand_id)
    gateway.fail["delete_project"] = [RequestRejected(LOCKED)]
    service.deactivate(brand_id, purge_now=True)
    service.decommission(brand_id)
    return bound


def test_a_decommission_refused_for_good_is_recorded_logged_once_and_not_raised(
    service: ProvisioningService, gateway: MemoryGateway, caplog: pytest.LogCaptureFixture
) -> None:
    bound = provisioned(service, gateway, "b1")
    gateway.fail["delete_project"] = [RequestRejected(LOCKED)]
    service.deactivate("b1", purge_now=True)

    with caplog.at_level(logging.INFO, logger="provisioner.engine"):
        outcome = service.decommission("b1")  # no raise: no retry, no dead letter
        assert (outcome.kind, outcome.why) == (DecommissionKind.REFUSED, LOCKED)

    brand = service.brand("b1")
    assert brand.emptying_refused == LOCKED
    assert brand.workspace_id == bound  # still bound
    assert gateway.workspaces[bound].projects == [f"{bound}-p1", f"{bound}-p2"]
    claim = service.claim(bound)
    assert claim is not None
    assert claim.brand_id == "b1"  # still ours
    events = service.app.events.get(brand.id)
    [refused] = [e for e in events if isinstance(e, Brand.DecommissionRefused)]
    assert (refused.workspace_id, refused.message) == (bound, LOCKED)
    [line] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    text = line.getMessage()
    assert f"brand=b1 workspace={bound}" in text
    assert LOCKED in text
    assert "fix it upstream, then `provisioner deactivate b1 --purge-now`" in text
    assert not [r for r in caplog.records if "decommissioned" in r.getMessage()]


def test_a_refused_decommission_asks_the_gateway_nothing_more(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    refused(service, gateway, "b1")
    asked = dict(gateway.calls)

    again = service.decommission("b1")  # a redelivery, or a late reconciler's
    assert again.kind is DecommissionKind.NOT_DUE

    assert dict(gateway.calls) == asked
    assert service.brand("b1").emptying_refused == LOCKED


def test_a_refused_listing_is_recorded_the_same_way(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    bound = provisioned(service, gateway, "b1")
    gateway.fail["list_projects"] = [RequestRejected("HTTP 422: workspace frozen")]
    service.deactivate("b1", purge_now=True)

    assert service.decommission("b1").kind is DecommissionKind.REFUSED

    assert service.brand("b1").emptying_refused == "HTTP 422: workspace frozen"
    assert service.brand("b1").workspace_id == bound


def test_a_failure_for_now_still_propagates_and_records_no_refusal(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    provisioned(service, gateway, "b1")
    gateway.fail["delete_project"] = [TransientGatewayError("HTTP 503")]
    service.deactivate("b1", purge_now=True)

    with pytest.raises(TransientGatewayError):
        service.decommission("b1")

    assert service.brand("b1").emptying_refused is None
    assert service.decommission("b1").projects_deleted == 2  # the retry empties it


def test_after_a_fix_upstream_deactivate_purge_now_empties_and_unbinds_it(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    bound = refused(service, gateway, "b1")

    again = service.deactivate("b1", purge_now=True)  # the operator's retry

    assert again.already_deactivated
    assert service.decommission("b1").projects_deleted == 2
    brand = service.brand("b1")
    assert (brand.workspace_id, brand.emptying_refused) == (None, None)
    assert gateway.workspaces[bound].projects == []
    claim = service.claim(bound)
    assert claim is not None
    assert claim.brand_id is None


def test_a_provision_after_a_refusal_reactivates_the_brand_and_keeps_the_workspace(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    bound = refused(service, gateway, "b1")

    attempt_id = service.request_provisioning("b1", "Title b1", PARENT)  # not RetryLater
    outcome = service.run_hop(attempt_id, 0)

    brand = service.brand("b1")
    assert brand.is_active
    assert brand.emptying_refused is None
    assert outcome.workspace_id == bound
    assert gateway.workspaces[bound].projects == [f"{bound}-p1", f"{bound}-p2"]


def test_what_an_operator_reads_of_the_refusal(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    bound = refused(service, gateway, "b1")

    status = brand_status(service, "b1")
    [entry] = [e for e in brand_history(service, "b1") if e.get("type") == "DecommissionRefused"]

    assert status["emptying_refused"] == LOCKED
    assert status["to_be_emptied_at"] is None
    assert status["workspace_id"] == bound
    assert entry["workspace_id"] == bound
    assert LOCKED in entry["reason"]
    service.deactivate("b1", purge_now=True)
    assert brand_status(service, "b1")["emptying_refused"] is None


# The read model and the reconciler.


def test_the_row_shows_the_refusal_until_a_deactivation_reactivation_or_unbind() -> None:
    brand = refused_brand()
    [refused] = project(BrandWorkspaces(), list(brand.collect_events()))
    again, back, unbound = refused_brand(), refused_brand(), refused_brand()
    again.deactivate(T0 + timedelta(minutes=1))
    back.reactivate()
    unbound.unbind("emptied by hand")

    assert refused["emptying_refused"] == LOCKED
    assert refused["workspace_id"] == "ws-1"
    assert refused["status"] == "deactivated"
    for cleared in (again, back, unbound):
        [row] = project(BrandWorkspaces(), list(cleared.collect_events()))
        assert row["emptying_refused"] is None


def test_the_reconciler_sends_no_decommission_for_a_refused_brand(
    tmp_path: Path, gateway: MemoryGateway, settings: EngineSettings
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    service = new_service(gateway, ManualClock(), settings, url=url)
    provisioned(service, gateway, "b-refused")
    provisioned(service, gateway, "b-lost")  # its decommission message lost
    gateway.fail["delete_project"] = [RequestRejected(LOCKED)]
    service.deactivate("b-refused", purge_now=True)
    service.decommission("b-refused")
    service.deactivate("b-lost", purge_now=True)
    later = datetime.now(UTC) + timedelta(minutes=5)  # past the grace
    try:
        with SqlViewStore(url) as store:
            store.setup()
            catch_up_all(service.app, store)
            sent = sent_decommissions(Reconciler(url), store, later)
            service.deactivate("b-refused", purge_now=True)  # the operator's retry
            catch_up_all(service.app, store)
            after_retry = sent_decommissions(Reconciler(url), store, later + timedelta(minutes=5))
    finally:
        service.app.close()

    assert sent == ["b-lost"]
    assert sorted(after_retry) == ["b-lost", "b-refused"]


def test_a_copy_from_before_the_column_sends_it_and_the_decommission_does_nothing(
    tmp_path: Path, gateway: MemoryGateway, settings: EngineSettings
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    service = new_service(gateway, ManualClock(), settings, url=url)
    refused(service, gateway, "b-refused")
    asked = dict(gateway.calls)
    try:
        with SqlViewStore(url) as store:
            store.setup()
            catch_up_all(service.app, store)
            with store._tx() as cur:  # a live copy built by the code before version 5
                cur.execute(f"DELETE FROM {VERSIONS}")
            later = datetime.now(UTC) + timedelta(hours=1)
            sent = sent_decommissions(Reconciler(url), store, later)
        again = service.decommission("b-refused")
    finally:
        service.app.close()

    assert sent == ["b-refused"]  # the old rule, until its rebuild switches
    assert again.kind is DecommissionKind.NOT_DUE  # its refusal on record
    assert dict(gateway.calls) == asked  # the decommission re-checks: nothing asked


def sent_decommissions(reconciler: Reconciler, store: SqlViewStore, now: datetime) -> list[str]:
    broker = RecordingBroker()
    reconciler.sweep(store, broker, now=now)  # type: ignore[arg-type]
    return [m.fields["brand_id"] for m in broker.sent if m.type == "decommission"]


def test_the_brand_page_shows_the_refusal_and_what_to_do(
    tmp_path: Path, gateway: MemoryGateway, settings: EngineSettings
) -> None:
    from starlette.testclient import TestClient

    from infrastructure.settings.model import Settings
    from worker.projector import Projector
    from worker.web.app import create_app

    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    service = new_service(gateway, ManualClock(), settings, url=url)
    try:
        refused(service, gateway, "b-locked")
        with SqlViewStore(url) as store:
            store.setup()
            Projector(service.app, url, database_url=url).step(store)
    finally:
        service.app.close()
    web = create_app(Settings.from_env({"PROVISIONER_DATABASE_URL": url}))

    with TestClient(web, base_url="http://127.0.0.1:8080") as client:
        page = " ".join(client.get("/brands/b-locked").text.split())

    assert "the gateway refused to empty it: HTTP 409: project locked by a legal hold" in page
    assert "provisioner deactivate b-locked --purge-now" in page
    assert "to be emptied at" not in page
