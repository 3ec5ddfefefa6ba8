"""RabbitMQ topology and publishing (kombu); the in-process equivalent for `memory://`.

Topology (declared idempotently by `provisioner broker init` and by every process):

    exchange provisioning (direct, durable)
        work     -> queue provisioning.hops       hop, release, decommission
        command  -> queue provisioning.commands   provision, deactivate
        dead     -> queue provisioning.dead       rejected messages, with the reason
    queues provisioning.wait.<ms> (one per delay): x-message-ttl = ms, dead-lettered
        back to provisioning/work. Each queue has one TTL, so a long delay never
        holds a short one up (per-message TTLs only expire at a queue's head).
    exchange provisioning.events (topic, durable): integration events

Work and command queues dead-letter to provisioning/dead; with `quorum` queues
(a clustered RabbitMQ) an `x-delivery-limit` sends a message that keeps
crashing its consumer there instead of looping.

Publishing uses publisher confirms, and `mandatory` for everything but the
integration events (an event nobody listens to yet is not an error).

`memory://` (kombu's in-memory transport) has no TTL, dead-lettering or
confirms: delays are kept by `DelayScheduler`, a thread that publishes each
message when it is due, and dead letters are published directly.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Producer

from infrastructure.messages import COMMAND_TYPES, Message

log = logging.getLogger("provisioner.broker")

EXCHANGE = "provisioning"
EVENTS_EXCHANGE = "provisioning.events"
HOPS_QUEUE = "provisioning.hops"
COMMANDS_QUEUE = "provisioning.commands"
DEAD_QUEUE = "provisioning.dead"
WAIT_PREFIX = "provisioning.wait."
WORK_KEY, COMMAND_KEY, DEAD_KEY = "work", "command", "dead"


class Unroutable(RuntimeError):
    """The broker returned a mandatory message: no queue is bound for it."""


@dataclass(frozen=True, slots=True)
class Topology:
    queue_type: str = "classic"  # or "quorum" on a cluster
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

    def _arguments(self, *, dead_letter: bool) -> dict[str, Any]:
        args: dict[str, Any] = {"x-queue-type": self.queue_type}
        if dead_letter:
            args |= {"x-dead-letter-exchange": EXCHANGE, "x-dead-letter-routing-key": DEAD_KEY}
            if self.queue_type == "quorum":
                args["x-delivery-limit"] = self.delivery_limit
        return args

    def _queue(self, name: str, key: str, *, dead_letter: bool) -> Queue:
        return Queue(
            name,
            self.exchange,
            routing_key=key,
            durable=True,
            queue_arguments=self._arguments(dead_letter=dead_letter),
        )

    @property
    def hops(self) -> Queue:
        return self._queue(HOPS_QUEUE, WORK_KEY, dead_letter=True)

    @property
    def commands(self) -> Queue:
        return self._queue(COMMANDS_QUEUE, COMMAND_KEY, dead_letter=True)

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
        for queue in (self.hops, self.commands, self.dead):
            queue.bind(channel).declare()


def is_memory(url: str) -> bool:
    return url.startswith("memory://")


def connect(url: str) -> Connection:
    options = {} if is_memory(url) else {"confirm_publish": True}
    return Connection(url, transport_options=options, heartbeat=0 if is_memory(url) else 30)


class DelayScheduler:
    """Holds delayed messages in memory and publishes each when due (memory:// only)."""

    def __init__(self, url: str, topology: Topology) -> None:
        self._heap: list[tuple[float, int, Message, dict[str, Any] | None]] = []
        self._seq = itertools.count()
        self._wake = threading.Condition()
        self._stopped = False
        self._broker = Broker(url, topology, scheduler=None)
        self._thread = threading.Thread(target=self._run, name="delay-scheduler", daemon=True)
        self._thread.start()

    def schedule(
        self, message: Message, delay_s: float, headers: dict[str, Any] | None = None
    ) -> None:
        with self._wake:
            due = time.monotonic() + delay_s
            heapq.heappush(self._heap, (due, next(self._seq), message, headers))
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(5)
        self._broker.close()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._wake.wait(timeout)
                if self._stopped:
                    return
                _, _, message, headers = heapq.heappop(self._heap)
            self._broker.publish(message, headers=headers)


class Broker:
    """One connection for publishing; use it from one thread only."""

    def __init__(
        self, url: str, topology: Topology | None = None, *, scheduler: DelayScheduler | None
    ) -> None:
        self.url = url
        self.topology = topology or Topology()
        self.scheduler = scheduler
        self.connection = connect(url)
        self._returned: list[Any] = []
        self._declared: set[str] = set()
        self._producer: Producer | None = None

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self.connection.ensure_connection(max_retries=3)
            channel = self.connection.default_channel
            self.topology.declare(channel)
            self._producer = Producer(channel, on_return=self._on_return)
        return self._producer

    def _on_return(self, _exc: Any, exchange: str, routing_key: str, _message: Any) -> None:
        self._returned.append((exchange, routing_key))

    def close(self) -> None:
        self.connection.release()

    def declare(self) -> None:
        _ = self.producer

    def publish(
        self, message: Message, delay_s: float = 0.0, headers: dict[str, Any] | None = None
    ) -> None:
        """Publish a work or command message, after `delay_s` seconds if given."""
        key = COMMAND_KEY if message.type in COMMAND_TYPES else WORK_KEY
        delay_ms = round(delay_s * 1000)
        if delay_ms <= 0:
            self._send(message.encode(), exchange=EXCHANGE, routing_key=key, headers=headers)
        elif self.scheduler is not None:
            self.scheduler.schedule(message, delay_s, headers)
        else:
            queue = self.topology.wait(delay_ms)
            self._send(
                message.encode(),
                exchange="",
                routing_key=queue.name,
                headers=headers,
                declare=queue,
            )

    def publish_dead(self, body: bytes, reason: str, errors: dict[str, Any], source: str) -> None:
        headers = {
            "x-dead-reason": reason,
            "x-dead-errors": json.dumps(errors, default=str)[:2000],
            "x-dead-source": source,
        }
        self._send(body, exchange=EXCHANGE, routing_key=DEAD_KEY, headers=headers)

    def publish_event(self, routing_key: str, payload: dict[str, Any]) -> None:
        body = json.dumps(payload, default=str).encode()
        self._send(body, exchange=EVENTS_EXCHANGE, routing_key=routing_key, mandatory=False)

    def _send(
        self,
        body: bytes,
        *,
        exchange: str,
        routing_key: str,
        headers: dict[str, Any] | None = None,
        mandatory: bool = True,
        declare: Queue | None = None,
    ) -> None:
        for attempt in (1, 2):
            try:
                self._returned.clear()
                producer = self.producer
                if declare is not None and declare.name not in self._declared:
                    declare.bind(producer.channel).declare()
                    self._declared.add(declare.name)
                producer.publish(
                    body,
                    exchange=exchange,
                    routing_key=routing_key,
                    headers=headers or {},
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=2,
                    mandatory=mandatory and not is_memory(self.url),
                    retry=False,
                )
                break
            except self.connection.connection_errors as exc:
                log.warning("publish failed (%s); reconnecting", exc)
                self._producer = None
                self._declared.clear()
                broken, self.connection = self.connection, self.connection.clone()
                with contextlib.suppress(Exception):
                    broken.release()
                if attempt == 2:
                    raise
        if self._returned:
            raise Unroutable(f"no queue bound for {exchange or '(default)'}/{routing_key}")
