"""Only what is ours is touched: the parents the service acts under, releases and
decommissions of what is on record as ours, and command times within the skew."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from domain import ownership
from domain.errors import CommandRefused, ForeignParent, FutureCommand, UnknownBrand
from domain.outcomes import Outcome
from domain.policies import FailureReason
from domain.releases import DecommissionKind
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.usecases import releases
from tests.memory_gateway import MemoryGateway, Workspace
from tests.support import drive

PARENT = "parent-1"
OTHER_PARENT = "parent-2"  # also ours to act under, never a child to take
TITLE = "Acme"


@pytest.fixture
def gateway() -> MemoryGateway:
    return MemoryGateway(PARENT, OTHER_PARENT, "someone-elses-parent")


@pytest.fixture
def settings(settings: EngineSettings) -> EngineSettings:
    return replace(settings, parent_ids=frozenset({PARENT, OTHER_PARENT}), command_skew_s=60)


def test_a_parent_not_configured_is_refused_and_nothing_is_stored(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    with pytest.raises(ForeignParent, match="PROVISIONER_PARENT_IDS"):
        service.request_provisioning("b1", TITLE, "someone-elses-parent")
    with pytest.raises(UnknownBrand):
        service.brand("b1")
    assert gateway.calls["family"] == gateway.calls["create_child"] == 0


def test_a_configured_parent_listed_in_a_family_is_never_adopted(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    # A hostile listing: the other parent shows as a ready, empty, same-title child.
    gateway.workspaces[OTHER_PARENT] = Workspace(OTHER_PARENT, PARENT, TITLE)
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    created, outcome = drive(service, attempt_id)  # created, then polled by hop 1

    assert created.outcome is Outcome.SCHEDULED
    assert outcome.outcome is Outcome.PROMOTED
    assert outcome.workspace_id == created.workspace_id
    assert outcome.workspace_id not in (PARENT, OTHER_PARENT)
    assert gateway.calls["create_child"] == 1
    assert service.claim(OTHER_PARENT) is None


def test_a_create_answering_a_configured_parent_is_a_gateway_bug(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    gateway.create_child = lambda parent_id, title: OTHER_PARENT  # type: ignore[method-assign]
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)

    outcome = service.run_hop(attempt_id, 0)

    assert outcome.outcome is Outcome.FAILED
    attempt = service.attempt(attempt_id)
    assert attempt.failure_reason is FailureReason.GATEWAY_BUG
    assert "another parent's id" in (attempt.last_status or "")
    assert OTHER_PARENT not in attempt.created_ids
    assert service.claim(OTHER_PARENT) is None
    assert service.brand("b1").workspace_id is None


def test_a_parent_is_never_emptied_nor_a_workspace_not_owed(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    gateway.workspaces[OTHER_PARENT].projects = ["keep-me"]
    with pytest.raises(CommandRefused, match="never emptied"):
        releases.empty_workspace(service, ownership.Facts(OTHER_PARENT, proven=True))
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    service.run_hop(attempt_id, 0)
    stranger = gateway.add(PARENT, "Stranger", "created", projects=2)
    with pytest.raises(CommandRefused, match="owes no release"):
        releases.release_workspace(service, service.attempt(attempt_id), stranger)
    assert gateway.workspaces[OTHER_PARENT].projects == ["keep-me"]
    assert len(gateway.workspaces[stranger].projects) == 2


def test_a_decommission_empties_only_a_workspace_whose_claim_the_brand_holds(
    service: ProvisioningService, gateway: MemoryGateway
) -> None:
    attempt_id = service.request_provisioning("b1", TITLE, PARENT)
    *_, promoted = drive(service, attempt_id)
    assert promoted.outcome is Outcome.PROMOTED
    bound = promoted.workspace_id
    assert bound is not None
    gateway.workspaces[bound].projects = ["p1", "p2"]
    claim = service.claim(bound)
    assert claim is not None
    claim.release("handed elsewhere by hand")  # the claim no longer names the brand
    service.app.save(claim)
    service.deactivate("b1")

    assert service.decommission("b1").kind is DecommissionKind.UNBOUND_NOT_EMPTIED

    assert gateway.workspaces[bound].projects == ["p1", "p2"]
    brand = service.brand("b1")
    assert brand.workspace_id is None
    assert not gateway.deleted


@pytest.mark.parametrize("command", ["provision", "deactivate"])
def test_a_command_from_beyond_the_skew_is_refused_and_nothing_is_stored(
    service: ProvisioningService, command: str
) -> None:
    far = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    soon = datetime.now(UTC) + timedelta(seconds=90)  # past the 60 s allowed

    def send(when: datetime) -> object:
        if command == "provision":
            return service.request_provisioning("b1", TITLE, PARENT, when)
        return service.deactivate("b1", when)

    for when in (far, soon):
        with pytest.raises(FutureCommand, match="PROVISIONER_COMMAND_SKEW_S"):
            send(when)
        with pytest.raises(UnknownBrand):
            service.brand("b1")
    # Within the skew, and in the past: accepted; later commands are not locked out.
    service.deactivate("b1", datetime.now(UTC) + timedelta(seconds=30))
    service.request_provisioning("b1", TITLE, PARENT, datetime.now(UTC) + timedelta(seconds=45))
    assert service.brand("b1").is_active
