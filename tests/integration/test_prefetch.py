"""A worker holds at most its prefetch, across both of its queues."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from infrastructure.broker import messages
from infrastructure.broker.publisher import Broker
from infrastructure.broker.topology import Topology
from worker.consumer import HopWorker


class BlockedService:
    """Every handler waits until the test lets it go."""

    secrets: tuple[str, ...] = ()  # no gateway token to scrub

    def __init__(self) -> None:
        self.go = threading.Event()

    def run_hop(self, *_: Any) -> Any:
        self.go.wait(30)
        raise RuntimeError("released by the test")

    def request_provisioning(self, *_: Any) -> Any:
        return self.run_hop()


@pytest.mark.rabbitmq
def test_a_worker_holds_at_most_its_prefetch_with_backlog_on_both_queues(rabbit_url: str) -> None:
    publisher = Broker(rabbit_url, Topology(), scheduler=None)
    publisher.publish_many(
        [(messages.hop(uuid.uuid4(), 0), 0.0) for _ in range(30)]
        + [(messages.provision(f"b-{n}", "T", "p"), 0.0) for n in range(30)]
    )
    publisher.close()
    service = BlockedService()
    worker = HopWorker(service, rabbit_url, concurrency=8)  # type: ignore[arg-type]
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while worker._in_flight < worker.prefetch and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # time enough for the broker to over-deliver, were it allowed to
        held = worker._in_flight
    finally:
        stop.set()
        service.go.set()
        thread.join(60)

    assert held == worker.prefetch == 10  # 8 + a quarter, one limit for both queues
