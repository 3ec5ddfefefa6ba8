"""A round's unit of work (`HopUnit`): each aggregate and the family read at most once,
what it touched saved with the attempt, version-checked."""

from __future__ import annotations

from uuid import UUID

import pytest
from eventsourcing.persistence import IntegrityError

from domain.claim import WorkspaceClaim
from infrastructure.service import ProvisioningService
from infrastructure.usecases.unit import HopUnit
from tests.memory_gateway import PARENT, MemoryGateway

TITLE = "Acme"


@pytest.fixture
def attempt_id(service: ProvisioningService) -> UUID:
    return service.request_provisioning("b1", TITLE, PARENT)


@pytest.fixture
def loads(service: ProvisioningService, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many aggregates each read asked for, one entry a read."""
    seen: list[int] = []
    load = service.load

    def counted(*ids: UUID) -> list[object | None]:
        seen.append(len(ids))
        return load(*ids)

    monkeypatch.setattr(service, "load", counted)
    return seen


def test_the_attempt_its_slot_and_brand_are_one_read_and_never_read_again(
    service: ProvisioningService, attempt_id: UUID, loads: list[int]
) -> None:
    unit = HopUnit(service, attempt_id)  # the attempt's facts are known: one read

    slot, brand = unit.slot_and_brand()

    assert loads == [3]
    assert unit.slot() is slot
    assert unit.brand() is brand
    assert brand.brand_id == "b1"
    assert (slot.parent_workspace_id, slot.title) == (PARENT, TITLE)
    assert loads == [3]


def test_without_the_facts_the_slot_and_brand_are_read_together_when_first_needed(
    service: ProvisioningService, attempt_id: UUID, loads: list[int]
) -> None:
    service._facts.clear()  # a worker that has not seen this attempt yet
    unit = HopUnit(service, attempt_id)

    slot, brand = unit.slot_and_brand()

    assert loads == [1, 2]
    assert unit.slot_and_brand() == (slot, brand)
    assert loads == [1, 2]


def test_a_claim_is_read_once_even_when_there_is_none(
    service: ProvisioningService, attempt_id: UUID, loads: list[int]
) -> None:
    unit = HopUnit(service, attempt_id)
    loads.clear()

    assert unit.claim("ws-1") is None
    opened = unit.open_claim("ws-1")
    assert unit.claim("ws-1") is opened
    assert unit.open_claim("ws-2", read=False) is unit.claim("ws-2")  # known new: unread

    assert loads == [1]


def test_the_family_is_asked_once(
    service: ProvisioningService, gateway: MemoryGateway, attempt_id: UUID
) -> None:
    gateway.add(PARENT, TITLE, "ready")
    unit = HopUnit(service, attempt_id)

    first = unit.family()

    assert unit.family() is first
    assert gateway.calls["family"] == 1


def test_what_is_touched_is_saved_once_with_the_attempt_and_then_forgotten(
    service: ProvisioningService, attempt_id: UUID
) -> None:
    unit = HopUnit(service, attempt_id)
    claim = unit.open_claim("ws-1")
    claim.claim("b1", attempt_id)
    unit.touch(claim, None, claim)

    unit.save()
    unit.save()  # nothing touched since: nothing more saved

    stored = service.claim("ws-1")
    assert stored is not None
    assert stored.brand_id == "b1"
    assert stored.version == claim.version


def test_a_unit_that_lost_a_race_cannot_save_and_a_fresh_one_can(
    service: ProvisioningService, attempt_id: UUID
) -> None:
    stale, rival = HopUnit(service, attempt_id), HopUnit(service, attempt_id)
    for unit in (rival, stale):
        claim = WorkspaceClaim.open("ws-1")
        claim.claim("b1", attempt_id)
        unit.touch(claim)
    rival.save()

    with pytest.raises(IntegrityError):
        stale.save()
    fresh = HopUnit(service, attempt_id)
    assert fresh.claim("ws-1") is not None
