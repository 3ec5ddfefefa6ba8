"""A message of `provisioning.dead` as read (pure: no broker), for
infrastructure/broker/dead_letters.py.

Two kinds of message land there:
- those the worker dead-letters itself (worker/delivery.py, `Broker.publish_dead`),
  with `x-dead-reason` (a `Reason`), `x-dead-errors`, `x-dead-source` (the
  routing key they came on), `x-dead-id`, the message's own content type and
  encoding (`x-dead-content-type`, `x-dead-content-encoding`: "" for none; the
  dead letter itself is labelled JSON), and only the first `DEAD_BODY_KEPT`
  (8 KiB) bytes of the body, with the whole body's length (`x-dead-body-bytes`)
  and sha256 (`x-dead-body-sha256`) and whether it was cut (`x-dead-truncated`);
- those a queue dead-letters on its own (a rejected or expired message, a quorum
  queue's delivery limit), which carry RabbitMQ's `x-death`, their whole body and
  their own properties and headers: whatever their publisher wrote.

Only the service and the broker are believed
(docs/decisions/030-broker-vouched-origins.md). A letter without `x-death` was
published to `provisioning` by the service (no producer may publish there), so its
`x-dead-*` headers are the worker's.
A letter with `x-death` was dead-lettered by a queue: a producer may have written
any `x-dead-*`, `x-death` or `x-first-death-*` header on it, so it is read from the
newest `x-death` entry alone, whose queue and reason RabbitMQ sets, and it goes back
to that queue's route (`ROUTE_OF_QUEUE`), never to the routing key an entry names.
Its `x-dead-id` and `x-producer` count only when the service published it (a replay:
infrastructure/broker/origins.py).

An id is given once: `x-dead-id`, set fresh when the worker first dead-letters a
message, or a hash of the body and headers for one the queue dead-lettered. A
replay sends the message back with its `x-dead-id` (`replay_headers`), and a
message that is dead-lettered again keeps it (`kept_of`), so its id does not
change. A replay also names the message's producer (`x-producer`, "" when
unknown), so a producer's scope still applies to its command. A reason as stored is read through
`reason_of`: letters written with an older label ("schema errors",
`UnknownAttempt`) read as today's reason.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from domain.dead_letter_rules import reason_of
from infrastructure.broker.origins import PRODUCER_HEADER, producer_header, publisher_of
from infrastructure.broker.publisher import DEAD_BODY_KEPT
from infrastructure.broker.topology import (
    COMMAND_KEY,
    COMMANDS_QUEUE,
    EXCHANGE,
    HOPS_QUEUE,
    WORK_KEY,
)
from infrastructure.redaction import Secrets

DEAD_HEADERS = ("x-death", "x-first-death-", "x-last-death-", "x-dead-")
ID_HEADER = "x-dead-id"
CONTENT_TYPE_HEADER = "x-dead-content-type"
CONTENT_ENCODING_HEADER = "x-dead-content-encoding"
# What a worker's dead letter written before these headers held: JSON it could not read.
LEGACY_CONTENT = ("application/json", "utf-8")
_ID = re.compile(r"[0-9A-Za-z]{1,64}")  # an id kept from a message: short and printable
_QUEUE_OF_KEY = {WORK_KEY: HOPS_QUEUE, COMMAND_KEY: COMMANDS_QUEUE}
# Where a message a queue dead-lettered goes back to: its queue's own route.
ROUTE_OF_QUEUE = {HOPS_QUEUE: (EXCHANGE, WORK_KEY), COMMANDS_QUEUE: (EXCHANGE, COMMAND_KEY)}


class NotReplayable(Exception):
    """The dead letter keeps only the start of its body: replaying it would send a fragment."""

    def __init__(self, letter: DeadLetterEntry) -> None:
        super().__init__(
            f"dead letter {letter.id} cannot be replayed: the dead-letter queue keeps only "
            f"the first {len(letter.body)} of its {letter.body_bytes} bytes, not the whole "
            "body; resend the message from its source, or purge it"
        )


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    id: str
    reason: str  # a `Reason` value
    source_queue: str
    exchange: str
    routing_key: str
    errors: dict[str, Any]
    dead_at: float | None  # epoch seconds, when known
    body: bytes  # its first DEAD_BODY_KEPT bytes
    body_bytes: int  # the whole body's length, as it was dead-lettered
    body_sha256: str  # and its sha256 (hex)
    truncated: bool  # the queue holds less than the whole body: it cannot be replayed
    headers: dict[str, Any] = field(default_factory=dict)
    content_type: str | None = None  # the message's own, to replay it with
    content_encoding: str | None = None
    stored_reason: str = ""  # the label as the letter holds it, when not `reason`
    producer: str | None = None  # whose command it was, as the broker or the service says

    def age_s(self, now: float) -> float | None:
        return None if self.dead_at is None else max(0.0, now - self.dead_at)

    @property
    def replay_headers(self) -> dict[str, Any]:
        """The message's own headers, without the dead-letter ones but its id (dead-lettered
        again, it keeps the id), and naming its producer (never the one a header claimed)."""
        own = {
            k: v
            for k, v in self.headers.items()
            if not k.startswith(DEAD_HEADERS) and k != PRODUCER_HEADER
        }
        return {**own, ID_HEADER: self.id, **producer_header(self.producer)}

    def scrubbed(self, secrets: Secrets) -> DeadLetterEntry:
        """This dead letter as shown to a person: its reason, errors (keys and
        values), body and headers without any secret. Never replayed: a replay
        sends the message as it came."""
        return replace(
            self,
            reason=secrets.scrub(self.reason),
            errors=secrets.scrub_value(self.errors),
            body=secrets.scrub_bytes(self.body),
            headers=secrets.scrub_value(self.headers),
            producer=None if self.producer is None else secrets.scrub(self.producer),
        )

    def summary(self, now: float) -> dict[str, Any]:
        age = self.age_s(now)
        shown: dict[str, Any] = {
            "id": self.id,
            "reason": self.reason,
            "source_queue": self.source_queue,
            "exchange": self.exchange,
            "routing_key": self.routing_key,
            "errors": self.errors,
            "age_s": None if age is None else round(age, 1),
            "body_bytes": self.body_bytes,
            "body_sha256": self.body_sha256,
            "truncated": self.truncated,
            "content_type": self.content_type,
            "content_encoding": self.content_encoding,
        }
        if self.stored_reason:
            shown["stored_reason"] = self.stored_reason
        if self.producer:
            shown["producer"] = self.producer
        return shown


@dataclass(frozen=True, slots=True)
class Page:
    """Dead letters in queue order; `more`: others follow the last one; `counts`:
    how many letters the whole queue holds by reason, the most first (when asked)."""

    letters: list[DeadLetterEntry]
    more: bool
    counts: list[tuple[str, int]] = field(default_factory=list)

    @property
    def after(self) -> str | None:
        """The id to ask the next page after (None on the last page)."""
        return self.letters[-1].id if self.more and self.letters else None


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


def _whole(body: bytes, headers: dict[str, Any]) -> dict[str, Any]:
    """What a dead letter tells of its whole body: its length and sha256 as the worker
    recorded them (else the body's own), and whether the queue holds less of it."""
    try:
        size = int(headers.get("x-dead-body-bytes", len(body)))
    except (TypeError, ValueError):
        size = len(body)
    digest = _text(headers.get("x-dead-body-sha256") or hashlib.sha256(body).hexdigest())
    truncated = bool(headers.get("x-dead-truncated")) or size > len(body)
    return {
        "body": body[:DEAD_BODY_KEPT],
        "body_bytes": size,
        "body_sha256": digest,
        "truncated": truncated,
    }


def kept_of(headers: object, content_type: object, content_encoding: object) -> dict[str, Any]:
    """What a dead letter the worker writes keeps of the message it came from: its
    content type and encoding ("" for none), and its id when a replay gave it one."""
    kept: dict[str, Any] = {
        CONTENT_TYPE_HEADER: _property(content_type),
        CONTENT_ENCODING_HEADER: _property(content_encoding),
    }
    return {**kept, **kept_id(headers)}


def kept_id(headers: object) -> dict[str, str]:
    """The dead-letter id a replay gave the message (empty when none, or not ours)."""
    given = headers.get(ID_HEADER) if isinstance(headers, Mapping) else None
    if given is not None and _ID.fullmatch(_text(given)):
        return {ID_HEADER: _text(given)}
    return {}


def _property(value: object) -> str:
    return "" if value is None else _text(value)[:100]


def _content(headers: dict[str, Any]) -> dict[str, Any]:
    """The content type and encoding a worker's dead letter kept of its message."""
    if CONTENT_TYPE_HEADER not in headers:
        content_type, encoding = LEGACY_CONTENT
        return {"content_type": content_type, "content_encoding": encoding}
    return {
        "content_type": _text(headers[CONTENT_TYPE_HEADER]) or None,
        "content_encoding": _text(headers.get(CONTENT_ENCODING_HEADER) or "") or None,
    }


def _reason(label: Any) -> dict[str, Any]:
    """The reason a stored label means, and the label when it is not that reason."""
    text = _text(label)
    reason = reason_of(text)
    return {"reason": reason.value, "stored_reason": "" if text == reason.value else text}


def parse(
    body: bytes,
    headers: dict[str, Any] | None,
    timestamp: Any = None,
    *,
    content_type: str | None = None,
    content_encoding: str | None = None,
    user_id: str | None = None,
    service: str | None = None,
) -> DeadLetterEntry:
    """A dead letter from a message of `provisioning.dead`, its body as the queue holds
    it, with its own content type, encoding and `user_id` (`service`: the service's
    user); the letter keeps the first `DEAD_BODY_KEPT` bytes (pure: no broker)."""
    headers = dict(headers or {})
    if "x-death" in headers:
        return _queues(
            body,
            headers,
            timestamp,
            content_type,
            content_encoding,
            vouched=service is not None and user_id == service,
            publisher=publisher_of({"user_id": user_id}),
        )
    if "x-dead-reason" in headers:
        key = _text(headers.get("x-dead-source", "?"))
        return DeadLetterEntry(
            id=_text(headers.get(ID_HEADER) or dead_letter_id(body, headers)),
            **_reason(headers["x-dead-reason"]),
            source_queue=_QUEUE_OF_KEY.get(key, key),
            exchange=EXCHANGE,
            routing_key=key,
            errors=_errors(headers.get("x-dead-errors")),
            dead_at=_epoch(headers.get("x-dead-at")) or _epoch(timestamp),
            headers=headers,
            producer=_text(headers.get(PRODUCER_HEADER) or "") or None,
            **_content(headers),
            **_whole(body, headers),
        )
    return _queues(
        body, headers, timestamp, content_type, content_encoding, vouched=False, publisher=None
    )


def _queues(
    body: bytes,
    headers: dict[str, Any],
    timestamp: Any,
    content_type: str | None,
    content_encoding: str | None,
    *,
    vouched: bool,
    publisher: str | None,
) -> DeadLetterEntry:
    """A letter a queue dead-lettered, read from what RabbitMQ set: the newest `x-death`
    entry's queue and reason (it updates an older entry of the same queue and reason,
    keeping that entry's other fields, so those may be a producer's). Its own `x-dead-id`
    and `x-producer` count when the service published it (`vouched`)."""
    deaths = headers.get("x-death")
    newest = deaths[0] if isinstance(deaths, list) and deaths else {}
    newest = newest if isinstance(newest, dict) else {}
    queue = _text(newest.get("queue") or "?")
    exchange, key = ROUTE_OF_QUEUE.get(queue, ("", queue))
    given = _text(headers.get(ID_HEADER) or "") if vouched else ""  # a replay's
    named = vouched and PRODUCER_HEADER in headers
    return DeadLetterEntry(
        id=given if _ID.fullmatch(given) else dead_letter_id(body, headers),
        **_reason(newest.get("reason") or "?"),
        source_queue=queue,
        exchange=exchange,
        routing_key=key,
        errors={"count": newest.get("count")} if newest.get("count") else {},
        dead_at=_epoch(newest.get("time")) or _epoch(timestamp),
        headers=headers,
        content_type=content_type,
        content_encoding=content_encoding,
        producer=(_text(headers[PRODUCER_HEADER] or "") or None) if named else publisher,
        **_whole(body, headers),
    )
