"""The audit reads answer "no brand" for an id no request could register: one holding
a lone surrogate (what undecodable bytes on a command line become) cannot be hashed
into a stream id, and must not fail as an unexpected error."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from domain.errors import UnknownBrand
from infrastructure.service import ProvisioningService
from infrastructure.views import audit


@pytest.fixture(autouse=True)
def registered(service: ProvisioningService) -> None:
    """Brand b1, requested (no hop run: the gateway is never called)."""
    service.request_provisioning("b1", "Acme", "parent")


@pytest.mark.parametrize("brand_id", ["b\udcff", "\ud800", "nosuch"])
def test_an_id_never_registered_is_an_unknown_brand(
    service: ProvisioningService, brand_id: str
) -> None:
    with pytest.raises(UnknownBrand, match="is registered"):
        audit.brand_status(service, brand_id)
    with pytest.raises(UnknownBrand, match="is registered"):
        audit.brand_history(service, brand_id)
    with pytest.raises(UnknownBrand, match="is registered"):
        audit.pointer_at(service, brand_id, datetime.now(UTC))


def test_a_registered_brand_is_still_found(service: ProvisioningService) -> None:
    assert audit.brand_history(service, "b1")[0]["type"] == "Registered"
