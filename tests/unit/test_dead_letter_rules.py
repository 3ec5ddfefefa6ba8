"""Dead letters' pure parts: one vocabulary of reasons (domain/dead_letter_rules.py),
an id or a unique prefix of one, counts by reason, and what a dead letter keeps of
its message to be replayed as it came (infrastructure/broker/dead_letter_parsing.py)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from domain.dead_letter_rules import (
    AmbiguousId,
    NoSuchId,
    Reason,
    counts_by_reason,
    match_id,
    reason_of,
)
from infrastructure.broker.dead_letter_parsing import kept_of, parse
from infrastructure.broker.messages import QUEUE_RULES
from worker.handlers import REFUSED

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("label", "reason"),
    [
        # Labels dead letters were written with before there was one vocabulary.
        ("schema errors", Reason.SCHEMA_ERROR),
        ("too large", Reason.TOO_LARGE),
        ("not UTF-8", Reason.NOT_UTF8),
        ("invalid JSON", Reason.INVALID_JSON),
        ("not a JSON object", Reason.NOT_A_JSON_OBJECT),
        ("unsupported content type", Reason.UNSUPPORTED_CONTENT_TYPE),
        ("retries exhausted", Reason.RETRIES_EXHAUSTED),
        ("unexpected error", Reason.INTERNAL_ERROR),
        ("internal message on the commands queue", Reason.WRONG_QUEUE),
        ("unhandled type", Reason.UNKNOWN_TYPE),
        # A refusal's name, as a handler raised it.
        ("UnknownAttempt", Reason.UNKNOWN_ATTEMPT),
        ("ForeignParent", Reason.FOREIGN_PARENT),
        ("FutureCommand", Reason.FUTURE_COMMAND),
        ("CommandRefused", Reason.COMMAND_REFUSED),
        # RabbitMQ's own, in x-death.
        ("rejected", Reason.REJECTED),
        ("delivery_limit", Reason.DELIVERY_LIMIT),
        # Today's values, as they are.
        ("schema_error", Reason.SCHEMA_ERROR),
        (Reason.FOREIGN_PARENT, Reason.FOREIGN_PARENT),
        # Anything else.
        ("Something Nobody Wrote", Reason.OTHER),
        ("", Reason.OTHER),
    ],
)
def test_a_label_reads_as_one_reason(label: str, reason: Reason) -> None:
    assert reason_of(label) is reason


def _invalid_message_labels() -> set[str]:
    """Every literal reason infrastructure/ and worker/ raise InvalidMessage with."""
    labels: set[str] = set()
    for path in [*(ROOT / "infrastructure").rglob("*.py"), *(ROOT / "worker").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) in {"InvalidMessage", "DeadLetter"}
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                labels.add(str(node.args[0].value))
    return labels


def test_every_label_the_worker_dead_letters_with_is_a_reason() -> None:
    labels = _invalid_message_labels()
    assert {"schema errors", "too large", "unhandled type"} <= labels  # the walk finds them
    labels |= {rule.refusal for rule in QUEUE_RULES.values()}
    labels |= {refusal.__name__ for refusal in REFUSED}
    labels |= {cls.__name__ for refusal in REFUSED for cls in refusal.__subclasses__()}
    assert {label: reason_of(label) for label in labels if reason_of(label) is Reason.OTHER} == {}


def test_every_reason_is_snake_case_and_in_the_docs_table() -> None:
    docs = (ROOT / "docs" / "messaging.md").read_text()
    table = docs.split("| `x-dead-reason` | what |", 1)[1].split("\n\n", 1)[0]
    cells = [line.split("|")[1] for line in table.splitlines() if "|" in line]
    rows = {name for cell in cells for name in re.findall(r"`(\w+)`", cell)}
    for reason in Reason:
        assert re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*", reason.value)
        assert reason.value in rows, f"{reason.value} is not in docs/messaging.md's table"


def test_counts_are_by_reason_the_most_first() -> None:
    reasons = ["schema_error", "rejected", "schema_error", "unknown_attempt", "rejected",
               "schema_error"]  # fmt: skip
    assert counts_by_reason(reasons) == [("schema_error", 3), ("rejected", 2),
                                         ("unknown_attempt", 1)]  # fmt: skip
    assert counts_by_reason([]) == []


IDS = ["4f1c2a9e0b7d4c11", "4f1c88aa00bb11cc", "9e0d5b7c1a2f3e44", "h0a1b2c3d4e5f607"]


def test_an_id_or_a_unique_prefix_names_one_letter() -> None:
    assert match_id("9e0d5b7c1a2f3e44", IDS) == "9e0d5b7c1a2f3e44"
    assert match_id("9e", IDS) == "9e0d5b7c1a2f3e44"
    assert match_id("4f1c2", IDS) == "4f1c2a9e0b7d4c11"
    assert match_id("h0", IDS) == "h0a1b2c3d4e5f607"
    assert match_id("ab", ["ab", "abc"]) == "ab"  # a whole id wins over a longer one
    assert match_id("ab", ["abc", "abc"]) == "abc"  # one id held by two letters


def test_an_ambiguous_prefix_is_refused_naming_the_matches() -> None:
    with pytest.raises(AmbiguousId) as refused:
        match_id("4f1c", IDS)
    assert refused.value.matches == ["4f1c2a9e0b7d4c11", "4f1c88aa00bb11cc"]
    assert "4f1c2a9e0b7d4c11, 4f1c88aa00bb11cc" in str(refused.value)
    assert "ambiguous" in str(refused.value)


@pytest.mark.parametrize("wanted", ["", "5", "4f1c2a9e0b7d4c11x"])
def test_an_id_no_letter_has_is_not_found(wanted: str) -> None:
    with pytest.raises(NoSuchId):
        match_id(wanted, IDS)


def worker_headers(reason: str, **more: object) -> dict[str, object]:
    return {"x-dead-reason": reason, "x-dead-source": "work", "x-dead-id": "abc123",
            "x-dead-errors": json.dumps({"fields": {}}), **more}  # fmt: skip


def test_an_older_dead_letter_reads_with_todays_reason_and_keeps_its_label() -> None:
    old = parse(b"{}", worker_headers("schema errors"))
    assert (old.reason, old.stored_reason) == ("schema_error", "schema errors")
    assert old.summary(0.0)["stored_reason"] == "schema errors"
    # Written before the worker kept the content type: it was JSON it could not read.
    assert (old.content_type, old.content_encoding) == ("application/json", "utf-8")

    new = parse(b"{}", worker_headers("schema_error"))
    assert (new.reason, new.stored_reason) == ("schema_error", "")
    assert "stored_reason" not in new.summary(0.0)

    queued = parse(b"{}", {"x-death": [{"reason": "rejected", "queue": "provisioning.hops"}]},
                   content_type="text/plain", content_encoding=None)  # fmt: skip
    assert (queued.reason, queued.content_type, queued.content_encoding) == (
        "rejected", "text/plain", None
    )  # fmt: skip


def test_a_dead_letter_keeps_its_messages_content_type_encoding_and_id() -> None:
    kept = kept_of({"x-retries": 1}, "text/plain", None)
    assert kept == {"x-dead-content-type": "text/plain", "x-dead-content-encoding": ""}
    letter = parse(b"hello", worker_headers("invalid_json", **kept))
    assert (letter.content_type, letter.content_encoding) == ("text/plain", None)

    # A replay sends the id back; dead-lettered again, the message keeps it.
    assert letter.replay_headers == {"x-dead-id": "abc123"}
    again = kept_of(letter.replay_headers, "text/plain", None)
    assert again["x-dead-id"] == "abc123"
    # ... and so does one the queue dead-letters itself, which keeps every header,
    # when the service published it (the replay): no one else's id is believed.
    again_headers = {**letter.replay_headers, "x-death": [{"reason": "rejected"}]}
    queued = parse(b"hello", again_headers, user_id="svc", service="svc")
    assert queued.id == "abc123"
    assert parse(b"hello", again_headers, user_id="orders", service="svc").id.startswith("h")


@pytest.mark.parametrize("given", ["", "a b", "x" * 65, "\x1b[31m", None])
def test_an_id_a_message_carries_is_kept_only_when_short_and_plain(given: object) -> None:
    assert "x-dead-id" not in kept_of({"x-dead-id": given}, None, None)
    queued = parse(b"{}", {"x-dead-id": given, "x-death": [{"reason": "rejected"}]})
    assert queued.id.startswith("h")  # the hash of what it holds
    assert "x-dead-id" not in kept_of("not a table", None, None)
