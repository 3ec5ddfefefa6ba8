"""`provisioner dead-letters` on RabbitMQ: listing consumes nothing and keeps the
order; ids are stable; replay puts a message back where it came from without the
dead-letter headers; purge asks for --yes; memory:// says it keeps none."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from kombu import Connection, Queue

from infrastructure.broker import (
    COMMAND_KEY,
    COMMANDS_QUEUE,
    DEAD_QUEUE,
    EXCHANGE,
    HOPS_QUEUE,
    WORK_KEY,
    Broker,
    Topology,
)
from infrastructure.dead_letters import DeadLetters
from infrastructure.failures import EXIT_CONFIGURATION
from tests.integration.test_poison import publish_raw, take_all
from worker.cli import main

pytestmark = pytest.mark.rabbitmq


def seed(url: str) -> None:
    """Three dead letters from the worker, then one the hops queue dead-letters itself."""
    broker = Broker(url, Topology(), scheduler=None)
    try:
        broker.declare()
        broker.publish_dead(b'{"n": 1}', "schema errors", {"hop": "missing"}, WORK_KEY)
        broker.publish_dead(b'{"n": 2}', "unknown brand", {"brand": "b-2"}, COMMAND_KEY)
        broker.publish_dead(b'{"n": 3}', "schema errors", {"hop": "bad"}, WORK_KEY)
    finally:
        broker.close()
    publish_raw(url, b'{"n": 4}', WORK_KEY, "application/json", "utf-8", {"x-keep": "yes"})
    with Connection(url) as conn:
        queue = Queue(HOPS_QUEUE, no_declare=True).bind(conn.channel())
        message = queue.get(no_ack=False)
        assert message is not None
        message.reject(requeue=False)  # the queue's own dead-lettering: x-death


def cli(url: str, *args: str) -> Any:
    return CliRunner().invoke(
        main, ["dead-letters", *args], env={"PROVISIONER_BROKER_URL": url}, catch_exceptions=False
    )


def bodies(url: str, queue: str) -> list[tuple[bytes, dict[str, Any]]]:
    taken = take_all(url, queue)
    return [(m.body if isinstance(m.body, bytes) else m.body.encode(), dict(m.headers or {}))
            for m in taken]  # fmt: skip


def test_listing_consumes_nothing_keeps_the_order_and_the_ids(rabbit_url: str) -> None:
    seed(rabbit_url)
    with DeadLetters(rabbit_url) as letters:
        first = letters.all()
        second = letters.all()
        counts = letters.counts_by_reason()

    assert [x.body for x in first] == [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}', b'{"n": 4}']
    assert [x.id for x in first] == [x.id for x in second]
    assert len({x.id for x in first}) == 4
    assert [x.source_queue for x in first] == [HOPS_QUEUE, COMMANDS_QUEUE, HOPS_QUEUE, HOPS_QUEUE]
    assert [x.reason for x in first] == ["schema errors", "unknown brand", "schema errors",
                                         "rejected"]  # fmt: skip
    assert first[1].errors == {"brand": "b-2"}
    assert counts == {"schema errors": 2, "unknown brand": 1, "rejected": 1}
    assert all(x.age_s(x.dead_at or 0) is not None for x in first)

    listed = cli(rabbit_url, "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert [x["id"] for x in json.loads(listed.output)] == [x.id for x in first]
    text = cli(rabbit_url, "list")
    assert "unknown brand" in text.output
    assert "brand: b-2" in text.output
    assert "4 dead letter(s)" in text.output
    assert len(take_all(rabbit_url, DEAD_QUEUE)) == 4  # still all there


def test_show_and_replay_one_then_all(rabbit_url: str) -> None:
    seed(rabbit_url)
    with DeadLetters(rabbit_url) as letters:
        ids = [x.id for x in letters.all()]

    shown = cli(rabbit_url, "show", ids[1])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["reason"] == "unknown brand"
    assert cli(rabbit_url, "show", "nope").exit_code == 1

    one = cli(rabbit_url, "replay", ids[1])
    assert one.exit_code == 0, one.output
    assert f"replayed {ids[1]} to {EXCHANGE}/{COMMAND_KEY}" in one.output
    assert bodies(rabbit_url, COMMANDS_QUEUE) == [(b'{"n": 2}', {})]
    with DeadLetters(rabbit_url) as letters:
        assert [x.id for x in letters.all()] == [ids[0], ids[2], ids[3]]

    assert cli(rabbit_url, "replay").exit_code == 2  # an id or --all
    every = cli(rabbit_url, "replay", "--all")
    assert "3 dead letter(s) replayed" in every.output
    assert bodies(rabbit_url, HOPS_QUEUE) == [
        (b'{"n": 1}', {}), (b'{"n": 3}', {}), (b'{"n": 4}', {"x-keep": "yes"})
    ]  # fmt: skip
    assert take_all(rabbit_url, DEAD_QUEUE) == []


def test_purge_asks_for_yes(rabbit_url: str) -> None:
    seed(rabbit_url)
    refused = cli(rabbit_url, "purge")
    assert refused.exit_code == 2
    assert "--yes" in refused.output
    with DeadLetters(rabbit_url) as letters:
        assert len(letters.all()) == 4
    done = cli(rabbit_url, "purge", "--yes")
    assert done.exit_code == 0
    assert "dead letter(s) purged" in done.output
    assert take_all(rabbit_url, DEAD_QUEUE) == []


def test_the_embedded_broker_says_it_keeps_none() -> None:
    result = CliRunner().invoke(
        main, ["dead-letters", "list"], env={"PROVISIONER_BROKER_URL": "memory://"}
    )
    assert result.exit_code == EXIT_CONFIGURATION
    assert "embedded broker (memory://) keeps dead letters only inside" in result.output
