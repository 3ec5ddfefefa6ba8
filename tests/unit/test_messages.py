from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest

from infrastructure.broker import messages
from infrastructure.broker.messages import InvalidMessage, decode


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


def test_every_decoded_message_has_typed_fields() -> None:
    attempt_id = uuid4()
    at = datetime(2026, 1, 2, tzinfo=UTC)
    for message, body in (
        (messages.hop(attempt_id, 3), messages.Hop(attempt_id, 3)),
        (messages.release(attempt_id), messages.Release(attempt_id)),
        (messages.decommission("b1"), messages.Decommission("b1")),
        (messages.provision("b1", "Acme", "p"), messages.Provision("b1", "Acme", "p")),
        (messages.provision("b1", "Acme", "p", at), messages.Provision("b1", "Acme", "p", at)),
        (messages.deactivate("b1", at), messages.Deactivate("b1", at)),
    ):
        assert messages.body(decode(message.encode())) == body


def test_fields_without_a_typed_form_are_refused() -> None:
    with pytest.raises(InvalidMessage, match="unknown type"):
        messages.body(messages.Message("explode", 1, {}))
    with pytest.raises(InvalidMessage, match="schema errors"):
        messages.body(messages.Message("release", 1, {"attempt_id": uuid4(), "extra": 1}))


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
            + b"563bd461-a35d-452a-87a3-d641acae80a4"
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


@pytest.mark.parametrize("value", ["abc", True, -1, 10**12, 1.5, None])
def test_a_bad_waited_header_is_refused(value: object) -> None:
    with pytest.raises(InvalidMessage) as caught:
        messages.waited_ms({"x-waited-ms": value})
    assert caught.value.reason == "bad header"


def test_the_waited_header_is_read_in_milliseconds() -> None:
    assert messages.waited_ms({}) == messages.waited_ms(None) == 0
    assert messages.waited_ms({"x-waited-ms": 3_600_000}) == 3_600_000


# The nesting scan (`_depth`) runs on the consuming thread before JSON parsing:
# it must stay linear whatever the body (a backtracking pattern for whole JSON
# strings rescanned from every quote of an unterminated string: ~9 s for 64 KiB).
_QUOTE_THEN_ESCAPED_QUOTES = (b'"' + b'\\"' * messages.MAX_BODY_BYTES)[: messages.MAX_BODY_BYTES]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (_QUOTE_THEN_ESCAPED_QUOTES, "invalid JSON"),
        (b'"' * messages.MAX_BODY_BYTES, "invalid JSON"),
        (b'"\\' * (messages.MAX_BODY_BYTES // 2), "invalid JSON"),
        (b'{"a": "' + b"\\\\" * 30_000 + b"[" * 20, "invalid JSON"),
        (b'["' + b'\\"' * 30_000 + b'"' + b"[" * 20, "too deeply nested"),
        (b'{"a": "\\\\"' + b"[" * 20, "too deeply nested"),  # the string ends after \\
        (b"\\" * 1000 + b"[" * 20, "too deeply nested"),  # a backslash outside a string
    ],
    ids=[
        "quote-escaped-quotes",
        "quotes",
        "quote-backslash",
        "escaped-backslashes",
        "escaped-quotes-then-nesting",
        "string-ends-after-backslashes",
        "bare-backslashes",
    ],
)
def test_adversarial_strings_are_refused_with_the_right_reason(body: bytes, reason: str) -> None:
    with pytest.raises(InvalidMessage) as caught:
        decode(body)
    assert caught.value.reason == reason


def test_escaped_quotes_and_brackets_inside_strings_decode() -> None:
    title = 'a \\" [[[[[[[[[[ \\\\ "{{{{{{{{{{ \\'
    message = messages.provision("b1", title, "p")
    assert decode(message.encode()) == message


def test_the_nesting_scan_looks_at_each_special_byte_once(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    pattern = messages._SPECIAL

    class Counting:
        def finditer(self, raw: bytes) -> Iterator[re.Match[bytes]]:
            for match in pattern.finditer(raw):
                seen.append(match.start())
                yield match

    monkeypatch.setattr(messages, "_SPECIAL", Counting())
    with pytest.raises(InvalidMessage):
        decode(_QUOTE_THEN_ESCAPED_QUOTES)
    assert len(seen) == len(set(seen)) <= len(_QUOTE_THEN_ESCAPED_QUOTES)


def _backtracking_depth(raw: bytes) -> int:
    """The former scan (a regex over whole JSON strings): the oracle on ordinary bodies."""
    tokens = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
    depth = deepest = 0
    for token in tokens.finditer(raw):
        char = token.group()
        if char in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif char in (b"]", b"}"):
            depth -= 1
    return deepest


def _json_value(rng: random.Random, depth: int) -> object:
    alphabet = 'ab[]{}"\\/ \u00e9\n\t,:'
    kind = rng.randrange(6 if depth < 11 else 3)
    if kind == 0:
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
    if kind == 1:
        return rng.choice([0, -1.5, True, None, 10**20])
    if kind == 2:
        return rng.choice(["", "\\", '"', "]]]", "{{"])
    if kind in (3, 4):
        return [_json_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(5))): _json_value(rng, depth + 1)
        for _ in range(rng.randrange(4))
    }


def test_the_nesting_depth_is_the_former_scans_on_ordinary_bodies() -> None:
    rng = random.Random(9)
    for _ in range(2000):
        value = _json_value(rng, 0)
        raw = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
        cap = messages.MAX_DEPTH + 1  # the scan stops as soon as it is too deep
        assert min(messages._depth(raw), cap) == min(_backtracking_depth(raw), cap), raw


# ------------------------------------------------ which queue accepts which types


def test_every_type_is_a_command_or_internal_never_both() -> None:
    types = {t for t, _ in messages.SCHEMAS}
    assert types == messages.COMMAND_TYPES | messages.INTERNAL_TYPES
    assert not messages.COMMAND_TYPES & messages.INTERNAL_TYPES


def test_the_commands_queue_accepts_commands_alone_the_hops_queue_every_type() -> None:
    """The hops queue takes commands too: a retried command comes back through it."""
    rules = messages.QUEUE_RULES
    assert rules[messages.COMMANDS_QUEUE].accepts == {"provision", "deactivate"}
    assert rules[messages.HOPS_QUEUE].accepts == {t for t, _ in messages.SCHEMAS}


def test_the_rules_cover_exactly_the_queues_the_worker_consumes() -> None:
    from infrastructure.broker.topology import Topology

    topology = Topology()
    assert {topology.hops.name, topology.commands.name} == set(messages.QUEUE_RULES)


# Fixed ids: they name parametrized tests, which every test process must collect alike.
INTERNAL = [
    messages.hop(UUID("563bd461-a35d-452a-87a3-d641acae80a4"), 1),
    messages.release(UUID("c96c363e-b161-443c-b38b-15e32fafc152")),
    messages.decommission("b1"),
]
COMMANDS = [messages.provision("b1", "Acme", "parent"), messages.deactivate("b1")]


@pytest.mark.parametrize("message", INTERNAL, ids=lambda m: m.type)
def test_an_internal_message_is_refused_on_the_commands_queue(message: messages.Message) -> None:
    with pytest.raises(InvalidMessage) as caught:
        messages.admit(messages.COMMANDS_QUEUE, message)
    assert caught.value.reason == "internal message on the commands queue"
    assert caught.value.errors == {
        "type": message.type,
        "queue": messages.COMMANDS_QUEUE,
        "accepts": ["deactivate", "provision"],
    }
    assert messages.admit(messages.HOPS_QUEUE, message) is message


@pytest.mark.parametrize("message", COMMANDS, ids=lambda m: m.type)
def test_a_command_is_accepted_on_either_queue(message: messages.Message) -> None:
    for queue in (messages.COMMANDS_QUEUE, messages.HOPS_QUEUE):
        assert messages.admit(queue, message) is message


def test_a_queue_without_a_rule_accepts_nothing() -> None:
    with pytest.raises(InvalidMessage) as caught:
        messages.admit("provisioning.other", COMMANDS[0])
    assert caught.value.reason == "unknown queue"
