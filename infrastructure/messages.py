"""The messages on the broker: JSON only, each with `type` and `version`, validated
by marshmallow schemas. Never pickle.

| type           | version | fields                                       | queue                 |
|----------------|---------|----------------------------------------------|-----------------------|
| `hop`          | 1       | attempt_id (UUID), hop (int >= 0)            | provisioning.hops     |
| `release`      | 1       | attempt_id (UUID)                            | provisioning.hops     |
| `decommission` | 1       | brand_id                                     | provisioning.hops     |
| `provision`    | 1       | brand_id, title, parent_workspace_id,        | provisioning.commands |
|                |         | requested_at?                                |                       |
| `deactivate`   | 1       | brand_id, requested_at?                      | provisioning.commands |

`requested_at` (optional): the producer's time of the command, ISO 8601 with an
offset; without it the worker orders the command at the time it handles it.

`decode` turns a raw body into a `Message` or raises `InvalidMessage` whose
`errors` say what is wrong (they travel with the dead letter).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from marshmallow import Schema, ValidationError, fields, validate

TEXT = validate.Length(min=1, max=200)


class HopSchema(Schema):
    attempt_id = fields.UUID(required=True)
    hop = fields.Integer(required=True, strict=True, validate=validate.Range(min=0, max=1000))


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
COMMAND_TYPES = frozenset({"provision", "deactivate"})


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


def decode(body: bytes | str) -> Message:
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidMessage("invalid JSON", {"json": str(exc)[:200]}) from None
    if not isinstance(raw, dict):
        raise InvalidMessage("not a JSON object", {"body": type(raw).__name__})
    type_, version = raw.pop("type", None), raw.pop("version", None)
    if not isinstance(type_, str) or not isinstance(version, int) or isinstance(version, bool):
        raise InvalidMessage(
            "missing type or version", {"type": repr(type_)[:50], "version": repr(version)[:50]}
        )
    schema = _schema(type_, version)
    try:
        values = schema.load(raw)
    except ValidationError as exc:
        raise InvalidMessage("schema errors", {"fields": exc.messages}) from None
    return Message(type_, version, values)


def _schema(type_: str, version: int) -> Schema:
    if not any(t == type_ for t, _ in SCHEMAS):
        raise InvalidMessage("unknown type", {"type": type_[:50]})
    schema = SCHEMAS.get((type_, version))
    if schema is None:
        known = sorted(v for t, v in SCHEMAS if t == type_)
        raise InvalidMessage("unknown version", {"version": version, "known": known})
    return schema
