from __future__ import annotations

import json
from uuid import uuid4

import pytest

from infrastructure import messages
from infrastructure.messages import InvalidMessage, decode


def test_every_message_round_trips_through_json() -> None:
    attempt_id = uuid4()
    for message in (
        messages.hop(attempt_id, 3),
        messages.release(attempt_id),
        messages.decommission("b1"),
        messages.provision("b1", "Acme", "parent"),
        messages.deactivate("b1"),
    ):
        body = message.encode()
        assert json.loads(body)["type"] == message.type
        assert decode(body) == message


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x80not json", "not UTF-8"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"hop": 1}', "missing type or version"),
        (b'{"type": "explode", "version": 1}', "unknown type"),
        (b'{"type": "hop", "version": 9, "attempt_id": "x", "hop": 1}', "unknown version"),
        (b'{"type": "hop", "version": 1, "attempt_id": "nope", "hop": -1}', "schema errors"),
        (
            b'{"type": "hop", "version": 1, "attempt_id": "'
            + str(uuid4()).encode()
            + b'", "hop": "1"}',
            "schema errors",
        ),
        (b'{"type": "provision", "version": 1, "brand_id": "b", "title": ""}', "schema errors"),
        (
            b'{"type": "hop", "version": true, "attempt_id": "x", "hop": 1}',
            "missing type or version",
        ),
    ],
)
def test_bad_bodies_are_refused_with_a_reason_and_details(body: bytes, reason: str) -> None:
    with pytest.raises(InvalidMessage) as caught:
        decode(body)
    assert caught.value.reason == reason
    assert caught.value.errors


def test_schema_errors_name_the_fields() -> None:
    with pytest.raises(InvalidMessage) as caught:
        decode(b'{"type": "hop", "version": 1, "attempt_id": "nope", "hop": -1}')
    assert set(caught.value.errors["fields"]) == {"attempt_id", "hop"}


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(InvalidMessage):
        decode(b'{"type": "deactivate", "version": 1, "brand_id": "b", "extra": 1}')
