"""Publishing on RabbitMQ (kombu); the in-process equivalent for `memory://`.

The topology is in infrastructure/broker/topology.py, connections in
infrastructure/broker/connection.py, memory://'s delays in
infrastructure/broker/delays.py; their names are re-exported here.

Publishing uses publisher confirms, and `mandatory` for everything but the
integration events (an event nobody listens to yet is not an error).
`publish_many` (the relay's batches) sends every message of a batch and then
awaits the broker's confirms once, instead of one round trip per message.

Failures are told apart in `infrastructure/broker/failures.py`.

Every message carries the service's RabbitMQ user as its `user_id`, which the
broker checks against the connection's user: a worker tells the service's own
messages (and the headers it vouches for) from a producer's by it, and a
command it publishes on its own account (`rollout`, `retry`) names the service
in `x-producer`; one it sends on (a retry) carries the headers its caller
gives, naming the producer or nobody (infrastructure/broker/origins.py).

`memory://` (kombu's in-memory transport) has no TTL, dead-lettering or
confirms: delays are kept by `DelayScheduler`, and dead letters are published
directly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import amqp
from amqp import spec
from kombu.entity import Queue
from kombu.messaging import Producer

from infrastructure.broker.connection import connect, is_memory
from infrastructure.broker.delays import DelayScheduler
from infrastructure.broker.messages import COMMAND_TYPES, Message
from infrastructure.broker.origins import producer_header
from infrastructure.broker.topology import (
    COMMAND_KEY,
    COMMANDS_EXCHANGE,
    DEAD_KEY,
    EVENTS_EXCHANGE,
    EXCHANGE,
    WORK_KEY,
    Topology,
    wait_rung_ms,
)
from infrastructure.settings.model import BrokerTls

__all__ = [
    "DEAD_BODY_KEPT",
    "Broker",
    "NotConfirmed",
    "Unroutable",
]

log = logging.getLogger("provisioner.broker")

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
        # Who the broker knows us as (none on memory://, which checks no one).
        self.user: str | None = None if is_memory(url) else self.connection.userid
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
        if command and headers is None:  # on its own account; sent on, the caller names it
            headers = producer_header(self.user)
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
                    **self._vouched(),
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

    def _vouched(self) -> dict[str, str]:
        """The `user_id` property the broker checks: the service's own user."""
        return {} if self.user is None else {"user_id": self.user}

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

    def publish_dead(
        self,
        body: bytes,
        reason: str,
        errors: dict[str, Any],
        source: str,
        kept: Mapping[str, Any] | None = None,
    ) -> None:
        """Dead-letter `body` with the reason: only its first `DEAD_BODY_KEPT` bytes, with
        the whole body's length and sha256; `x-dead-truncated`: it cannot be replayed.
        `kept`: headers it keeps of the message (its content type and encoding, and the
        `x-dead-id` it was given when first dead-lettered, which wins over a fresh one)."""
        headers = {
            "x-dead-reason": reason,
            "x-dead-errors": json.dumps(errors, default=str)[:2000],
            "x-dead-source": source,
            "x-dead-id": uuid.uuid4().hex[:16],  # stable while it sits in the dead queue
            "x-dead-at": int(time.time()),
            "x-dead-body-bytes": len(body),
            "x-dead-body-sha256": hashlib.sha256(body).hexdigest(),
            "x-dead-truncated": len(body) > DEAD_BODY_KEPT,
            **(kept or {}),
        }
        self._send(body[:DEAD_BODY_KEPT], exchange=EXCHANGE, routing_key=DEAD_KEY, headers=headers)

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
                **self._vouched(),
            )

        self._with_reconnect(send)
        if self._returned:
            raise Unroutable(f"no queue bound for {exchange or '(default)'}/{routing_key}")
