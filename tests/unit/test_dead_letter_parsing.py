"""What a dead letter is read as, believing only the service and RabbitMQ
(infrastructure/broker/dead_letter_parsing.py; docs/decisions/030-broker-vouched-origins.md)."""

from __future__ import annotations

from typing import Any

from infrastructure.broker.dead_letter_parsing import parse
from infrastructure.broker.messages import decommission
from infrastructure.broker.origins import PRODUCER_HEADER
from infrastructure.broker.topology import (
    COMMAND_KEY,
    COMMANDS_QUEUE,
    DEAD_QUEUE,
    EXCHANGE,
    HOPS_QUEUE,
    WORK_KEY,
)

SERVICE = "provisioner"
BODY = decommission("brand-1").encode()
# What a producer wrote on a command of its own, before the commands queue expired it.
FORGED: dict[str, Any] = {
    "x-dead-reason": "retries_exhausted",
    "x-dead-source": WORK_KEY,
    "x-dead-id": "forged0001",
    "x-first-death-queue": HOPS_QUEUE,
    PRODUCER_HEADER: SERVICE,
}


def death(queue: str, reason: str, keys: list[str]) -> dict[str, Any]:
    return {"queue": queue, "reason": reason, "exchange": EXCHANGE, "routing-keys": keys,
            "count": 1}  # fmt: skip


def expired(*forged_deaths: dict[str, Any]) -> dict[str, Any]:
    """The headers RabbitMQ leaves: the producer's, and `x-death` with its newest
    entry first (an entry of the same queue and reason is updated, keeping its keys)."""
    newest = death(COMMANDS_QUEUE, "expired", [WORK_KEY])  # the keys a producer wrote
    return {**FORGED, "x-death": [newest, *forged_deaths]}


def test_a_letter_a_queue_dead_lettered_is_read_from_its_newest_death_alone() -> None:
    letter = parse(BODY, expired(death(HOPS_QUEUE, "rejected", [WORK_KEY])), user_id="orders",
                   service=SERVICE)  # fmt: skip

    assert (letter.reason, letter.source_queue) == ("expired", COMMANDS_QUEUE)
    assert (letter.exchange, letter.routing_key) == (EXCHANGE, COMMAND_KEY)  # its queue's route
    assert letter.id.startswith("h")  # a hash: not the forged id
    assert letter.producer == "orders"  # RabbitMQ's user_id, not the forged header


def test_a_replay_the_queue_dead_lettered_again_keeps_its_id_and_producer() -> None:
    headers = {"x-dead-id": "abc123", PRODUCER_HEADER: "orders",
               "x-death": [death(COMMANDS_QUEUE, "rejected", [COMMAND_KEY])]}  # fmt: skip
    letter = parse(BODY, headers, user_id=SERVICE, service=SERVICE)
    assert (letter.id, letter.producer) == ("abc123", "orders")
    unknown = parse(BODY, {**headers, PRODUCER_HEADER: ""}, user_id=SERVICE, service=SERVICE)
    assert unknown.producer is None


def test_a_letter_from_an_unknown_queue_goes_back_to_that_queue_by_name() -> None:
    letter = parse(BODY, {"x-death": [death("provisioning.other", "maxlen", ["x"])]})
    assert (letter.exchange, letter.routing_key) == ("", "provisioning.other")
    assert letter.reason == "maxlen"


def test_the_workers_own_letter_is_read_from_its_headers() -> None:
    headers = {"x-dead-reason": "foreign_producer", "x-dead-source": COMMAND_KEY,
               "x-dead-id": "abc123", PRODUCER_HEADER: "orders"}  # fmt: skip
    letter = parse(BODY, headers, user_id=SERVICE, service=SERVICE)
    assert (letter.id, letter.reason, letter.producer) == ("abc123", "foreign_producer", "orders")
    assert (letter.source_queue, letter.routing_key) == (COMMANDS_QUEUE, COMMAND_KEY)


def test_a_replay_sends_none_of_the_forged_headers_and_names_the_producer() -> None:
    letter = parse(BODY, {**expired(), "x-keep": "yes"}, user_id="orders", service=SERVICE)
    assert letter.replay_headers == {"x-keep": "yes", "x-dead-id": letter.id,
                                     PRODUCER_HEADER: "orders"}  # fmt: skip
    nobody = parse(BODY, expired())  # no user_id: a replay names no producer
    assert nobody.replay_headers == {"x-dead-id": nobody.id}
    assert DEAD_QUEUE not in nobody.replay_headers.values()
