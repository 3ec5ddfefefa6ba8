"""Nothing a producer puts on a queue stops the worker (RabbitMQ): hostile bodies,
encodings and headers on both queues are dead-lettered with their reason, and the
good messages behind them are handled by the same, still running, worker."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from domain.errors import UnknownBrand
from infrastructure.broker import messages
from infrastructure.broker.publisher import Broker
from infrastructure.broker.topology import COMMAND_KEY, DEAD_QUEUE, WORK_KEY
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.settings.model import Settings
from tests.integration.messaging_support import publish_raw, take_all, wait_for
from worker.runtime import build

GOOD_HOP = messages.hop(uuid4(), 0).encode()
JSON, UTF8 = "application/json", "utf-8"

# (body, content type, content encoding, headers, reason)
POISON: list[tuple[bytes, str, str, dict[str, Any], str]] = [
    (b"[" * 1000 + b"]" * 1000, JSON, UTF8, {}, "too_deeply_nested"),
    (b"[" * 100_000, JSON, UTF8, {}, "too_large"),
    (b'{"type": "hop", "version": 1, "x": "' + b"a" * 70_000 + b'"}', JSON, UTF8, {}, "too_large"),
    (b'{"type": "hop", "version": 1, "attempt_id": "\xff\xfe"}', JSON, UTF8, {}, "not_utf8"),
    (GOOD_HOP, JSON, "latin-1", {}, "unsupported_encoding"),
    (GOOD_HOP, "application/x-python-serialize", "binary", {}, "unsupported_content_type"),
    (GOOD_HOP, JSON, UTF8, {"compression": "application/x-gzip"}, "undecodable"),
    (GOOD_HOP, JSON, UTF8, {"x-retries": "abc"}, "bad_header"),
    (GOOD_HOP, JSON, UTF8, {"x-retries": [1, 2]}, "bad_header"),
    (
        b'{"type": "hop", "version": 1, "attempt_id": 7, "hop": "1"}',
        JSON,
        UTF8,
        {},
        "schema_error",
    ),
]


def workspace_of(service: Any, brand: str) -> Any:
    try:
        return service.brand(brand).workspace_id
    except UnknownBrand:
        return None


@pytest.mark.rabbitmq
def test_poison_on_both_queues_is_dead_lettered_and_the_worker_carries_on(
    rabbit_url: str, fake: FakeGateway, tmp_path: Path
) -> None:
    env = {
        "PROVISIONER_DATABASE_URL": f"sqlite:///{tmp_path / 'events.sqlite'}",
        "PROVISIONER_BROKER_URL": rabbit_url,
        "PROVISIONER_GATEWAY_URL": fake.url,
        "PROVISIONER_PARENT_IDS": ",".join(fake.parents),
        "PROVISIONER_GATEWAY_TOKEN": "x",
        "PROVISIONER_BACKOFF_BASE_S": "0.05",
    }
    brand = f"poison-{uuid4().hex[:8]}"
    stop = threading.Event()
    with build(Settings.from_env(env)) as runtime:
        worker, relay = runtime.worker(2), runtime.relay()
        threads = [
            runtime.start(worker.run, "worker", stop),
            runtime.start(relay.run, "relay", stop),
        ]
        try:
            assert worker.ready.wait(10)
            for key in (WORK_KEY, COMMAND_KEY):
                for body, ctype, enc, headers, _ in POISON:
                    publish_raw(rabbit_url, body, key, ctype, enc, headers)
            # Good work behind the poison: a command, and a hop of a fresh attempt.
            publisher = Broker(rabbit_url, runtime.topology, scheduler=None)
            try:
                publisher.publish(messages.provision(brand, f"Poison {brand}", "org-parent"))
            finally:
                publisher.close()
            wait_for(lambda: worker.stats.dead_lettered >= 2 * len(POISON), "the dead letters", 15)
            wait_for(lambda: workspace_of(runtime.service, brand), "the good work: brand bound", 15)
            alive = [t.is_alive() for t in threads]
        finally:
            stop.set()
            for thread in threads:
                thread.join(20)
            relay.broker.close()

    assert alive == [True, True]
    dead = take_all(rabbit_url, DEAD_QUEUE)
    got = Counter((m.headers["x-dead-source"], m.headers["x-dead-reason"]) for m in dead)
    want = Counter((key, reason) for key in (WORK_KEY, COMMAND_KEY) for *_, reason in POISON)
    assert got == want
    assert worker.stats.dead_lettered == 2 * len(POISON)
