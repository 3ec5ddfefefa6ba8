"""RabbitMQ topology and publishing (kombu); the in-process equivalent for `memory://`.

Topology (declared idempotently by `provisioner broker init` and by every process):

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

Publishing uses publisher confirms, and `mandatory` for everything but the
integration events (an event nobody listens to yet is not an error).
`publish_many` (the relay's batches) sends every message of a batch and then
awaits the broker's confirms once, instead of one round trip per message.

Failures are told apart in `infrastructure/broker_failures.py`.

`memory://` (kombu's in-memory transport) has no TTL, dead-lettering or
confirms: delays are kept by `DelayScheduler`, a thread that publishes each
message when it is due, and dead letters are published directly.

Every kombu Connection of the project is made by `connection`: an `amqps://`
one checks the broker's certificate chain and its name (`BrokerTls`).
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import itertools
import json
import logging
import math
import ssl
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import amqp
from amqp import spec
from kombu.connection import Connection
from kombu.entity import Exchange, Queue, binding
from kombu.messaging import Producer

from infrastructure import messages
from infrastructure.failures import ConfigurationError
from infrastructure.messages import COMMAND_TYPES, Message

log = logging.getLogger("provisioner.broker")

EXCHANGE = "provisioning"
EVENTS_EXCHANGE = "provisioning.events"
COMMANDS_EXCHANGE = "provisioning.commands"  # the only one producers may publish to
# Named beside the types each accepts (messages.QUEUE_RULES).
HOPS_QUEUE = messages.HOPS_QUEUE
COMMANDS_QUEUE = messages.COMMANDS_QUEUE
DEAD_QUEUE = "provisioning.dead"
WAIT_PREFIX = "provisioning.wait."
WORK_KEY, COMMAND_KEY, DEAD_KEY = "work", "command", "dead"
# The bytes of a body a dead letter keeps: more than any well-formed message (about
# 7.6 KB with every text field at its 200 characters, each \u-escaped), far less
# than what a queue may be sent (a body refused as too large is not stored whole).
DEAD_BODY_KEPT = 8 * 1024


CONFIRM_TIMEOUT_S = 30.0


class Unroutable(RuntimeError):
    """The broker returned a mandatory message: no queue is bound for it."""


class NotConfirmed(RuntimeError):
    """The broker refused (nacked) a published message."""


@dataclass(frozen=True, slots=True)
class _Envelope:
    body: bytes
    exchange: str
    routing_key: str
    headers: dict[str, Any] | None = None
    mandatory: bool = True
    declare: Queue | None = None


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
            return Queue(name, self.exchange, routing_key=key, durable=True,
                         queue_arguments=arguments)  # fmt: skip
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
# share a bounded set: 0.1 s steps to a second, whole seconds to 10 s, 5 s steps
# to a minute, 30 s steps to ten minutes, 5 minutes beyond (about 60 queues up to
# an hour). A message is never due early (by more than a millisecond).
_RUNGS_S = ((1.0, 0.1), (10.0, 1.0), (60.0, 5.0), (600.0, 30.0), (float("inf"), 300.0))


def wait_rung_ms(delay_s: float) -> int:
    """The wait queue's delay for a message due in `delay_s` (0: no wait)."""
    if delay_s * 1000 < 1:
        return 0
    for limit, step in _RUNGS_S:
        if delay_s <= limit:
            return round(math.ceil((delay_s - 0.001) / step) * step * 1000)  # 1 ms early at most
    raise AssertionError("unreachable: the last rung has no limit")


def is_memory(url: str) -> bool:
    return url.startswith("memory://")


@dataclass(frozen=True, slots=True)
class BrokerTls:
    """What an `amqps://` connection trusts and shows: the CA file the broker's
    certificate must chain to (None: the system's CAs), and a client certificate
    with its key (both or neither)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs its key, and a key its certificate")

    def ssl_options(self, host: str) -> dict[str, Any]:
        """kombu's `ssl` argument as py-amqp reads it (`SSLTransport._wrap_socket_sni`):
        it checks the certificate's name only when given `server_hostname`, and loads
        the system's CAs when given no `ca_certs`."""
        options: dict[str, Any] = {
            "server_hostname": host,
            "cert_reqs": ssl.CERT_REQUIRED,
            "tls_minimum_version": ssl.TLSVersion.TLSv1_2,
        }
        if self.ca_file is not None:
            options["ca_certs"] = self.ca_file
        if self.cert_file is not None:
            options |= {"certfile": self.cert_file, "keyfile": self.key_file}
        return options


def connection(url: str, tls: BrokerTls | None = None, **options: Any) -> Connection:
    """A kombu Connection to `url`. For `amqps://`, with explicit TLS options (`tls`, or
    the system's CAs): by itself kombu passes `ssl=True`, with which py-amqp checks the
    chain but not that the certificate names the URL's host."""
    parts = urlsplit(url)
    # kombu would put a URL's ssl_* options in place of these.
    if any(key.lower().startswith("ssl") for key, _ in parse_qsl(parts.query)):
        raise ConfigurationError(
            "PROVISIONER_BROKER_URL has ssl_* query options: TLS is set with "
            "PROVISIONER_BROKER_CA_FILE, PROVISIONER_BROKER_CERT_FILE and _KEY_FILE"
        )
    if parts.scheme.lower() == "amqps":
        options["ssl"] = (tls or BrokerTls()).ssl_options(parts.hostname or "")
    return Connection(url, **options)


def connect(url: str, tls: BrokerTls | None = None) -> Connection:
    """A connection for publishing and consuming (confirms, heartbeats)."""
    options = {} if is_memory(url) else {"confirm_publish": True}
    heartbeat = 0 if is_memory(url) else 30
    return connection(url, tls, transport_options=options, heartbeat=heartbeat)


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
        self,
        url: str,
        topology: Topology | None = None,
        *,
        scheduler: DelayScheduler | None,
        tls: BrokerTls | None = None,
    ) -> None:
        self.url = url
        self.topology = topology or Topology()
        self.scheduler = scheduler
        self.connection = connect(url, tls)
        self._returned: list[Any] = []
        self._declared: set[str] = set()
        self._producer: Producer | None = None
        self._sequence = 0  # publishes on the producer's channel (its confirm tags)

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            # One try: the caller's loop backs off (kombu's retries would block it).
            self.connection.connect()
            channel = self.connection.default_channel
            self.topology.declare(channel)
            self._producer = Producer(channel, on_return=self._on_return)
            self._sequence = 0
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
        envelope = self._work(message, delay_s, headers)
        if envelope is not None:
            self._send_envelope(envelope)

    def publish_many(
        self,
        work: Sequence[tuple[Message, float]],
        events: Sequence[tuple[str, dict[str, Any]]] = (),
    ) -> None:
        """Publish work messages (with their delays) and integration events as one
        batch: all sent, then every confirm awaited. Raises if any was returned or
        refused; then the whole batch may be published again (duplicates are
        harmless by design, losses are not)."""
        envelopes = [e for m, d in work if (e := self._work(m, d, None)) is not None]
        envelopes += [self._event(key, payload) for key, payload in events]
        if not envelopes:
            return
        if is_memory(self.url):  # no confirms to batch
            for envelope in envelopes:
                self._send_envelope(envelope)
            return
        self._with_reconnect(lambda: self._publish_confirmed(envelopes))
        if self._returned:
            exchange, key = self._returned[0]
            raise Unroutable(f"no queue bound for {exchange or '(default)'}/{key}")

    def _work(
        self, message: Message, delay_s: float, headers: dict[str, Any] | None
    ) -> _Envelope | None:
        """Where a work or command message goes; None when the scheduler keeps it."""
        # Commands go the way producers send them; a delayed one comes back on work.
        command = message.type in COMMAND_TYPES
        exchange, key = (COMMANDS_EXCHANGE, COMMAND_KEY) if command else (EXCHANGE, WORK_KEY)
        delay_ms = wait_rung_ms(delay_s)
        if delay_ms <= 0:
            return _Envelope(message.encode(), exchange, key, headers)
        if self.scheduler is not None:
            self.scheduler.schedule(message, delay_s, headers)
            return None
        queue = self.topology.wait(delay_ms)
        return _Envelope(message.encode(), "", queue.name, headers, declare=queue)

    @staticmethod
    def _event(routing_key: str, payload: dict[str, Any]) -> _Envelope:
        body = json.dumps(payload, default=str).encode()
        return _Envelope(body, EVENTS_EXCHANGE, routing_key, mandatory=False)

    def _send_envelope(self, envelope: _Envelope) -> None:
        self._send(
            envelope.body,
            exchange=envelope.exchange,
            routing_key=envelope.routing_key,
            headers=envelope.headers,
            mandatory=envelope.mandatory,
            declare=envelope.declare,
        )

    def _publish_confirmed(self, envelopes: list[_Envelope]) -> None:
        """Send every envelope on the confirm-mode channel, then await their confirms.

        Confirm tags are the channel's publish sequence numbers (1, 2, ... from
        confirm.select), counted in `_sequence` for every publish on it. Confirms
        are tracked through the channel's basic_ack/basic_nack events, which see
        every confirm, also those that py-amqp reads while sending the next
        message of the batch (it drains pending frames before each publish).
        """
        self._returned.clear()
        channel: Any = self.producer.channel
        if not channel._confirm_selected:  # kombu selects lazily, on its first publish
            channel._confirm_selected = True
            channel.confirm_select()
            # Fresh, or revived by py-amqp after a channel error: tags restart at 1.
            self._sequence = 0
        outstanding: set[int] = set()
        refused: list[int] = []

        def confirmed(delivery_tag: int, multiple: bool) -> set[int]:
            done = {t for t in outstanding if t <= delivery_tag} if multiple else {delivery_tag}
            outstanding.difference_update(done)
            return done

        def on_ack(delivery_tag: int, multiple: bool) -> None:
            confirmed(delivery_tag, multiple)

        def on_nack(delivery_tag: int, multiple: bool) -> None:
            refused.extend(confirmed(delivery_tag, multiple))

        channel.events["basic_ack"].add(on_ack)
        channel.events["basic_nack"].add(on_nack)
        try:
            for envelope in envelopes:
                if envelope.declare is not None and envelope.declare.name not in self._declared:
                    envelope.declare.bind(channel).declare()
                    self._declared.add(envelope.declare.name)
                message = amqp.Message(
                    envelope.body,
                    content_type="application/json",
                    content_encoding="utf-8",
                    application_headers=envelope.headers or {},
                    delivery_mode=2,
                )
                self._sequence += 1
                outstanding.add(self._sequence)
                channel._basic_publish(
                    message,
                    exchange=envelope.exchange,
                    routing_key=envelope.routing_key,
                    mandatory=envelope.mandatory,
                )
            while outstanding:
                channel.wait([spec.Basic.Ack, spec.Basic.Nack], timeout=CONFIRM_TIMEOUT_S)
        finally:
            channel.events["basic_ack"].discard(on_ack)
            channel.events["basic_nack"].discard(on_nack)
        if refused:
            raise NotConfirmed(f"the broker refused {len(refused)} message(s) of a batch")

    def _with_reconnect(self, send: Any) -> None:
        for attempt in (1, 2):
            try:
                send()
            except self.connection.connection_errors as exc:
                # The caller's loop logs an outage once; this is one try of many.
                log.debug("publish failed (%s); reconnecting", exc)
                self._producer = None
                self._declared.clear()
                broken, self.connection = self.connection, self.connection.clone()
                with contextlib.suppress(Exception):
                    broken.release()
                if attempt == 2:
                    raise
            else:
                return

    def publish_dead(self, body: bytes, reason: str, errors: dict[str, Any], source: str) -> None:
        """Dead-letter `body` with the reason: only its first `DEAD_BODY_KEPT` bytes, with
        the whole body's length and sha256; `x-dead-truncated`: it cannot be replayed."""
        headers = {
            "x-dead-reason": reason,
            "x-dead-errors": json.dumps(errors, default=str)[:2000],
            "x-dead-source": source,
            "x-dead-id": uuid.uuid4().hex[:16],  # stable while it sits in the dead queue
            "x-dead-at": int(time.time()),
            "x-dead-body-bytes": len(body),
            "x-dead-body-sha256": hashlib.sha256(body).hexdigest(),
            "x-dead-truncated": len(body) > DEAD_BODY_KEPT,
        }
        kept = body[:DEAD_BODY_KEPT]
        self._send(kept, exchange=EXCHANGE, routing_key=DEAD_KEY, headers=headers)

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

        def send() -> None:
            self._returned.clear()
            producer = self.producer
            if declare is not None and declare.name not in self._declared:
                declare.bind(producer.channel).declare()
                self._declared.add(declare.name)
            if not getattr(producer.channel, "_confirm_selected", True):
                self._sequence = 0  # this publish selects confirms afresh: tags restart at 1
            # Counted before sending: a publish the broker nacks still used its tag.
            self._sequence += 1
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

        self._with_reconnect(send)
        if self._returned:
            raise Unroutable(f"no queue bound for {exchange or '(default)'}/{routing_key}")
