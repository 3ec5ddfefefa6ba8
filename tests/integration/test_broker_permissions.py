"""The broker permission model on a real RabbitMQ (docs/operations.md, "Broker permissions").

A throwaway vhost, service user and producer user (random names) are made by running
the lines `provisioner broker init --print-permissions` prints, and removed at the end
whatever happens. `provisioner broker init` then runs as the service user, and so do a
worker and a relay on the fake gateway.

The producer can publish `provision` and `deactivate`, and they are carried out end to
end. It cannot publish anything else: RabbitMQ refuses its publishes to the internal
exchanges and, through the default exchange, to any queue by name (ACCESS_REFUSED, the
channel closed), and lets it declare, bind and read nothing; a hop, release or
decommission body it publishes on the commands exchange is dead-lettered by the
worker, unhandled.

Needs rabbitmqctl on the broker's machine (root): skipped without it on a laptop,
failed when PROVISIONER_REQUIRE_SERVICES=1 or CI is set (tests/conftest.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import amqp
import pytest
from kombu import Connection

from infrastructure.broker import messages
from infrastructure.broker.topology import (
    COMMAND_KEY,
    COMMANDS_EXCHANGE,
    COMMANDS_QUEUE,
    DEAD_KEY,
    DEAD_QUEUE,
    EVENTS_EXCHANGE,
    EXCHANGE,
    HOPS_QUEUE,
    WORK_KEY,
    Topology,
    wait_rung_ms,
)
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.settings.model import Settings
from tests.conftest import PARENT
from tests.integration.messaging_support import (
    Vhost,
    bound_workspace,
    components,
    environment,
    promoted,
    publish_raw,
    queue_depth,
    sqlite_url,
    take,
    wait_for,
)
from tests.support import upstream
from worker.runtime import build

pytestmark = pytest.mark.rabbitmq

REFUSAL = "wrong_queue"  # an internal message on the commands queue
WAIT_QUEUE = str(Topology().wait(wait_rung_ms(5)).name)


def refused(url: str, act: Callable[[Any], object]) -> str:
    """What RabbitMQ said when it refused `act` on a channel of `url`.

    py-amqp raises a ChannelError only for the broker's channel.close (and then
    opens the channel anew itself): code 403 is that close, for ACCESS_REFUSED.
    """
    with Connection(url, connect_timeout=3, transport_options={"confirm_publish": True}) as conn:
        with pytest.raises(amqp.exceptions.AccessRefused) as caught:
            act(conn.channel())
        assert isinstance(caught.value, amqp.exceptions.ChannelError)
        assert caught.value.reply_code == 403
        return str(caught.value)


def publishing(body: bytes, exchange: str, routing_key: str) -> Callable[[Any], object]:
    def act(channel: Any) -> object:
        message = amqp.Message(body, content_type="application/json")
        # Confirm mode: the publish waits for the broker's answer (here, the refusal).
        return channel.basic_publish(message, exchange=exchange, routing_key=routing_key,
                                     mandatory=True)  # fmt: skip

    return act


HOP = messages.hop(uuid.uuid4(), 0).encode()

# Each way a producer could try to reach the service's own messages, and the resource
# RabbitMQ names in its refusal.
ROUTES_AROUND: list[tuple[str, Callable[[Any], object], str]] = [
    ("publish work", publishing(HOP, EXCHANGE, WORK_KEY), f"exchange '{EXCHANGE}'"),
    ("publish command", publishing(HOP, EXCHANGE, COMMAND_KEY), f"exchange '{EXCHANGE}'"),
    ("publish dead", publishing(HOP, EXCHANGE, DEAD_KEY), f"exchange '{EXCHANGE}'"),
    ("default to hops", publishing(HOP, "", HOPS_QUEUE), "exchange 'amq.default'"),
    ("default to commands", publishing(HOP, "", COMMANDS_QUEUE), "exchange 'amq.default'"),
    ("default to a wait queue", publishing(HOP, "", WAIT_QUEUE), "exchange 'amq.default'"),
    (
        "forge an event",
        publishing(b"{}", EVENTS_EXCHANGE, "workspace.ready"),
        f"exchange '{EVENTS_EXCHANGE}'",
    ),
    (
        "bind the hops queue to the commands exchange",
        lambda ch: ch.queue_bind(HOPS_QUEUE, COMMANDS_EXCHANGE, WORK_KEY),
        f"queue '{HOPS_QUEUE}'",
    ),
    (
        "bind the work exchange to the commands exchange",
        lambda ch: ch.exchange_bind(EXCHANGE, COMMANDS_EXCHANGE, WORK_KEY),
        f"exchange '{EXCHANGE}'",
    ),
    (
        "declare a queue",
        lambda ch: ch.queue_declare("provisioning.mine"),
        "queue 'provisioning.mine'",
    ),
    ("get a command", lambda ch: ch.basic_get(COMMANDS_QUEUE), f"queue '{COMMANDS_QUEUE}'"),
    ("purge the dead letters", lambda ch: ch.queue_purge(DEAD_QUEUE), f"queue '{DEAD_QUEUE}'"),
]


def test_a_producer_can_publish_commands_and_is_refused_everything_else(vhost: Vhost) -> None:
    publish_raw(vhost.producer_url, messages.deactivate("nobody").encode(), COMMAND_KEY,
                exchange=COMMANDS_EXCHANGE)  # fmt: skip

    said = {what: refused(vhost.producer_url, act) for what, act, _ in ROUTES_AROUND}

    wrong = {
        what: said[what]
        for what, _, named in ROUTES_AROUND
        if "ACCESS_REFUSED" not in said[what] or named not in said[what]
    }
    assert not wrong
    assert queue_depth(vhost.service_url, COMMANDS_QUEUE)[0] == 1  # the command, routed
    assert queue_depth(vhost.service_url, HOPS_QUEUE)[0] == 0  # nothing got in there


def test_a_producers_commands_are_carried_out_and_internal_bodies_dead_lettered_unhandled(
    vhost: Vhost, fake: FakeGateway, tmp_path: Path, brand_id: str
) -> None:
    title = f"Permissions {brand_id}"
    env = environment(sqlite_url(tmp_path), vhost.service_url, fake)

    def command(message: messages.Message) -> None:
        publish_raw(vhost.producer_url, message.encode(), COMMAND_KEY, exchange=COMMANDS_EXCHANGE)

    with build(Settings.from_env(env)) as runtime, components(runtime, relay=True) as running:
        worker = running.worker
        assert worker is not None
        command(messages.provision(brand_id, title, PARENT))
        workspace_id = wait_for(lambda: bound_workspace(runtime, brand_id), "the brand", 30)
        fake.add_project(workspace_id)
        attempt_id = runtime.service.brand(brand_id).current_attempt_id
        assert attempt_id is not None
        promoted(runtime, attempt_id, 30)
        head = runtime.app.recorder.max_notification_id()

        internal = [
            messages.hop(attempt_id, 1),
            messages.release(attempt_id),
            messages.decommission(brand_id),
        ]
        for message in internal:
            command(message)
        wait_for(lambda: worker.stats.dead_lettered >= len(internal), "the dead letters")
        dead = take(vhost.service_url, DEAD_QUEUE, len(internal), timeout=2.0)
        unchanged = (runtime.app.recorder.max_notification_id(), upstream(fake, title))

        command(messages.deactivate(brand_id))
        wait_for(lambda: worker.stats.by_type.get("decommission"), "the decommission", 30)
        brand = runtime.service.brand(brand_id)
        by_type = dict(worker.stats.by_type)

    assert sorted(json.loads(m.body)["type"] for m in dead) == ["decommission", "hop", "release"]
    for letter in dead:
        assert letter.headers["x-dead-reason"] == REFUSAL
        assert letter.headers["x-dead-source"] == COMMAND_KEY
        assert json.loads(letter.headers["x-dead-errors"])["queue"] == COMMANDS_QUEUE
    # The internal bodies changed nothing: no event, the workspace and its project kept.
    [workspace] = unchanged[1]
    assert unchanged[0] == head
    assert workspace["id"] == workspace_id
    assert len(workspace["projects"]) == 1
    # The producer's own commands did everything they ask for.
    assert by_type["provision"] == by_type["deactivate"] == by_type["decommission"] == 1
    assert brand.lifecycle == "deactivated"
    [emptied] = upstream(fake, title)
    assert emptied["projects"] == []
