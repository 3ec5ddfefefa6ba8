"""Why a message was dead-lettered, in one vocabulary, and which letter an id names.

`Reason` is every reason a dead letter can carry: the worker writes its value
in `x-dead-reason`, `provisioner_dead_letters_total{reason}` counts by it, and
`dead-letters list` and `purge --reason` speak it. `reason_of` maps any label
to it: a value, a label older dead letters were written with ("schema
errors", `UnknownAttempt`), the name of a refusal a handler raises, or
RabbitMQ's own `x-death` reason; any other is `other`, so every dead letter
stays readable.

`match_id` resolves an id or a unique prefix of one against the letters'
ids (pure: no broker).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from enum import StrEnum


class Reason(StrEnum):
    # The worker cannot read it (on first sight: reading is deterministic).
    TOO_LARGE = "too_large"
    TOO_DEEPLY_NESTED = "too_deeply_nested"
    NOT_UTF8 = "not_utf8"
    UNSUPPORTED_CONTENT_TYPE = "unsupported_content_type"
    UNSUPPORTED_ENCODING = "unsupported_encoding"
    UNDECODABLE = "undecodable"
    BAD_HEADER = "bad_header"
    INVALID_JSON = "invalid_json"
    NOT_A_JSON_OBJECT = "not_a_json_object"
    MISSING_TYPE_OR_VERSION = "missing_type_or_version"
    UNKNOWN_TYPE = "unknown_type"
    UNKNOWN_VERSION = "unknown_version"
    SCHEMA_ERROR = "schema_error"
    WRONG_QUEUE = "wrong_queue"
    # A handler refuses it for good.
    UNKNOWN_ATTEMPT = "unknown_attempt"
    UNKNOWN_BRAND = "unknown_brand"
    INVALID_REQUEST = "invalid_request"
    FOREIGN_PARENT = "foreign_parent"
    FOREIGN_PRODUCER = "foreign_producer"
    FUTURE_COMMAND = "future_command"
    BRAND_DEACTIVATED = "brand_deactivated"
    COMMAND_REFUSED = "command_refused"
    # Its schedule of retries is spent, or settling it failed unforeseen.
    RETRIES_EXHAUSTED = "retries_exhausted"
    INTERNAL_ERROR = "internal_error"
    # RabbitMQ dead-lettered it itself (`x-death`).
    REJECTED = "rejected"
    EXPIRED = "expired"
    MAXLEN = "maxlen"
    DELIVERY_LIMIT = "delivery_limit"
    # A label none of the above: the letter keeps it as it was written.
    OTHER = "other"


# Labels that do not read as a value once snake-cased (older letters, refusals).
_LABELS = {
    "schema errors": Reason.SCHEMA_ERROR,
    "not UTF-8": Reason.NOT_UTF8,
    "not a byte string": Reason.UNDECODABLE,
    "unhandled type": Reason.UNKNOWN_TYPE,
    "unknown queue": Reason.WRONG_QUEUE,
    "unexpected type on the hops queue": Reason.WRONG_QUEUE,
    "internal message on the commands queue": Reason.WRONG_QUEUE,
    "unexpected error": Reason.INTERNAL_ERROR,
    "NotOurs": Reason.COMMAND_REFUSED,  # ownership refused an emptying
}
_VALUES = {reason.value: reason for reason in Reason}
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[\s\-]+")


def reason_of(label: object) -> Reason:
    """The reason a label means: a value as it is, an older or irregular label by
    the table, a phrase ("retries exhausted") or an exception's name
    (`UnknownAttempt`) snake-cased; `other` for any other."""
    text = label.value if isinstance(label, Reason) else str(label).strip()
    if text in _VALUES:
        return _VALUES[text]
    if text in _LABELS:
        return _LABELS[text]
    snake = _SEPARATORS.sub("_", _CAMEL.sub("_", text)).lower()
    return _VALUES.get(snake, Reason.OTHER)


def counts_by_reason(reasons: Iterable[str]) -> list[tuple[str, int]]:
    """How many letters there are of each reason, the most first (then by name)."""
    return sorted(Counter(reasons).items(), key=lambda item: (-item[1], item[0]))


class NoSuchId(LookupError):
    """No letter has this id, nor an id it starts."""


class AmbiguousId(LookupError):
    """More than one letter's id starts with this prefix."""

    def __init__(self, prefix: str, matches: list[str]) -> None:
        shown = ", ".join(matches[:10]) + (
            f" and {len(matches) - 10} more" if len(matches) > 10 else ""
        )
        super().__init__(
            f"dead letter id {prefix!r} is ambiguous: it starts {len(matches)} ids ({shown}); "
            "give more of it"
        )
        self.matches = matches


def match_id(wanted: str, ids: Iterable[str]) -> str:
    """The id `wanted` names: itself when a letter has it, else the one id it is a
    prefix of. NoSuchId when none, AmbiguousId (naming them) when several."""
    if not wanted:
        raise NoSuchId("an empty dead letter id names none")
    matches: list[str] = []
    for letter_id in ids:
        if letter_id == wanted:
            return letter_id
        if letter_id.startswith(wanted) and letter_id not in matches:
            matches.append(letter_id)
    if not matches:
        raise NoSuchId(f"no dead letter {wanted}")
    if len(matches) > 1:
        raise AmbiguousId(wanted, matches)
    return matches[0]
