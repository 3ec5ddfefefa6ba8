"""Helpers of the upstream audit's tests: a create whose workspace nobody recorded."""

from __future__ import annotations

from uuid import UUID

from domain.outcomes import Outcome
from domain.ports import AmbiguousCreate
from infrastructure.service import ProvisioningService
from tests.support import Intercepting


def lose_a_create(service: ProvisioningService, brand_id: str, title: str, parent: str) -> UUID:
    """The brand's first hop creates its workspace, the answer is lost and the family
    cannot be listed after it (the hop defers); then the brand is deactivated. The
    attempt ends cancelled with its create unresolved: what it made is upstream and
    on record nowhere, until its release (or the audit) finds it."""
    real = service.gateway
    intercept = Intercepting(real)

    def create_then_lose_the_answer(parent_id: str, child_title: str) -> str:
        real.create_child(parent_id, child_title)
        intercept.family_down = True
        raise AmbiguousCreate(f"create of {child_title!r}: timed out (intercepted)")

    intercept.create_answer = create_then_lose_the_answer
    service.gateway = intercept
    try:
        attempt_id = service.request_provisioning(brand_id, title, parent)
        assert service.run_hop(attempt_id, 0).outcome is Outcome.DEFERRED
    finally:
        service.gateway = real
    service.deactivate(brand_id)
    return attempt_id
