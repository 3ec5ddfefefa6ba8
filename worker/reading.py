"""Reading one delivery: the message it holds and its retry counts, or why it has none.

`inspect` refuses what is not a message we understand — kombu's
`message.errors` (a compression header with junk), a content type or encoding
we do not speak, a bad `x-retries`, `x-waits` or `x-waited-ms` header, every `decode` refusal
(too large, too deeply nested, not UTF-8, invalid JSON, schema errors), and a
type its queue does not accept (`messages.QUEUE_RULES`: a hop, release or
decommission on the producers' commands queue is an `internal message on the
commands queue`), and on that queue a command its producer may not send
(`foreign_producer`: domain/producer_scopes.py; the producer is the one the
broker vouches for, infrastructure/broker/origins.py) — by raising `InvalidMessage`
with the reason. It reads; what becomes of a refused delivery is the
settler's (worker/delivery.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from domain.dead_letter_rules import Reason
from domain.producer_scopes import ProducerScopes
from infrastructure.broker.messages import (
    COMMANDS_QUEUE,
    InvalidMessage,
    Message,
    admit,
    decode,
    retries,
    waited_ms,
    waits,
)
from infrastructure.broker.origins import producer_of
from infrastructure.outages import one_line
from worker.retry_policy import DeliveryFacts


@dataclass(frozen=True, slots=True)
class Delivery:
    """A delivery that passed `inspect`: the message and its retry counts so far
    (infrastructure failures; refusals for now)."""

    message: Message
    tries: int
    waits: int = 0
    waited_ms: int = 0

    @property
    def facts(self) -> DeliveryFacts:
        return DeliveryFacts(self.message.type, self.tries, self.waits, self.waited_ms)


def inspect(message: Any, queue: str, scopes: ProducerScopes | None = None) -> Delivery:
    """The message and retry counts of a delivery from `queue`; InvalidMessage when it
    has none that queue accepts, or (with `scopes`) its producer may not send it."""
    if message.errors:
        exc = message.errors[0][1] if isinstance(message.errors[0], tuple) else message.errors[0]
        raise InvalidMessage("undecodable", {"kombu": one_line(exc)})
    headers = message.headers
    tries, waited, waited_for = retries(headers), waits(headers), waited_ms(headers)
    if headers and headers.get("compression") is not None:
        compression = repr(headers["compression"])[:50]
        raise InvalidMessage("unsupported encoding", {"compression": compression})
    decoded = decode(
        message.body, content_type=message.content_type, content_encoding=message.content_encoding
    )
    admitted = admit(queue, decoded)
    if queue == COMMANDS_QUEUE and scopes is not None:
        _check_producer(message, admitted, scopes)
    return Delivery(admitted, tries, waited, waited_for)


def _check_producer(message: Any, command: Message, scopes: ProducerScopes) -> None:
    """Refuse a command its producer's scope does not cover (`foreign_producer`)."""
    producer = producer_of(getattr(message, "properties", None), message.headers, scopes.service)
    brand_id = str(command.fields.get("brand_id", ""))
    why = scopes.refusal(producer, brand_id, command.fields.get("parent_workspace_id"))
    if why is not None:
        errors = {"producer": producer, "brand_id": brand_id, "error": why}
        raise InvalidMessage(Reason.FOREIGN_PRODUCER, errors)
