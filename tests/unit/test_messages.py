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


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"[" * 100_000, "too large"),
        (b"[" * 1000 + b"]" * 1000, "too deeply nested"),
        (b'{"type": "hop", "x": ' + b"[" * 500 + b"]" * 500 + b"}", "too deeply nested"),
        (b"{" * 30_000, "too deeply nested"),
        (b"x" * (messages.MAX_BODY_BYTES + 1), "too large"),
        ("é" * (messages.MAX_BODY_BYTES // 2 + 1), "too large"),
        (b'{"type": "deactivate", "version": 1, "brand_id": "\xe9"}', "not UTF-8"),
        ("\udcff", "not UTF-8"),
        (b"\x00{\x00}", "invalid JSON"),  # never guessed to be UTF-16
        (object(), "not a byte string"),
    ],
)
def test_hostile_bodies_are_refused_with_a_reason_never_an_error(body: object, reason: str) -> None:
    with pytest.raises(InvalidMessage) as caught:
        decode(body)
    assert caught.value.reason == reason
    assert caught.value.errors


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    message = messages.provision("b1", "[[[[[[[[[[[[{{{{{{{{{{", "parent")
    assert decode(message.encode()) == message


@pytest.mark.parametrize(
    ("content_type", "content_encoding", "reason"),
    [
        ("application/x-python-serialize", "binary", "unsupported content type"),
        ("application/json", "latin-1", "unsupported encoding"),
        ("application/json", "binary", "unsupported encoding"),
        (b"application/json", None, "unsupported content type"),
    ],
)
def test_only_json_in_utf8_is_accepted(
    content_type: object, content_encoding: object, reason: str
) -> None:
    body = messages.deactivate("b1").encode()
    assert decode(body, content_type="application/json", content_encoding="UTF-8")
    with pytest.raises(InvalidMessage) as caught:
        decode(body, content_type=content_type, content_encoding=content_encoding)
    assert caught.value.reason == reason


@pytest.mark.parametrize("value", ["abc", "1", True, -1, 10**6, 1.0, None, [1], b"1"])
def test_a_bad_retry_header_is_refused(value: object) -> None:
    with pytest.raises(InvalidMessage) as caught:
        messages.retries({"x-retries": value})
    assert caught.value.reason == "bad header"


def test_the_retry_header_is_read() -> None:
    assert messages.retries({}) == messages.retries(None) == 0
    assert messages.retries({"x-retries": 3, "x-death": [{"count": 1}]}) == 3
