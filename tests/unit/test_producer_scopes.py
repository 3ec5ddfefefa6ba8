"""Producers scoped to their brands: the pure rule (domain/producer_scopes.py), the
setting that configures it, whose command a delivery is (infrastructure/broker/origins.py),
and the worker's reading and settling of a command on the commands queue."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest

from domain.producer_scopes import ProducerScopes, Scope
from infrastructure.broker import messages
from infrastructure.broker.messages import InvalidMessage
from infrastructure.broker.origins import PRODUCER_HEADER, producer_of, vouched_headers
from infrastructure.broker.publisher import Broker
from infrastructure.broker.topology import COMMANDS_QUEUE, HOPS_QUEUE
from infrastructure.settings.model import Settings
from infrastructure.settings.parsing import SettingsError, producer_scopes
from tests.support import FakeMessage, RecordingBroker, settler
from worker.delivery import Settler
from worker.reading import inspect

SERVICE = "provisioner"
SCOPES = ProducerScopes(
    {"orders": Scope(("ord-*", "shop-1")), "eu": Scope(("eu-*",), ("org-eu",))}, service=SERVICE
)


@pytest.mark.parametrize(
    ("producer", "brand_id", "parent", "refused"),
    [
        ("orders", "ord-7", "org-parent", None),
        ("orders", "ord-7", None, None),  # a deactivate: its brand decides
        ("orders", "shop-1", None, None),
        ("orders", "shop-12", None, "producer 'orders' may not command brand 'shop-12'"),
        ("orders", "eu-1", None, "producer 'orders' may not command brand 'eu-1'"),
        ("eu", "eu-1", "org-eu", None),
        ("eu", "eu-1", "org-parent", "may not command brand 'eu-1' under parent 'org-parent'"),
        ("eu", "eu-1", None, None),
        ("billing", "ord-7", None, "producer 'billing' has no scope"),
        (None, "ord-7", None, "names no producer"),
        (SERVICE, "anything", "org-parent", None),  # rollout, retry, replays: never scoped
    ],
)
def test_a_scope_covers_its_brands_and_parents(
    producer: str | None, brand_id: str, parent: str | None, refused: str | None
) -> None:
    why = SCOPES.refusal(producer, brand_id, parent)
    if refused is None:
        assert why is None
    else:
        assert why is not None
        assert refused in why


def test_with_no_scope_every_producer_commands_every_brand() -> None:
    assert ProducerScopes(service=SERVICE).refusal(None, "ord-7", "org-parent") is None
    assert ProducerScopes(service=SERVICE).refusal("anyone", "b", None) is None


def test_the_setting_names_each_producers_brands_and_parents() -> None:
    raw = " orders = ord-*, shop-1 ; eu=eu-*@org-eu,org-parent;"
    assert producer_scopes(raw, ("org-eu", "org-parent")) == {
        "orders": Scope(("ord-*", "shop-1")),
        "eu": Scope(("eu-*",), ("org-eu", "org-parent")),
    }


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("orders", "is not USER=BRAND_PATTERN"),
        ("orders=", "is not USER=BRAND_PATTERN"),
        ("=ord-*", "is not USER=BRAND_PATTERN"),
        ("orders=ord-*@", "is not USER=BRAND_PATTERN"),
        ("orders=ord/*", "is not USER=BRAND_PATTERN"),
        ("orders=ord-*;orders=shop-*", "each user once"),
        ("orders=ord-*@org-elsewhere", "'org-elsewhere', not in PROVISIONER_PARENT_IDS"),
        (";", "names no producer"),
    ],
)
def test_a_bad_scope_stops_the_process_naming_the_setting(raw: str, says: str) -> None:
    env = {"PROVISIONER_PRODUCER_SCOPES": raw, "PROVISIONER_PARENT_IDS": "org-parent"}
    with pytest.raises(SettingsError, match="PROVISIONER_PRODUCER_SCOPES") as caught:
        Settings.from_env(env)
    assert says in str(caught.value)


def test_unset_the_setting_scopes_no_one() -> None:
    assert Settings.from_env({}).scopes() == {}
    env = {"PROVISIONER_PRODUCER_SCOPES": "orders=ord-*"}
    assert Settings.from_env(env).scopes() == {"orders": Scope(("ord-*",))}


def props(user: str | None) -> dict[str, Any]:
    return {} if user is None else {"user_id": user}


@pytest.mark.parametrize(
    ("user", "headers", "producer"),
    [
        ("orders", {}, "orders"),  # RabbitMQ checked user_id against the connection
        ("orders", {PRODUCER_HEADER: "eu"}, "orders"),  # a producer's header is its own word
        (SERVICE, {PRODUCER_HEADER: "orders"}, "orders"),  # a retry or replay of its command
        (SERVICE, {PRODUCER_HEADER: SERVICE}, SERVICE),  # the service's rollout
        (SERVICE, {}, None),  # a replay of a command whose producer is unknown
        (None, {PRODUCER_HEADER: SERVICE}, None),  # no user_id: nobody vouches
    ],
)
def test_a_command_is_its_producers_as_the_broker_vouches(
    user: str | None, headers: dict[str, Any], producer: str | None
) -> None:
    assert producer_of(props(user), headers, SERVICE) == producer


def test_headers_are_believed_only_of_the_services_messages() -> None:
    forged = {"x-dead-id": "forged"}
    assert vouched_headers(props("orders"), forged, SERVICE) == {}
    assert vouched_headers(props(None), forged, SERVICE) == {}
    assert vouched_headers(props(SERVICE), forged, SERVICE) == forged
    assert vouched_headers(props(None), forged, None) == forged  # memory://: no producers


class Delivered(FakeMessage):
    """A delivery with the properties RabbitMQ hands over (`user_id`)."""

    def __init__(self, body: bytes, user: str | None, headers: Any = None) -> None:
        super().__init__(body, headers)
        self.properties = props(user)
        self.delivery_info = {"routing_key": "command"}


class ServicePublisher(RecordingBroker):
    user = SERVICE


DEACTIVATE = messages.deactivate("bill-1").encode()


def test_a_command_outside_its_producers_scope_is_refused_foreign_producer() -> None:
    with pytest.raises(InvalidMessage) as caught:
        inspect(Delivered(DEACTIVATE, "orders"), COMMANDS_QUEUE, SCOPES)
    assert caught.value.reason == "foreign_producer"
    assert caught.value.errors["producer"] == "orders"
    assert caught.value.errors["brand_id"] == "bill-1"
    own = messages.provision("ord-1", "T", "org-parent").encode()
    assert inspect(Delivered(own, "orders"), COMMANDS_QUEUE, SCOPES).message.type == "provision"


def test_the_hops_queue_is_the_services_own_and_is_not_scoped() -> None:
    # A command there was retried by the service, having passed on the commands queue.
    assert inspect(Delivered(DEACTIVATE, SERVICE), HOPS_QUEUE, SCOPES).message.type == "deactivate"
    assert inspect(Delivered(DEACTIVATE, None), COMMANDS_QUEUE).message.type == "deactivate"


def scoped(publisher: RecordingBroker, scopes: dict[str, Scope]) -> Settler:
    """A settler that knows the producers' scopes."""
    return settler(publisher, (1.0,), connection_errors=(ConnectionError,), scopes=scopes)


def test_a_refused_command_is_dead_lettered_with_its_producer_and_no_forged_id() -> None:
    publisher = ServicePublisher()
    forged = {"x-dead-id": "forged0001", PRODUCER_HEADER: "eu"}
    assert scoped(publisher, dict(SCOPES.scopes)).read(
        Delivered(DEACTIVATE, "orders", forged), COMMANDS_QUEUE
    ) is None  # fmt: skip
    [(_, reason, errors, source)] = publisher.dead
    assert (reason, source, errors["producer"]) == ("foreign_producer", "command", "orders")
    [kept] = publisher.kept
    assert kept[PRODUCER_HEADER] == "orders"
    assert "x-dead-id" not in kept  # only an id the service gave counts


def test_memory_has_no_producers_to_scope() -> None:
    publisher = RecordingBroker()  # memory://: no broker user
    read = scoped(publisher, dict(SCOPES.scopes)).read(Delivered(DEACTIVATE, None), COMMANDS_QUEUE)
    assert read is not None
    assert publisher.dead == []


def test_a_retried_command_keeps_its_producer() -> None:
    publisher = ServicePublisher()
    settle = scoped(publisher, {})
    message = Delivered(DEACTIVATE, "orders", {"x-dead-id": "forged0001"})
    delivery = settle.read(message, COMMANDS_QUEUE)
    assert delivery is not None
    decision = settle.policy.failed(delivery.facts, RuntimeError("database down"))
    settle.apply(message, delivery, decision, RuntimeError("database down"))
    [(_, _, headers)] = publisher.published
    assert headers == {PRODUCER_HEADER: "orders", "x-retries": 1}


def test_the_service_names_itself_on_its_own_commands_and_no_one_on_those_it_sends_on() -> None:
    broker = Broker("amqp://provisioner:secret@127.0.0.1:1/vhost", scheduler=None)
    try:
        own = broker._work(messages.deactivate("b"), 0.0, None)
        sent_on = broker._work(messages.deactivate("b"), 0.0, {"x-retries": 1})
        hop = broker._work(messages.hop(uuid4(), 0), 0.0, None)
    finally:
        broker.close()
    assert broker.user == SERVICE  # every publish carries it as user_id
    assert own is not None
    assert own.headers == {PRODUCER_HEADER: SERVICE}
    assert sent_on is not None
    assert sent_on.headers == {"x-retries": 1}  # its producer unknown: never the service
    assert hop is not None
    assert hop.headers is None
