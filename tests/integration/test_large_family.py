"""A family past the old cap of 10,000 entries, over HTTP: the fake seeds it in one call
(`POST /_fake/workspaces {"count": N}`) and `HttpGateway` reads it as it arrives
(decision 032)."""

from __future__ import annotations

import httpx

from domain.ports import FamilyMember
from infrastructure.fake_gateway import FakeGateway
from infrastructure.gateway import HttpGateway
from tests.conftest import PARENT, TOKEN


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
