"""The pace's metrics and the deferred hop count, as a scrape renders them: the pace
told to `metrics.observe_pace` (as worker/runtime.py wires it) opens the circuit
gauge, counts a held call and the seconds a call waited; a hop the gateway did not
answer counts as `deferred`."""

from __future__ import annotations

from uuid import UUID

import httpx
import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from domain.pacing import PaceRules
from domain.ports import TransientGatewayError
from domain.waits import Backoff, Deferral
from infrastructure.broker.messages import Hop
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.gateway.pacing import MemoryPaceStore, Pace
from infrastructure.settings.engine import EngineSettings
from tests.memory_gateway import MemoryGateway
from tests.support import ManualClock, new_service, pace_rules
from worker import handlers
from worker.health import metrics


def scraped(name: str, **labels: str) -> float:
    """The sample's value in the rendered exposition (0 when it is not there)."""
    text = generate_latest(REGISTRY).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def paced(rules: PaceRules, *answers: int) -> tuple[HttpGateway, ManualClock, list[float]]:
    """A gateway whose pace reports to the metrics; the upstream answers `answers`,
    then 200. The sleeps are recorded, not slept."""
    script = list(answers)

    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(script.pop(0) if script else 200, json={"status": "created"})

    clock, slept = ManualClock(seconds=1000.0), list[float]()
    pace = Pace(MemoryPaceStore(clock), rules, sleep=slept.append,
                on_event=metrics.observe_pace)  # fmt: skip
    gateway = HttpGateway("https://gw.test", "token-123456", retries=0,
                          transport=httpx.MockTransport(upstream), pace=pace)  # fmt: skip
    return gateway, clock, slept


def test_an_open_circuit_shows_as_1_and_a_held_call_is_counted() -> None:
    gateway, clock, _ = paced(pace_rules(open_after=3, probe_every_s=10.0), 503, 503, 503)
    held = scraped("provisioner_gateway_held_total")
    with gateway:
        for _ in range(3):
            with pytest.raises(TransientGatewayError):
                gateway.status("ws-1")
        assert scraped("provisioner_gateway_circuit_open") == 1.0
        assert scraped("provisioner_gateway_held_total") == held  # all three were sent

        with pytest.raises(TransientGatewayError, match="circuit open"):
            gateway.status("ws-1")  # held: not sent
        assert scraped("provisioner_gateway_held_total") == held + 1

        clock.advance(10.0)
        assert gateway.status("ws-1") == "created"  # the probe: the gateway is back
    assert scraped("provisioner_gateway_circuit_open") == 0.0


def test_seconds_waited_for_a_turn_at_the_rate_are_counted() -> None:
    gateway, _, slept = paced(pace_rules(rate=2.0, burst=1, max_wait_s=2.0))
    before = scraped("provisioner_gateway_throttle_wait_seconds_total")
    with gateway:
        for _ in range(3):  # at 2 calls/s: at once, after 0.5 s, after 1 s
            gateway.status("ws-1")
    assert slept == pytest.approx([0.5, 1.0])
    waited = scraped("provisioner_gateway_throttle_wait_seconds_total") - before
    assert waited == pytest.approx(1.5)


def test_a_hop_the_gateway_did_not_answer_is_counted_deferred() -> None:
    gateway = MemoryGateway("parent-1")
    gateway.fail["family"] = [TransientGatewayError("family: HTTP 503")]
    deferral = Deferral(2.0, max_s=30.0, deadline_s=3600.0, retry_after_max_s=300.0)
    settings = EngineSettings(backoff=Backoff(5.0, 3), deferral=deferral)
    service = new_service(gateway, settings=settings)
    attempt_id: UUID = service.request_provisioning("b1", "Acme", "parent-1")
    deferred = scraped("provisioner_hops_total", outcome="deferred")
    scheduled = scraped("provisioner_hops_total", outcome="scheduled")

    said = handlers.hop(service, Hop(attempt_id, 0))

    assert said.startswith("deferred ")
    assert scraped("provisioner_hops_total", outcome="deferred") == deferred + 1
    assert scraped("provisioner_hops_total", outcome="scheduled") == scheduled
