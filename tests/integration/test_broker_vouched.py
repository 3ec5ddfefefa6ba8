"""Only what the service or RabbitMQ set is believed, on a real RabbitMQ
(docs/decisions/030-broker-vouched-origins.md).

Each test runs on the throwaway vhost of tests/integration/test_broker_permissions.py,
with its service user and its producer user, and a brand the service provisioned.

- A producer's `decommission` with forged dead-letter headers (`x-dead-reason`,
  `x-dead-source: work`, `x-dead-id`, and `x-death` entries naming the hops queue and
  the work key) expires in the commands queue: it is listed from
  `provisioning.commands` with an id of its own, and a replay sends it back there,
  where the worker dead-letters it `wrong_queue`. The brand is unchanged.
- A producer scoped to its brands (PROVISIONER_PRODUCER_SCOPES) deactivates none
  of another's: the command is dead-lettered `foreign_producer`, the brand unchanged,
  also once the letter is replayed; its own brand it may provision.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from infrastructure.broker import messages
from infrastructure.broker.dead_letters import DeadLetters
from infrastructure.broker.topology import (
    COMMAND_KEY,
    COMMANDS_EXCHANGE,
    COMMANDS_QUEUE,
    DEAD_QUEUE,
    EXCHANGE,
    HOPS_QUEUE,
    WORK_KEY,
)
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.settings.model import Settings
from tests.conftest import PARENT
from tests.integration.messaging_support import (
    Vhost,
    bound_workspace,
    components,
    dead_letters_cli,
    environment,
    promoted,
    publish_raw,
    queue_depth,
    sqlite_url,
    wait_for,
)
from tests.support import upstream
from worker.runtime import Runtime, build

pytestmark = pytest.mark.rabbitmq

FORGED_ID = "forged0000000001"


def death(queue: str, reason: str) -> dict[str, Any]:
    """An `x-death` entry as a producer forges it: naming the work key."""
    return {"queue": queue, "reason": reason, "exchange": EXCHANGE, "routing-keys": [WORK_KEY],
            "count": 1}  # fmt: skip


def user_of(url: str) -> str:
    return unquote(urlsplit(url).username or "")


def publish(url: str, message: messages.Message, **properties: Any) -> None:
    """Publish a command as the producer does, with confirms and `mandatory`."""
    publish_raw(url, message.encode(), COMMAND_KEY, exchange=COMMANDS_EXCHANGE, **properties)


@dataclass(frozen=True)
class Bound:
    """A brand the service provisioned: its workspace holds one project."""

    brand_id: str
    title: str
    workspace_id: str


@contextmanager
def runtime_for(vhost: Vhost, fake: FakeGateway, tmp_path: Path, **extra: str) -> Iterator[Runtime]:
    env = environment(sqlite_url(tmp_path), vhost.service_url, fake, **extra)
    with build(Settings.from_env(env)) as runtime:
        yield runtime


def provisioned(runtime: Runtime, fake: FakeGateway, brand_id: str) -> Bound:
    title = f"Vouched {brand_id}"
    with components(runtime, relay=True):
        runtime.service.request_provisioning(brand_id, title, PARENT)
        workspace_id = wait_for(lambda: bound_workspace(runtime, brand_id), "the brand", 30)
        fake.add_project(workspace_id)
        attempt_id = runtime.service.brand(brand_id).current_attempt_id
        assert attempt_id is not None
        promoted(runtime, attempt_id, 30)
    return Bound(brand_id, title, workspace_id)


def unchanged(runtime: Runtime, fake: FakeGateway, bound: Bound) -> None:
    brand = runtime.service.brand(bound.brand_id)
    assert brand.lifecycle == "active"
    assert brand.workspace_id == bound.workspace_id
    [workspace] = upstream(fake, bound.title)
    assert len(workspace["projects"]) == 1


def dead_letters(url: str) -> list[Any]:
    with DeadLetters(url) as letters:
        return letters.page().letters


def dead_letters_said(url: str, *args: str) -> str:
    """What `provisioner dead-letters ARGS` printed, having succeeded."""
    result = dead_letters_cli(url, *args)
    assert result.exit_code == 0, result.output
    return result.output


def test_a_forged_dead_letter_is_read_from_what_rabbitmq_set_and_replayed_to_its_queue(
    vhost: Vhost, fake: FakeGateway, tmp_path: Path, brand_id: str
) -> None:
    forged = {
        "x-dead-reason": "retries_exhausted",
        "x-dead-source": WORK_KEY,
        "x-dead-id": FORGED_ID,
        "x-first-death-queue": HOPS_QUEUE,
        # One entry RabbitMQ will update (same queue and reason), and an older one.
        "x-death": [death(COMMANDS_QUEUE, "expired"), death(HOPS_QUEUE, "rejected")],
    }
    with runtime_for(vhost, fake, tmp_path) as runtime:
        bound = provisioned(runtime, fake, brand_id)
        head = runtime.app.recorder.max_notification_id()
        # No worker consumes: the commands queue expires it into the dead queue itself.
        publish(vhost.producer_url, messages.decommission(brand_id), expiration=0.001,
                headers=forged, user_id=user_of(vhost.producer_url))  # fmt: skip
        wait_for(lambda: queue_depth(vhost.service_url, DEAD_QUEUE)[0] == 1, "the expiry", 10)

        [letter] = dead_letters(vhost.service_url)
        listed = dead_letters_said(vhost.service_url, "list")
        replayed = dead_letters_said(vhost.service_url, "replay", "--all")
        on_commands = queue_depth(vhost.service_url, COMMANDS_QUEUE)[0]
        on_hops = queue_depth(vhost.service_url, HOPS_QUEUE)[0]

        with components(runtime) as running:
            worker = running.worker
            assert worker is not None
            wait_for(lambda: worker.stats.dead_lettered == 1, "the replay's refusal", 10)
        [refused] = dead_letters(vhost.service_url)
        unchanged(runtime, fake, bound)
        assert runtime.app.recorder.max_notification_id() == head

    assert (letter.reason, letter.source_queue) == ("expired", COMMANDS_QUEUE)
    assert (letter.exchange, letter.routing_key) == (EXCHANGE, COMMAND_KEY)
    assert letter.id != FORGED_ID
    assert letter.producer == user_of(vhost.producer_url)
    assert f"from {COMMANDS_QUEUE}" in listed
    assert HOPS_QUEUE not in listed
    assert f"to {EXCHANGE}/{COMMAND_KEY}" in replayed
    assert (on_commands, on_hops) == (1, 0)
    assert (refused.reason, refused.source_queue) == ("wrong_queue", COMMANDS_QUEUE)
    assert refused.id == letter.id  # the replay's id, which the service vouched for


def test_a_scoped_producer_cannot_deactivate_another_producers_brand(
    vhost: Vhost, fake: FakeGateway, tmp_path: Path, brand_id: str
) -> None:
    producer = user_of(vhost.producer_url)
    own = f"mine-{uuid.uuid4().hex[:12]}"
    scopes = {"PROVISIONER_PRODUCER_SCOPES": f"{producer}=mine-*@{PARENT}"}
    with runtime_for(vhost, fake, tmp_path, **scopes) as runtime:
        bound = provisioned(runtime, fake, brand_id)
        head = runtime.app.recorder.max_notification_id()
        with components(runtime, relay=True) as running:
            worker = running.worker
            assert worker is not None
            publish(vhost.producer_url, messages.deactivate(brand_id), user_id=producer)
            publish(vhost.producer_url, messages.deactivate(brand_id))  # names no producer
            wait_for(lambda: worker.stats.dead_lettered == 2, "the refusals", 10)
            refusals = dead_letters(vhost.service_url)
            at_refusal = runtime.app.recorder.max_notification_id()

            # The scope holds through a replay.
            dead_letters_said(vhost.service_url, "replay", "--all")
            wait_for(lambda: worker.stats.dead_lettered == 4, "the refusals again", 10)
            again = dead_letters(vhost.service_url)

            publish(vhost.producer_url, messages.provision(own, f"Own {own}", PARENT),
                    user_id=producer)  # fmt: skip
            wait_for(lambda: worker.stats.by_type.get("provision"), "its own provision", 10)
        unchanged(runtime, fake, bound)
        assert runtime.service.brand(own).current_attempt_id is not None

    assert at_refusal == head  # nothing recorded
    for letters in (refusals, again):
        assert [x.reason for x in letters] == ["foreign_producer"] * 2
        assert [x.producer for x in letters] == [producer, None]
        assert {x.source_queue for x in letters} == {COMMANDS_QUEUE}
    errors = [x.errors for x in refusals]
    assert errors[0]["producer"] == producer
    assert f"may not command brand {brand_id!r}" in errors[0]["error"]
    assert "names no producer" in errors[1]["error"]
    assert [x.id for x in again] == [x.id for x in refusals]
    assert json.loads(refusals[0].body)["type"] == "deactivate"
