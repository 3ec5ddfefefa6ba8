"""A message of `provisioning.dead` as read (pure: no broker), for
infrastructure/dead_letters.py.

Two kinds of message land there:
- those the worker dead-letters itself (worker/delivery.py, `Broker.publish_dead`),
  with `x-dead-reason`, `x-dead-errors`, `x-dead-source` (the routing key they
  came on), `x-dead-id` (a fresh id, set once), and only the first
  `DEAD_BODY_KEPT` (8 KiB) bytes of the body, with the whole body's length
  (`x-dead-body-bytes`) and sha256 (`x-dead-body-sha256`) and whether it was cut
  (`x-dead-truncated`);
- those a queue dead-letters on its own (a rejected message, a quorum queue's
  delivery limit), which carry RabbitMQ's `x-death` (and `x-first-death-*`) and
  their whole body.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any

from infrastructure.broker import (
    COMMAND_KEY,
    COMMANDS_QUEUE,
    DEAD_BODY_KEPT,
    EXCHANGE,
    HOPS_QUEUE,
    WORK_KEY,
)
from infrastructure.redaction import Secrets

DEAD_HEADERS = ("x-death", "x-first-death-", "x-last-death-", "x-dead-")
_QUEUE_OF_KEY = {WORK_KEY: HOPS_QUEUE, COMMAND_KEY: COMMANDS_QUEUE}


class NotReplayable(Exception):
    """The dead letter keeps only the start of its body: replaying it would send a fragment."""

    def __init__(self, letter: DeadLetter) -> None:
        super().__init__(
            f"dead letter {letter.id} cannot be replayed: the dead-letter queue keeps only "
            f"the first {len(letter.body)} of its {letter.body_bytes} bytes, not the whole "
            "body; resend the message from its source, or purge it"
        )


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: str
    reason: str
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

    def age_s(self, now: float) -> float | None:
        return None if self.dead_at is None else max(0.0, now - self.dead_at)

    @property
    def replay_headers(self) -> dict[str, Any]:
        """The message's own headers, without the dead-letter ones."""
        return {k: v for k, v in self.headers.items() if not k.startswith(DEAD_HEADERS)}

    def scrubbed(self, secrets: Secrets) -> DeadLetter:
        """This dead letter as shown to a person: its reason, errors (keys and
        values), body and headers without any secret. Never replayed: a replay
        sends the message as it came."""
        return replace(
            self,
            reason=secrets.scrub(self.reason),
            errors=secrets.scrub_value(self.errors),
            body=secrets.scrub_bytes(self.body),
            headers=secrets.scrub_value(self.headers),
        )

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
            "body_bytes": self.body_bytes,
            "body_sha256": self.body_sha256,
            "truncated": self.truncated,
        }


@dataclass(frozen=True, slots=True)
class Page:
    """Dead letters in queue order; `more`: others follow the last one."""

    letters: list[DeadLetter]
    more: bool

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


def parse(body: bytes, headers: dict[str, Any] | None, timestamp: Any = None) -> DeadLetter:
    """A dead letter from a message of `provisioning.dead`, its body as the queue holds
    it; the letter keeps the first `DEAD_BODY_KEPT` bytes (pure: no broker)."""
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
            headers=headers,
            **_whole(body, headers),
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
        headers=headers,
        **_whole(body, headers),
    )
