"""When an unconfirmed create's grace begins, on PostgreSQL and the fake over HTTP.

A create the gateway answered with a 503 is over on its side: after an outage
longer than the grace the next answered hop creates again at once. A create it
never answered (the connection closed unanswered) may still be carried out when
it is back: the grace begins again then, and nothing is created meanwhile.
"""

from __future__ import annotations

from uuid import UUID

import pytest

from domain.attempt import ProvisioningAttempt
from domain.outcomes import HopOutcome, Outcome
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.service import ProvisioningService
from tests.conftest import PARENT
from tests.support import ManualClock

pytestmark = pytest.mark.postgres
GRACE_S = 60.0  # the settings fixture's create grace


def through_an_outage(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, attempt_id: UUID,
    title: str,
) -> tuple[int, HopOutcome]:  # fmt: skip
    """Hop 0 meets the scripted create (the next create of the title is made as
    usual); then the gateway answers 503 to everything for hops spanning more than
    the grace; then it is back. The next hop and the first answered hop's outcome."""
    first = service.run_hop(attempt_id, 0)
    assert first.detail == "create unconfirmed; not in the family yet"
    fake.script(title, "")
    fake.outage(300.0, "503")
    hop, outcome, waited = 1, first, 0.0
    while waited <= 2 * GRACE_S:
        clock.advance(outcome.delay_s or 0)
        waited += outcome.delay_s or 0
        outcome = service.run_hop(attempt_id, hop)
        assert outcome.outcome is Outcome.DEFERRED
        hop += 1
    fake.outage(0)
    clock.advance(outcome.delay_s or 0)
    return hop + 1, service.run_hop(attempt_id, hop)


def unconfirmed(service: ProvisioningService, attempt_id: UUID) -> list[tuple[str, bool]]:
    events = service.app.events.get(attempt_id)
    return [(e.message, e.answered) for e in events
            if isinstance(e, ProvisioningAttempt.CreateUnconfirmed)]  # fmt: skip


def test_a_create_answered_503_is_made_again_as_soon_as_the_gateway_is_back(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, title: str,
    brand_id: str,
) -> None:  # fmt: skip
    fake.script(title, "unavailable_without_create")
    attempt_id = service.request_provisioning(brand_id, title, PARENT)

    _, outcome = through_an_outage(service, fake, clock, attempt_id, title)

    assert fake.state()["creates"][title] == 2  # created again in the first answered hop
    assert unconfirmed(service, attempt_id) == [("create_child: outcome unknown (HTTP 503)",
                                                 True)]  # fmt: skip
    while outcome.next_hop is not None:
        clock.advance(outcome.delay_s or 0)
        outcome = service.run_hop(attempt_id, outcome.next_hop)
    assert outcome.outcome is Outcome.PROMOTED
    made = [w for w in fake.state()["workspaces"] if w["title"] == title]
    assert [w["id"] for w in made] == [outcome.workspace_id]


def test_a_create_left_unanswered_waits_a_whole_grace_after_the_gateway_is_back(
    service: ProvisioningService, fake: FakeGateway, clock: ManualClock, title: str,
    brand_id: str,
) -> None:  # fmt: skip
    fake.script(title, "timeout_without_create")
    attempt_id = service.request_provisioning(brand_id, title, PARENT)

    _, outcome = through_an_outage(service, fake, clock, attempt_id, title)

    assert outcome.detail == "create unconfirmed; not in the family yet"
    assert fake.state()["creates"][title] == 1  # nothing created while it may still appear
    [(message, answered)] = unconfirmed(service, attempt_id)
    assert not answered, message
