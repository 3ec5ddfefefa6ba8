"""RabbitMQ topology (kombu), declared idempotently by `provisioner broker init` and
by every process:

    exchange provisioning (direct, durable): the service's own
        work     -> queue provisioning.hops       hop, release, decommission
        command  -> queue provisioning.commands   provision, deactivate
        dead     -> queue provisioning.dead       rejected messages, with the reason
    exchange provisioning.commands (direct, durable): the producers' way in
        command  -> queue provisioning.commands   provision, deactivate
    queues provisioning.wait.<ms> (one per delay): x-message-ttl = ms, dead-lettered
        back to provisioning/work. Each queue has one TTL, so a long delay never
        holds a short one up (per-message TTLs only expire at a queue's head).
    exchange provisioning.events (topic, durable): integration events

Producers may write to provisioning.commands alone (docs/operations.md, "Broker
permissions"), and the worker accepts only commands from its queue
(`messages.QUEUE_RULES`). The service publishes commands there too, as a
producer does; the `command` key on provisioning stays bound for the dead-letter
replay and for producers not moved yet.

Work and command queues dead-letter to provisioning/dead; with `quorum` queues
(a clustered RabbitMQ) an `x-delivery-limit` sends a message that keeps
crashing its consumer there instead of looping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kombu.entity import Exchange, Queue, binding

from infrastructure.broker import messages
from infrastructure.settings.table import default_of

EXCHANGE = "provisioning"
EVENTS_EXCHANGE = "provisioning.events"
COMMANDS_EXCHANGE = "provisioning.commands"  # the only one producers may publish to
# Named beside the types each accepts (messages.QUEUE_RULES).
HOPS_QUEUE = messages.HOPS_QUEUE
COMMANDS_QUEUE = messages.COMMANDS_QUEUE
DEAD_QUEUE = "provisioning.dead"
WAIT_PREFIX = "provisioning.wait."
WORK_KEY, COMMAND_KEY, DEAD_KEY = "work", "command", "dead"


@dataclass(frozen=True, slots=True)
class Topology:
    queue_type: str = default_of("queue_type")  # classic, or quorum on a cluster
    delivery_limit: int = 20

    def __post_init__(self) -> None:
        if self.queue_type not in ("classic", "quorum"):
            raise ValueError(f"queue type must be classic or quorum, got {self.queue_type!r}")

    @property
    def exchange(self) -> Exchange:
        return Exchange(EXCHANGE, type="direct", durable=True)

    @property
    def events_exchange(self) -> Exchange:
        return Exchange(EVENTS_EXCHANGE, type="topic", durable=True)

    @property
    def commands_exchange(self) -> Exchange:
        return Exchange(COMMANDS_EXCHANGE, type="direct", durable=True)

    def _arguments(self, *, dead_letter: bool) -> dict[str, Any]:
        args: dict[str, Any] = {"x-queue-type": self.queue_type}
        if dead_letter:
            args |= {"x-dead-letter-exchange": EXCHANGE, "x-dead-letter-routing-key": DEAD_KEY}
            if self.queue_type == "quorum":
                args["x-delivery-limit"] = self.delivery_limit
        return args

    def _queue(
        self, name: str, key: str, *, dead_letter: bool, also: Exchange | None = None
    ) -> Queue:
        """A queue bound to `provisioning` with `key`, and to `also` with it too."""
        arguments = self._arguments(dead_letter=dead_letter)
        if also is None:
            return Queue(
                name, self.exchange, routing_key=key, durable=True, queue_arguments=arguments
            )
        # kombu binds a queue given `bindings` to those alone, so both are listed.
        bindings = [binding(exchange, routing_key=key) for exchange in (self.exchange, also)]
        return Queue(name, bindings=bindings, durable=True, queue_arguments=arguments)

    @property
    def hops(self) -> Queue:
        return self._queue(HOPS_QUEUE, WORK_KEY, dead_letter=True)

    @property
    def commands(self) -> Queue:
        return self._queue(
            COMMANDS_QUEUE, COMMAND_KEY, dead_letter=True, also=self.commands_exchange
        )

    @property
    def dead(self) -> Queue:
        return self._queue(DEAD_QUEUE, DEAD_KEY, dead_letter=False)

    def wait(self, delay_ms: int) -> Queue:
        args = self._arguments(dead_letter=False) | {
            "x-message-ttl": delay_ms,
            "x-dead-letter-exchange": EXCHANGE,
            "x-dead-letter-routing-key": WORK_KEY,
        }
        return Queue(f"{WAIT_PREFIX}{delay_ms}", durable=True, queue_arguments=args)

    def declare(self, channel: Any) -> None:
        self.exchange.bind(channel).declare()
        self.events_exchange.bind(channel).declare()
        self.commands_exchange.bind(channel).declare()
        for queue in (self.hops, self.commands, self.dead):
            queue.bind(channel).declare()


# Each delay has a wait queue of its own (a per-queue TTL keeps the order of expiry);
# delays are rounded up to a rung of this ladder so that jittered ones (deferred hops)
# share a bounded set: 0.1 s steps to a second, a quarter to 2 s, a half to 5 s (a
# hop told to come back in a second or two is not kept twice as long), whole seconds
# to 10 s, 5 s steps to a minute, 30 s steps to ten minutes, 5 minutes beyond (about
# 65 queues up to an hour). A message is never due early (by more than a millisecond).
_RUNGS_S = (
    (1.0, 0.1),
    (2.0, 0.25),
    (5.0, 0.5),
    (10.0, 1.0),
    (60.0, 5.0),
    (600.0, 30.0),
    (float("inf"), 300.0),
)


def wait_rung_ms(delay_s: float) -> int:
    """The wait queue's delay for a message due in `delay_s` (0: no wait)."""
    if delay_s * 1000 < 1:
        return 0
    for limit, step in _RUNGS_S:
        if delay_s <= limit:
            return round(math.ceil((delay_s - 0.001) / step) * step * 1000)  # 1 ms early at most
    raise AssertionError("unreachable: the last rung has no limit")
