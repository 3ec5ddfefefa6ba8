"""The messages on the broker: JSON only, each with `type` and `version`,
validated by marshmallow schemas. Never pickle.

| type           | version | fields                                       | sent to               |
|----------------|---------|----------------------------------------------|-----------------------|
| `hop`          | 1       | attempt_id (UUID), hop (int >= 0)            | provisioning.hops     |
| `release`      | 1       | attempt_id (UUID)                            | provisioning.hops     |
| `decommission` | 1       | brand_id                                     | provisioning.hops     |
| `provision`    | 1       | brand_id, title, parent_workspace_id,        | provisioning.commands |
|                |         | requested_at?                                |                       |
| `deactivate`   | 1       | brand_id, requested_at?                      | provisioning.commands |

Which types each queue the worker consumes accepts is `QUEUE_RULES`:
`provisioning.commands` is the producers' way in, so it takes commands alone;
`provisioning.hops`, which only the service can publish to, takes every type
(a command retried after a delay comes back through it). A type a queue does
not accept is refused like any other invalid message (`admit`), because broker
permissions can let a producer publish to an exchange but not choose what its
body says (docs/operations.md, "Broker permissions").

`requested_at` (optional): the producer's time of the command, ISO 8601 with an
offset; without it the worker orders the command at the time it handles it.

`decode` turns a raw body into a `Message` or raises `InvalidMessage` whose
`reason` and `errors` say what is wrong (they travel with the dead letter);
`body` gives a decoded message's fields as its type's dataclass (`Hop`,
`Release`, ... : `BODIES`), which is what the worker's handlers read.
It never lets a producer's body blow up the consumer: a body over
`MAX_BODY_BYTES` (64 KiB; real messages are a few hundred bytes), nested
deeper than `MAX_DEPTH`, not UTF-8, or with a content type or encoding we do
not speak is refused before JSON parsing. `retries` reads the `x-retries`
header the same way (a bad value is refused, never trusted).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any
from uuid import UUID

from marshmallow import Schema, ValidationError, fields, validate

from domain.policies import MAX_HOP

TEXT = validate.Length(min=1, max=200)


class HopSchema(Schema):
    attempt_id = fields.UUID(required=True)
    hop = fields.Integer(required=True, strict=True, validate=validate.Range(min=0, max=MAX_HOP))


class ReleaseSchema(Schema):
    attempt_id = fields.UUID(required=True)


class BrandSchema(Schema):
    brand_id = fields.String(required=True, validate=TEXT)


class ProvisionSchema(Schema):
    brand_id = fields.String(required=True, validate=TEXT)
    title = fields.String(required=True, validate=TEXT)
    parent_workspace_id = fields.String(required=True, validate=TEXT)
    requested_at = fields.AwareDateTime(format="iso")


class DeactivateSchema(Schema):
    brand_id = fields.String(required=True, validate=TEXT)
    requested_at = fields.AwareDateTime(format="iso")


SCHEMAS: dict[tuple[str, int], Schema] = {
    ("hop", 1): HopSchema(),
    ("release", 1): ReleaseSchema(),
    ("decommission", 1): BrandSchema(),
    ("provision", 1): ProvisionSchema(),
    ("deactivate", 1): DeactivateSchema(),
}
COMMAND_TYPES = frozenset({"provision", "deactivate"})  # what producers send
INTERNAL_TYPES = frozenset({"hop", "release", "decommission"})  # what the service sends itself

HOPS_QUEUE = "provisioning.hops"
COMMANDS_QUEUE = "provisioning.commands"


@dataclass(frozen=True, slots=True)
class QueueRule:
    """The types a queue accepts; a delivery of another type is dead-lettered with `refusal`."""

    accepts: frozenset[str]
    refusal: str


QUEUE_RULES: Mapping[str, QueueRule] = MappingProxyType(
    {
        HOPS_QUEUE: QueueRule(COMMAND_TYPES | INTERNAL_TYPES, "unexpected type on the hops queue"),
        COMMANDS_QUEUE: QueueRule(COMMAND_TYPES, "internal message on the commands queue"),
    }
)


class InvalidMessage(ValueError):
    """A body that is not a message we understand; `errors` says why."""

    def __init__(self, reason: str, errors: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.errors = errors or {}


@dataclass(frozen=True, slots=True)
class Message:
    type: str
    version: int
    fields: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        return encode(self.type, self.version, **self.fields)


# Each type's fields, typed: what a handler reads (`body`), once `decode` has
# validated them against the type's schema.


@dataclass(frozen=True, slots=True)
class Hop:
    attempt_id: UUID
    hop: int


@dataclass(frozen=True, slots=True)
class Release:
    attempt_id: UUID


@dataclass(frozen=True, slots=True)
class Decommission:
    brand_id: str


@dataclass(frozen=True, slots=True)
class Provision:
    brand_id: str
    title: str
    parent_workspace_id: str
    requested_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Deactivate:
    brand_id: str
    requested_at: datetime | None = None


Body = Hop | Release | Decommission | Provision | Deactivate
BODIES: Mapping[str, type[Body]] = MappingProxyType(
    {
        "hop": Hop,
        "release": Release,
        "decommission": Decommission,
        "provision": Provision,
        "deactivate": Deactivate,
    }
)


def body(message: Message) -> Body:
    """The message's fields as its type's dataclass (`BODIES`); InvalidMessage for a
    type without one or fields that do not fit it (a decoded message's always do)."""
    kind = BODIES.get(message.type)
    if kind is None:
        raise InvalidMessage("unknown type", {"type": message.type[:50]})
    try:
        return kind(**message.fields)
    except TypeError as exc:
        raise InvalidMessage("schema errors", {"fields": _short(exc)}) from None


def hop(attempt_id: UUID, hop_number: int) -> Message:
    return Message("hop", 1, {"attempt_id": attempt_id, "hop": hop_number})


def release(attempt_id: UUID) -> Message:
    return Message("release", 1, {"attempt_id": attempt_id})


def decommission(brand_id: str) -> Message:
    return Message("decommission", 1, {"brand_id": brand_id})


def provision(
    brand_id: str,
    title: str,
    parent_workspace_id: str,
    requested_at: datetime | None = None,
) -> Message:
    values: dict[str, Any] = {
        "brand_id": brand_id,
        "title": title,
        "parent_workspace_id": parent_workspace_id,
    }
    if requested_at is not None:
        values["requested_at"] = requested_at
    return Message("provision", 1, values)


def deactivate(brand_id: str, requested_at: datetime | None = None) -> Message:
    values: dict[str, Any] = {"brand_id": brand_id}
    if requested_at is not None:
        values["requested_at"] = requested_at
    return Message("deactivate", 1, values)


def encode(type_: str, version: int, **values: Any) -> bytes:
    """Validate and serialise; raises InvalidMessage for what decode would refuse."""
    schema = _schema(type_, version)
    data = schema.dump(values)
    errors = schema.validate(data)
    if errors:
        raise InvalidMessage("schema errors", {"fields": errors})
    return json.dumps({"type": type_, "version": version, **data}).encode()


# The edges of what a consumer reads (docs/messaging.md, "Delivery guarantees").
MAX_BODY_BYTES = 64 * 1024
MAX_DEPTH = 8  # our messages are flat objects (depth 1)
MAX_RETRIES_HEADER = 1000
MAX_WAITED_MS_HEADER = 7 * 24 * 3600 * 1000  # a week of waiting: more is not ours
CONTENT_TYPES = frozenset({"application/json"})
CONTENT_ENCODINGS = frozenset({"utf-8", "utf8"})
# The bytes that change the nesting or the string state; everything else is skipped.
_SPECIAL = re.compile(rb'[\[\]{}"\\]')


def decode(
    body: object, *, content_type: object = None, content_encoding: object = None
) -> Message:
    """The message in `body`; raises InvalidMessage (never anything else) if it is not one.

    `content_type` and `content_encoding` are the delivery's properties (None when
    absent): only JSON in UTF-8 is accepted.
    """
    try:
        return _decode(_raw_bytes(body, content_type, content_encoding))
    except InvalidMessage:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a body does, it is refused
        raise InvalidMessage("undecodable", {"error": _short(exc)}) from None


def admit(queue: str, message: Message) -> Message:
    """`message` if `queue` accepts its type; else InvalidMessage with the queue's refusal.

    A queue not in QUEUE_RULES accepts nothing: a new queue must say what it takes.
    """
    rule = QUEUE_RULES.get(queue)
    if rule is None:
        raise InvalidMessage("unknown queue", {"queue": queue[:100], "type": message.type})
    if message.type not in rule.accepts:
        errors = {"type": message.type, "queue": queue, "accepts": sorted(rule.accepts)}
        raise InvalidMessage(rule.refusal, errors)
    return message


def retries(headers: object) -> int:
    """The delivery's `x-retries` count (infrastructure failures so far)."""
    return _count(headers, "x-retries")


def waits(headers: object) -> int:
    """The delivery's `x-waits` count (refusals for now so far)."""
    return _count(headers, "x-waits")


def waited_ms(headers: object) -> int:
    """The delivery's `x-waited-ms`: how long its refusals for now have waited in all."""
    return _count(headers, "x-waited-ms", limit=MAX_WAITED_MS_HEADER)


def _count(headers: object, name: str, limit: int = 0) -> int:
    """A count header of the delivery (0 when absent); InvalidMessage when malformed."""
    if headers is None:
        return 0
    if not isinstance(headers, Mapping):
        raise InvalidMessage("bad header", {"headers": type(headers).__name__})
    value = headers.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidMessage("bad header", {name: repr(value)[:50]})
    if not 0 <= value <= (limit or MAX_RETRIES_HEADER):
        raise InvalidMessage("bad header", {name: value})
    return value


def _raw_bytes(body: object, content_type: object, content_encoding: object) -> bytes:
    if content_type is not None and (
        not isinstance(content_type, str) or content_type.lower() not in CONTENT_TYPES
    ):
        raise InvalidMessage("unsupported content type", {"content_type": repr(content_type)[:50]})
    if content_encoding is not None and (
        not isinstance(content_encoding, str) or content_encoding.lower() not in CONTENT_ENCODINGS
    ):
        raise InvalidMessage(
            "unsupported encoding", {"content_encoding": repr(content_encoding)[:50]}
        )
    if isinstance(body, str):
        if len(body) > MAX_BODY_BYTES:  # each character is at least one byte
            raise InvalidMessage("too large", {"size": len(body), "max": MAX_BODY_BYTES})
        try:
            raw = body.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidMessage("not UTF-8", {"error": _short(exc)}) from None
    elif isinstance(body, bytes | bytearray | memoryview):
        raw = bytes(body)
    else:
        raise InvalidMessage("not a byte string", {"body": type(body).__name__})
    if len(raw) > MAX_BODY_BYTES:
        raise InvalidMessage("too large", {"size": len(raw), "max": MAX_BODY_BYTES})
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessage("not UTF-8", {"error": _short(exc)}) from None
    return raw


def _depth(raw: bytes) -> int:
    """How deeply the JSON in `raw` nests (brackets inside strings do not count).

    One pass over the special bytes, in linear time whatever the body: a
    backtracking pattern for whole strings would rescan from every `"` of an
    unterminated string (quadratic: seconds for 64 KiB, on the consuming thread).
    """
    depth = deepest = 0
    in_string = False
    escaped_at = -1  # the offset of the byte a backslash escapes
    for match in _SPECIAL.finditer(raw):
        at = match.start()
        char = raw[at]
        if in_string:
            if at == escaped_at:
                continue
            if char == 0x5C:  # backslash
                escaped_at = at + 1
            elif char == 0x22:  # quote
                in_string = False
        elif char == 0x22:
            in_string = True
        elif char in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_DEPTH:
                    return deepest
        elif char in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def _decode(raw: bytes) -> Message:
    if _depth(raw) > MAX_DEPTH:
        raise InvalidMessage("too deeply nested", {"max_depth": MAX_DEPTH})
    try:
        raw_value = json.loads(raw.decode("utf-8"))  # never json's UTF-16/32 guessing
    except (ValueError, RecursionError) as exc:
        raise InvalidMessage("invalid JSON", {"json": _short(exc)}) from None
    if not isinstance(raw_value, dict):
        raise InvalidMessage("not a JSON object", {"body": type(raw_value).__name__})
    type_, version = raw_value.pop("type", None), raw_value.pop("version", None)
    if not isinstance(type_, str) or not isinstance(version, int) or isinstance(version, bool):
        raise InvalidMessage(
            "missing type or version", {"type": repr(type_)[:50], "version": repr(version)[:50]}
        )
    schema = _schema(type_, version)
    try:
        values = schema.load(raw_value)
    except ValidationError as exc:
        raise InvalidMessage("schema errors", {"fields": exc.messages}) from None
    return Message(type_, version, values)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def _schema(type_: str, version: int) -> Schema:
    if not any(t == type_ for t, _ in SCHEMAS):
        raise InvalidMessage("unknown type", {"type": type_[:50]})
    schema = SCHEMAS.get((type_, version))
    if schema is None:
        known = sorted(v for t, v in SCHEMAS if t == type_)
        raise InvalidMessage("unknown version", {"version": version, "known": known})
    return schema
