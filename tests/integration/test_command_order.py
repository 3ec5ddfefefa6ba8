"""A brand's commands on RabbitMQ and PostgreSQL, in whatever order a worker runs them:
the brand ends as its producer's last command says, and nothing is dead-lettered."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest

from domain.brand import ACTIVE, DEACTIVATED, Brand
from domain.errors import StaleCommand, UnknownBrand
from domain.outcomes import StandDown
from domain.policies import AttemptState
from domain.releases import DecommissionKind
from infrastructure.broker import messages
from infrastructure.broker.publisher import Broker
from infrastructure.broker.topology import DEAD_QUEUE
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.model import Settings
from tests.conftest import PARENT
from tests.integration.messaging_support import (
    components,
    consuming,
    queue_depth,
    title_of,
    wait_for,
)
from tests.support import event_names
from worker.consumer import HopWorker
from worker.runtime import Runtime, build

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]
BRANDS = 40


def settled_deactivated(runtime: Runtime, brand_id: str) -> bool:
    """Deactivated, nothing bound, no attempt still running."""
    try:
        brand = runtime.service.brand(brand_id)
    except UnknownBrand:
        return False
    if brand.lifecycle != DEACTIVATED or brand.workspace_id is not None:
        return False
    if brand.current_attempt_id is None:
        return True
    return runtime.service.attempt(brand.current_attempt_id).is_terminal


def test_forty_provisions_each_followed_by_a_deactivate_all_end_deactivated(
    pg_env: dict[str, str], rabbit_url: str, fake: FakeGateway
) -> None:
    suffix = uuid4().hex[:8]
    brand_ids = [f"order-{suffix}-{i:02d}" for i in range(BRANDS)]
    sent = datetime.now(UTC)
    with build(Settings.from_env(pg_env)) as runtime:
        publisher = Broker(rabbit_url, runtime.topology, scheduler=None)
        try:
            for i, brand_id in enumerate(brand_ids):
                t = sent + timedelta(milliseconds=i)
                publisher.publish(messages.provision(brand_id, title_of(brand_id), PARENT, t))
                publisher.publish(messages.deactivate(brand_id, t + timedelta(microseconds=500)))
        finally:
            publisher.close()
        with components(runtime, relay=True, concurrency=8) as running:
            assert running.worker is not None
            stats = running.worker.stats

            def done() -> bool:  # every command handled and acked, every brand settled
                handled = (stats.by_type.get("provision", 0), stats.by_type.get("deactivate", 0))
                return handled == (BRANDS, BRANDS) and all(
                    settled_deactivated(runtime, b) for b in brand_ids
                )

            wait_for(done, "every command acked and every brand deactivated", timeout=60)
            dead = stats.dead_lettered
            by_type = dict(stats.by_type)
        for brand_id in brand_ids:
            assert settled_deactivated(runtime, brand_id), brand_id  # and it stays so
            claimed = [
                w["id"]
                for w in fake.state()["workspaces"]
                if w["title"] == title_of(brand_id)
                and (c := runtime.service.claim(w["id"])) is not None
                and c.brand_id is not None
            ]
            assert claimed == [], brand_id

    assert dead == 0
    assert queue_depth(rabbit_url, DEAD_QUEUE)[0] == 0
    assert by_type["provision"] == by_type["deactivate"] == BRANDS


def bound_then_deactivated(service: ProvisioningService, brand_id: str, title: str) -> UUID:
    """Provision the brand, run its hops here (no relay, no worker yet) until it is
    bound, then deactivate it; the attempt that bound it."""
    service.request_provisioning(brand_id, title, PARENT)
    attempt_id = service.brand(brand_id).current_attempt_id
    assert attempt_id is not None
    for hop in range(5):
        if service.run_hop(attempt_id, hop).outcome.value != "scheduled":
            break
    assert service.brand(brand_id).workspace_id is not None
    service.deactivate(brand_id)
    return attempt_id


def test_a_provision_during_a_decommission_is_retried_and_then_applied(
    pg_env: dict[str, str], rabbit_url: str, fake: FakeGateway, brand_id: str
) -> None:
    title = title_of(brand_id)
    with build(Settings.from_env(pg_env)) as runtime:
        service = runtime.service
        attempt_id = bound_then_deactivated(service, brand_id, title)
        brand = service.brand(brand_id)
        brand.start_decommission()  # a decommission under way: its projects not emptied yet
        service.app.save(brand)

        worker = HopWorker(
            service,
            rabbit_url,
            topology=runtime.topology,
            concurrency=2,
            scheduler=runtime.scheduler,
            retry_delays_s=(0.2, 0.2, 0.5, 1.0, 2.0),
            wait_delays_s=(0.2, 0.2, 0.5, 1.0, 2.0),
        )
        publisher = Broker(rabbit_url, runtime.topology, scheduler=None)
        try:
            with consuming(worker):
                publisher.publish(messages.provision(brand_id, title, PARENT, datetime.now(UTC)))
                wait_for(lambda: worker.stats.retried >= 1, "the provision to be retried")
                assert service.brand(brand_id).lifecycle == DEACTIVATED
                ended = service.decommission(brand_id)  # the decommission ends
                assert ended.kind is DecommissionKind.EMPTIED
                wait_for(
                    lambda: service.brand(brand_id).is_active, "the retried provision to apply"
                )
        finally:
            publisher.close()
        brand = service.brand(brand_id)
        assert brand.current_attempt_id != attempt_id  # a new attempt
        assert worker.stats.dead_lettered == 0


def test_a_provision_moving_a_deactivated_brand_waits_for_its_decommission(
    pg_env: dict[str, str], rabbit_url: str, fake: FakeGateway, brand_id: str
) -> None:
    """Sent in order (provision, deactivate, provision under another parent), the
    last one arrives while the brand is deactivated and still bound, before its
    decommission started: retried, beyond the infrastructure schedule, until the
    decommission unbinds it; then applied."""
    title = title_of(brand_id)
    moved = f"{PARENT}-moved"
    both = {**pg_env, "PROVISIONER_PARENT_IDS": f"{PARENT},{moved}"}
    with build(Settings.from_env(both)) as runtime:
        service = runtime.service
        bound_then_deactivated(service, brand_id, title)

        worker = HopWorker(
            service,
            rabbit_url,
            topology=runtime.topology,
            concurrency=2,
            scheduler=runtime.scheduler,
            retry_delays_s=(0.1,),  # one infrastructure retry: the waits go further
            wait_delays_s=(0.1,) * 100,
        )
        publisher = Broker(rabbit_url, runtime.topology, scheduler=None)
        try:
            with consuming(worker):
                publisher.publish(messages.provision(brand_id, title, moved, datetime.now(UTC)))
                wait_for(lambda: worker.stats.retried >= 3, "the provision to be retried")
                assert service.brand(brand_id).lifecycle == DEACTIVATED
                unbound = service.decommission(brand_id)  # unbinds it
                assert unbound.kind is DecommissionKind.EMPTIED
                wait_for(
                    lambda: service.brand(brand_id).is_active, "the retried provision to apply"
                )
        finally:
            publisher.close()
        brand = service.brand(brand_id)
        assert brand.parent_workspace_id == moved
        assert brand.workspace_id is None
        assert worker.stats.dead_lettered == 0


def test_a_late_provision_after_a_deactivate_does_not_reactivate(
    pg_env: dict[str, str], rabbit_url: str, fake: FakeGateway, brand_id: str
) -> None:
    title = title_of(brand_id)
    sent = datetime.now(UTC)
    with build(Settings.from_env(pg_env)) as runtime:
        publisher = Broker(rabbit_url, runtime.topology, scheduler=None)
        try:
            publisher.publish(messages.deactivate(brand_id, sent + timedelta(seconds=1)))
            publisher.publish(messages.provision(brand_id, title, PARENT, sent))  # sent first
        finally:
            publisher.close()
        with components(runtime, relay=True, concurrency=1) as running:
            assert running.worker is not None
            wait_for(
                lambda: running.worker.stats.by_type.get("provision"),  # type: ignore[union-attr]
                "the provision to be handled",
            )
            dead = running.worker.stats.dead_lettered
        brand = runtime.service.brand(brand_id)
        names = event_names(runtime.app, Brand.create_id(brand_id))

    assert brand.lifecycle == DEACTIVATED
    assert brand.current_attempt_id is None
    assert names == ["Registered", "Deactivated", "CommandIgnored"]
    assert dead == 0


def test_a_newer_provision_for_another_title_supersedes_and_what_it_created_is_released(
    service: ProvisioningService, fake: FakeGateway, brand_id: str, title: str
) -> None:
    fake.configure(settle_polls=3)  # not ready at the first polls
    sent = datetime.now(UTC)
    first = service.request_provisioning(brand_id, title, PARENT, sent)
    service.run_hop(first, 0)  # creates the workspace: the attempt's candidate, pending
    created = service.attempt(first).candidate_id
    assert created is not None

    second = service.request_provisioning(brand_id, f"{title}-b", PARENT, sent + timedelta(0, 2))
    with pytest.raises(StaleCommand):  # sent between the two: older than the second
        service.deactivate(brand_id, sent + timedelta(seconds=1))
    late = service.run_hop(first, 1)  # the first attempt's next hop

    assert late.stand_down is StandDown.SUPERSEDED
    attempt = service.attempt(first)
    assert attempt.state is AttemptState.SUPERSEDED
    assert created in attempt.released_ids  # emptied and on record
    claim = service.claim(created)
    assert claim is None or claim.brand_id is None
    brand = service.brand(brand_id)
    assert (brand.lifecycle, brand.title, brand.current_attempt_id) == (
        ACTIVE,
        f"{title}-b",
        second,
    )


def bound_with_a_project(service: ProvisioningService, fake: FakeGateway, brand_id: str) -> str:
    """Provisioned here (no relay, no worker yet), bound, with one project upstream."""
    attempt_id = service.request_provisioning(brand_id, title_of(brand_id), PARENT)
    for hop in range(5):
        if service.run_hop(attempt_id, hop).outcome.value != "scheduled":
            break
    workspace_id = service.brand(brand_id).workspace_id
    assert workspace_id is not None
    fake.add_project(workspace_id)
    return workspace_id


def projects_of(fake: FakeGateway, workspace_id: str) -> list[str]:
    return next(w["projects"] for w in fake.state()["workspaces"] if w["id"] == workspace_id)


def test_inside_the_retention_window_a_provision_keeps_the_workspace_and_the_rest_is_emptied(
    pg_env: dict[str, str], rabbit_url: str, fake: FakeGateway
) -> None:
    """Deactivated with a 2 s window: both read `deactivated` at once and keep their
    projects; the one provisioned again inside the window is re-confirmed (nothing
    created) and its delayed decommission does nothing; the other is emptied when
    its window ends, by the decommission the broker held back."""
    suffix = uuid4().hex[:8]
    kept, dropped = f"keep-{suffix}", f"drop-{suffix}"
    env = {**pg_env, "PROVISIONER_DECOMMISSION_DELAY_S": "2"}
    with build(Settings.from_env(env)) as runtime:
        service = runtime.service
        kept_ws = bound_with_a_project(service, fake, kept)
        dropped_ws = bound_with_a_project(service, fake, dropped)
        with components(runtime, relay=True, concurrency=2) as running:
            assert running.worker is not None
            stats = running.worker.stats
            service.deactivate(kept)
            service.deactivate(dropped)
            at_once = [service.brand(b).lifecycle for b in (kept, dropped)]
            intact = [projects_of(fake, w) != [] for w in (kept_ws, dropped_ws)]
            publisher = Broker(rabbit_url, runtime.topology, scheduler=None)
            try:
                publisher.publish(
                    messages.provision(kept, title_of(kept), PARENT, datetime.now(UTC))
                )
            finally:
                publisher.close()
            wait_for(lambda: service.brand(dropped).workspace_id is None, "the emptying", 20)
            wait_for(lambda: stats.by_type.get("decommission", 0) >= 2, "both decommissions", 20)
            brand = service.brand(kept)
            current = brand.current_attempt_id
            assert current is not None
            wait_for(lambda: service.attempt(current).is_terminal, "the re-confirm", 20)
            dead = stats.dead_lettered
        brand = service.brand(kept)
        state = service.attempt(current).state

    assert at_once == [DEACTIVATED, DEACTIVATED]
    assert intact == [True, True]
    assert (brand.lifecycle, brand.workspace_id, state) == (ACTIVE, kept_ws, AttemptState.PROMOTED)
    assert projects_of(fake, kept_ws) != []  # projects intact
    assert int(fake.state()["creates"].get(title_of(kept), 0)) == 1  # nothing created again
    assert projects_of(fake, dropped_ws) == []
    assert dead == 0
