"""What `provisioning.dead` holds, read without consuming it; replay and purge.

Two kinds of message land there:
- those the worker dead-letters itself (worker/delivery.py, `Broker.publish_dead`),
  with `x-dead-reason`, `x-dead-errors`, `x-dead-source` (the routing key they
  came on) and `x-dead-id` (a fresh id, set once);
- those a queue dead-letters on its own (a rejected message, a quorum queue's
  delivery limit), which carry RabbitMQ's `x-death` (and `x-first-death-*`).

Browsing takes every message with `basic.get` without acking it, then rejects
them all with requeue on the same channel (or the channel closes, which
requeues them too): RabbitMQ puts them back in their places, so order is kept
and nothing is lost, whatever happens in between. A message's id is its
`x-dead-id`, or for a message the queue dead-lettered, a hash of its body and
headers (stable while it sits in the queue).

`replay` re-publishes the chosen messages, confirmed, to the exchange and
routing key they came from, their headers stripped of the dead-letter ones,
and only then acks them in the dead queue. The embedded broker (`memory://`)
lives inside one process: another process never sees its dead letters.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import amqp

from infrastructure.broker import (
    COMMAND_KEY,
    COMMANDS_QUEUE,
    DEAD_QUEUE,
    EXCHANGE,
    HOPS_QUEUE,
    WORK_KEY,
    Topology,
    Unroutable,
    connect,
    is_memory,
)
from infrastructure.failures import ConfigurationError

EMBEDDED_NOTICE = (
    "the embedded broker (memory://) keeps dead letters only inside the process that "
    "made them: there is none to list, replay or purge from another process; "
    "set PROVISIONER_BROKER_URL to a RabbitMQ broker"
)
DEAD_HEADERS = ("x-death", "x-first-death-", "x-last-death-", "x-dead-")
_QUEUE_OF_KEY = {WORK_KEY: HOPS_QUEUE, COMMAND_KEY: COMMANDS_QUEUE}
DEFAULT_LIMIT = 10_000


class EmbeddedBroker(ConfigurationError):
    """Dead letters asked of `memory://`, which keeps none across processes."""

    def __init__(self) -> None:
        super().__init__(EMBEDDED_NOTICE)


class NotFound(LookupError):
    """No dead letter has this id."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: str
    reason: str
    source_queue: str
    exchange: str
    routing_key: str
    errors: dict[str, Any]
    dead_at: float | None  # epoch seconds, when known
    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)

    def age_s(self, now: float) -> float | None:
        return None if self.dead_at is None else max(0.0, now - self.dead_at)

    @property
    def replay_headers(self) -> dict[str, Any]:
        """The message's own headers, without the dead-letter ones."""
        return {k: v for k, v in self.headers.items() if not k.startswith(DEAD_HEADERS)}

    def summary(self, now: float) -> dict[str, Any]:
        age = self.age_s(now)
        return {
            "id": self.id,
            "reason": self.reason,
            "source_queue": self.source_queue,
            "exchange": self.exchange,
            "routing_key": self.routing_key,
            "errors": self.errors,
            "age_s": None if age is None else round(age, 1),
        }


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _errors(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        value = json.loads(_text(raw))
    except ValueError:
        return {"error": _text(raw)[:2000]}
    return value if isinstance(value, dict) else {"error": value}


def dead_letter_id(body: bytes, headers: dict[str, Any]) -> str:
    """The id of a message the queue dead-lettered itself: a hash of what it holds."""
    digest = hashlib.sha256(body)
    digest.update(json.dumps(headers, sort_keys=True, default=str).encode())
    return "h" + digest.hexdigest()[:15]


def parse(body: bytes, headers: dict[str, Any] | None, timestamp: Any = None) -> DeadLetter:
    """A dead letter from a message of `provisioning.dead` (pure: no broker)."""
    headers = dict(headers or {})
    if "x-dead-reason" in headers:
        key = _text(headers.get("x-dead-source", "?"))
        return DeadLetter(
            id=_text(headers.get("x-dead-id") or dead_letter_id(body, headers)),
            reason=_text(headers["x-dead-reason"]),
            source_queue=_QUEUE_OF_KEY.get(key, key),
            exchange=EXCHANGE,
            routing_key=key,
            errors=_errors(headers.get("x-dead-errors")),
            dead_at=_epoch(headers.get("x-dead-at")) or _epoch(timestamp),
            body=body,
            headers=headers,
        )
    deaths = headers.get("x-death") or [{}]
    first = deaths[-1] if isinstance(deaths, list) and deaths else {}
    keys = first.get("routing-keys") or [headers.get("x-first-death-queue", "?")]
    return DeadLetter(
        id=dead_letter_id(body, headers),
        reason=_text(first.get("reason") or headers.get("x-first-death-reason", "?")),
        source_queue=_text(first.get("queue") or headers.get("x-first-death-queue", "?")),
        exchange=_text(first.get("exchange") or headers.get("x-first-death-exchange", "")),
        routing_key=_text(keys[0]),
        errors={"count": first.get("count")} if first.get("count") else {},
        dead_at=_epoch(first.get("time")) or _epoch(timestamp),
        body=body,
        headers=headers,
    )


class DeadLetters:
    """`provisioning.dead` on a RabbitMQ broker (one connection, one channel)."""

    def __init__(self, url: str, topology: Topology | None = None) -> None:
        if is_memory(url):
            raise EmbeddedBroker()
        self.connection: Any = connect(url)
        self.topology = topology or Topology()
        self.channel: Any = None

    def __enter__(self) -> DeadLetters:
        self.connection.ensure_connection(max_retries=1)
        self.channel = self.connection.channel()
        self.topology.declare(self.channel)
        return self

    def __exit__(self, *_: object) -> None:
        with contextlib.suppress(Exception):
            self.connection.release()

    @contextlib.contextmanager
    def _taken(self, limit: int) -> Iterator[tuple[Any, list[tuple[int, DeadLetter]]]]:
        """Every message (up to `limit`) held unacked on a channel of its own; whatever
        is not acked in the block goes back in its place when the channel closes,
        however the block ends."""
        channel = self.connection.channel()
        taken: list[tuple[int, DeadLetter]] = []
        try:
            while len(taken) < limit:
                raw = channel.basic_get(DEAD_QUEUE, no_ack=False)
                if raw is None:
                    break
                headers = raw.properties.get("application_headers") or {}
                body = raw.body if isinstance(raw.body, bytes) else str(raw.body).encode()
                letter = parse(body, headers, raw.properties.get("timestamp"))
                taken.append((raw.delivery_tag, letter))
            yield channel, taken
        finally:
            with contextlib.suppress(Exception):
                channel.close()  # the broker requeues every unacked message, in its place

    def all(self, limit: int = DEFAULT_LIMIT) -> list[DeadLetter]:
        with self._taken(limit) as (_, taken):
            return [letter for _, letter in taken]

    def counts_by_reason(self, limit: int = DEFAULT_LIMIT) -> dict[str, int]:
        """How many dead letters there are by reason (for a metric or a health check)."""
        return dict(Counter(letter.reason for letter in self.all(limit)))

    def show(self, letter_id: str) -> DeadLetter:
        for letter in self.all():
            if letter.id == letter_id:
                return letter
        raise NotFound(f"no dead letter {letter_id} in {DEAD_QUEUE}")

    def replay(self, letter_id: str | None = None) -> list[DeadLetter]:
        """Re-publish one dead letter (or all with None) where it came from; each is
        acked in the dead queue only once the broker confirmed its copy."""
        replayed: list[DeadLetter] = []
        with self._taken(DEFAULT_LIMIT) as (held, taken):
            chosen = [(t, x) for t, x in taken if letter_id is None or x.id == letter_id]
            if letter_id is not None and not chosen:
                raise NotFound(f"no dead letter {letter_id} in {DEAD_QUEUE}")
            for tag, letter in chosen:
                self._republish(letter)
                held.basic_ack(tag)
                replayed.append(letter)
        return replayed

    def _republish(self, letter: DeadLetter) -> None:
        """Publish a copy, confirmed (the connection is in confirm mode) and routed."""
        returned: list[Any] = []

        def on_return(*args: Any) -> None:
            returned.append(args)

        channel = self.channel
        channel.events["basic_return"].add(on_return)
        try:
            message = amqp.Message(
                letter.body,
                content_type="application/json",
                content_encoding="utf-8",
                application_headers=letter.replay_headers,
                delivery_mode=2,
            )
            channel.basic_publish(
                message, exchange=letter.exchange, routing_key=letter.routing_key, mandatory=True
            )
        finally:
            channel.events["basic_return"].discard(on_return)
        if returned:
            raise Unroutable(
                f"no queue bound for {letter.exchange or '(default)'}/{letter.routing_key}: "
                f"dead letter {letter.id} kept"
            )

    def purge(self) -> int:
        """Delete every dead letter; how many there were."""
        return int(self.channel.queue_purge(DEAD_QUEUE) or 0)


def now() -> float:
    return time.time()
