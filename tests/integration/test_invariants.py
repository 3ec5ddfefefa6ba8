"""Every fault of the fake at once, many brands, some sharing a title, some
deactivated mid-flight: when everything has ended, the promises hold.

- every attempt ended (nothing pending);
- a brand that is ready is bound to a workspace that exists upstream, is ready,
  and whose claim names that brand; no workspace is bound to two brands;
- every workspace our creates made upstream is on record in an attempt (as its
  candidate or a surplus), and is either bound, or released, or the candidate
  of an attempt that failed on a terminal status (never usable);
- the parent workspace is never bound and keeps its projects.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.inprocess import InProcessEngine
from domain.policies import AttemptState, FailureReason
from domain.ports import TransientGatewayError
from domain.waits import Backoff, Deferral
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import ProvisionerApplication
from tests.conftest import PARENT, TOKEN

FAULTS = {
    "settle_polls": 2,
    "throttle_rate": 0.1,
    "server_error_rate": 0.1,
    "zombie_rate": 0.05,
    "terminal_rate": 0.05,
    "create_timeout_without_create_rate": 0.05,
    "create_timeout_after_create_rate": 0.05,
}


def test_under_every_fault_at_once_the_promises_hold(
    app: ProvisionerApplication, fake: FakeGateway
) -> None:
    fake.add_project(PARENT)
    parent_before = _workspace(fake, PARENT)
    fake.configure(**FAULTS)
    settings = EngineSettings(
        backoff=Backoff(base_s=0.02, max_requeues=6),
        deferral=Deferral(base_s=0.02, max_s=0.2, deadline_s=60.0, retry_after_max_s=300.0),
        create_grace_s=0.2,
        decommission_delay_s=0.0,  # the deactivated brands are emptied at once
    )
    run = uuid.uuid4().hex[:6]
    with HttpGateway(fake.url, TOKEN, read_timeout=2.0, retries=1, retry_backoff_s=0.0) as gw:
        service = ProvisioningService(app, gw, settings=settings)
        titles = [f"Chaos {run} {n % 24}" for n in range(30)]  # six titles shared by two brands
        brands = [f"chaos-{run}-{n}" for n in range(30)]
        engine = InProcessEngine(service, concurrency=8, retry_s=0.05, max_tries=20)
        attempts = {}
        for brand_id, title in zip(brands, titles, strict=True):
            attempts[brand_id] = service.request_provisioning(brand_id, title, PARENT)
            engine.submit(attempts[brand_id])
        for brand_id in brands[:2]:
            service.deactivate(brand_id)  # mid-flight
        engine.run(timeout_s=120)
        for attempt_id in attempts.values():
            _retried(service.release, attempt_id)  # what the relay's release messages do
        for brand_id in brands[:2]:
            _retried(service.decommission, brand_id)

        ended = {b: service.attempt(a) for b, a in attempts.items()}
        bound = {b: service.brand(b).workspace_id for b in brands}
        upstream = {w["id"]: w for w in fake.state()["workspaces"]}

    assert [b for b, a in ended.items() if a.state is AttemptState.PENDING] == []
    for brand_id, workspace_id in bound.items():
        if workspace_id is None:
            continue
        assert ended[brand_id].state is AttemptState.PROMOTED
        assert upstream[workspace_id]["status"].lower() in ("created", "active", "ready")
        claim = service.claim(workspace_id)
        assert claim is not None
        assert claim.brand_id == brand_id
    assert len([w for w in bound.values() if w]) == len({w for w in bound.values() if w})
    ours = {w["id"] for w in upstream.values() if str(w["title"]).startswith(f"Chaos {run} ")}
    recorded: dict[str, Any] = {}
    for attempt in ended.values():
        for workspace_id in attempt.created_ids:
            recorded[workspace_id] = attempt
    never_recorded = ours - set(recorded) - {w for w in bound.values() if w}
    assert never_recorded == set(), _describe(never_recorded, upstream)
    for workspace_id, attempt in recorded.items():
        if workspace_id in bound.values():
            continue
        released = workspace_id in attempt.released_ids
        unusable = (
            attempt.failure_reason is FailureReason.TERMINAL_STATUS
            and workspace_id == attempt.candidate_id
        )
        assert released or unusable, f"{workspace_id} of {attempt.id} ({attempt.state}) is left"
    assert PARENT not in bound.values()
    assert _workspace(fake, PARENT) == parent_before


def _retried(call: Callable[[Any], Any], arg: Any) -> Any:
    """As the worker does: a transient gateway failure means try the message again."""
    for _ in range(30):
        try:
            return call(arg)
        except TransientGatewayError:
            time.sleep(0.01)
    return call(arg)


def _workspace(fake: FakeGateway, workspace_id: str) -> dict[str, Any]:
    return next(w for w in fake.state()["workspaces"] if w["id"] == workspace_id)


def _describe(ids: set[str], upstream: dict[str, Any]) -> str:
    return "never on record: " + ", ".join(f"{i} {upstream[i]}" for i in sorted(ids))
