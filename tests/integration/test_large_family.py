"""A family past the old cap of 10,000 entries, over HTTP: the fake seeds it in one call
(`POST /_fake/workspaces {"count": N}`) and `HttpGateway` reads it as it arrives
(decision 032)."""

from __future__ import annotations

import httpx

from domain.outcomes import Outcome
from domain.ports import FamilyMember
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from tests.conftest import PARENT, TOKEN
from tests.support import ManualClock, drive


def test_a_family_of_12000_children_reads_over_http(fake: FakeGateway) -> None:
    seeded = httpx.post(
        f"{fake.url}/_fake/workspaces",
        json={"title": "Other brand", "parent": PARENT, "status": "created", "count": 12_000},
    ).json()
    assert seeded["count"] == 12_000
    mine = fake.seed_workspace("Brand A", PARENT, status="not ready")
    shares: list[float] = []
    with HttpGateway(fake.url, TOKEN, retries=0, on_family_share=shares.append) as gateway:
        assert gateway.family(PARENT, "Brand A") == [
            FamilyMember(mine["id"], "Brand A", "not ready")
        ]
        assert len(gateway.family(PARENT)) == 12_002  # the parent, the others, ours
    assert 0 < shares[-1] < 0.05  # about 700 KiB of 64 MiB


def test_a_seeding_count_out_of_range_is_refused(fake: FakeGateway) -> None:
    for count in (0, -1, 200_001, "3", True):
        answer = httpx.post(
            f"{fake.url}/_fake/workspaces", json={"title": "T", "parent": PARENT, "count": count}
        )
        assert answer.status_code == 400, count
        assert "count must be" in answer.json()["error"]
    assert len(fake.state()["workspaces"]) == 1  # the parent alone


def test_a_brand_is_promoted_under_a_parent_of_12000_children(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, brand_id: str, title: str
) -> None:
    fake.seed_workspaces("Other brand", PARENT, 12_000)
    fake.seed_workspace(title, PARENT, status="not ready")  # a same-title child not ours
    fake.configure(settle_polls=1)
    attempt_id = service.request_provisioning(brand_id, title, PARENT)

    outcomes = drive(service, attempt_id, clock.advance)

    assert outcomes[-1].outcome is Outcome.PROMOTED, outcomes
    assert fake.state()["creates"] == {title: 1}
    assert len(fake.state()["workspaces"]) == 12_003
