"""A rollout file's brands, as pure functions (no I/O): CSV with a header row
(brand_id,title,parent) or JSON lines, each line checked as the worker checks a
`provision` message. `provisioner rollout` (worker/cli/rollout.py) reads it."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from infrastructure.broker.messages import InvalidMessage, encode

COLUMNS = ("brand_id", "title", "parent")
# The bytes of a rollout file read, a line at a time (docs/configuration.md): about
# 150,000 brands of 110-byte lines. Past it the rest is not read; the lines before count.
ROLLOUT_MAX_BYTES = 16 * 1024 * 1024
# Any aware time serves to check a line against the message schema.
_SOME_TIME = datetime(2030, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Line:
    """One good line of a rollout file: a brand to provision."""

    number: int
    brand_id: str
    title: str
    parent: str


@dataclass(frozen=True, slots=True)
class BadLine:
    number: int
    error: str


@dataclass
class RolloutInput:
    """What a rollout file holds: its format (`csv`, `jsonl`, or `empty`), the good
    lines in file order, and the bad ones with what is wrong, by line number."""

    format: str
    lines: list[Line] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)


def parse_rollout(
    data: bytes | str,
    parents: Collection[str] | None = None,
    *,
    unread_from: int | None = None,
    limit: int = ROLLOUT_MAX_BYTES,
) -> RolloutInput:
    """The brands of a rollout file (no I/O). The format is told by the first
    non-blank line: `{` starts JSON lines, anything else is a CSV header row.

    Blank lines are skipped; values are trimmed. A line is bad (and the others
    still count) when a field is missing or empty, its JSON is invalid, a value
    is not text, holds a control character, or is refused by the `provision`
    message schema (1 to 200 characters), or its brand_id is on another line too:
    then every line of that brand_id is bad, since which one is meant is unclear.
    A CSV file whose header does not name exactly brand_id, title and parent has
    no good line (the header's line is the bad one). Given `parents` (the
    configured PROVISIONER_PARENT_IDS), a line under any other parent is bad too:
    the workers would refuse it. Given `unread_from` (the first line past the
    file's bound of `limit` bytes, left unread), that line is bad too.
    """
    found = _parse(data, parents)
    if unread_from is not None:
        found.bad.append(
            BadLine(
                unread_from,
                f"the file is larger than {limit} bytes (ROLLOUT_MAX_BYTES): this line and "
                "those after it were not read; split the file",
            )
        )
    return found


def _parse(data: bytes | str, parents: Collection[str] | None) -> RolloutInput:
    text = _text(data)
    first = next(
        ((n, line.strip()) for n, line in enumerate(text.split("\n"), 1) if line.strip()), None
    )
    if first is None:
        return RolloutInput("empty")
    number, head = first
    if head.startswith("["):
        return RolloutInput(
            "jsonl", bad=[BadLine(number, "a JSON array: give one JSON object per line")]
        )
    parsed = _without_duplicates(_jsonl(text) if head.startswith("{") else _csv(text))
    return parsed if parents is None else _under(parsed, parents)


def _under(found: RolloutInput, parents: Collection[str]) -> RolloutInput:
    """The lines under a parent of `parents`; the others bad, by number."""
    good = [line for line in found.lines if line.parent in parents]
    foreign = [
        BadLine(line.number, f"parent {line.parent!r} is not one of PROVISIONER_PARENT_IDS")
        for line in found.lines
        if line.parent not in parents
    ]
    bad = sorted([*found.bad, *foreign], key=lambda b: b.number)
    return RolloutInput(found.format, good, bad)


def _text(data: bytes | str) -> str:
    if isinstance(data, bytes):
        # Bytes that are not UTF-8 become lone surrogates: the line holding one is bad.
        data = data.decode("utf-8", "surrogateescape")
    return data.removeprefix("\ufeff")


def checked_line(number: int, values: dict[str, Any]) -> Line | BadLine:
    """A line from its named values, checked as the worker would check its message."""
    missing = [c for c in COLUMNS if c not in values]
    if missing:
        return BadLine(number, f"missing {_names(missing)}")
    checked: dict[str, str] = {}
    for column in COLUMNS:
        value = values[column]
        if not isinstance(value, str):
            return BadLine(number, f"{column} must be text, not {_json_kind(value)}")
        value = value.strip()
        if not value:
            return BadLine(number, f"{column} is empty")
        if any(ord(c) < 32 or c == "\x7f" for c in value):
            return BadLine(number, f"{column} holds a control character")
        if any("\ud800" <= c <= "\udfff" for c in value):
            return BadLine(number, f"{column} is not valid UTF-8")
        checked[column] = value
    try:
        encode(
            "provision",
            1,
            brand_id=checked["brand_id"],
            title=checked["title"],
            parent_workspace_id=checked["parent"],
            requested_at=_SOME_TIME,
        )
    except InvalidMessage as exc:
        return BadLine(number, _schema_errors(exc.errors))
    return Line(number, checked["brand_id"], checked["title"], checked["parent"])


def _schema_errors(errors: dict[str, Any]) -> str:
    fields = errors.get("fields") or {}
    parts = []
    for name, problems in sorted(fields.items()):
        column = "parent" if name == "parent_workspace_id" else name
        said = "; ".join(str(p) for p in problems) if isinstance(problems, list) else problems
        parts.append(f"{column}: {said}")
    return "refused by the message schema: " + ("; ".join(parts) or "invalid")


def _names(names: Sequence[str]) -> str:
    return ", ".join(names)


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "an array" if isinstance(value, list) else "an object"


def _jsonl(text: str) -> RolloutInput:
    found = RolloutInput("jsonl")
    for number, raw in enumerate(text.split("\n"), 1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            found.bad.append(BadLine(number, f"invalid JSON ({str(exc)[:80]})"))
            continue
        if not isinstance(value, dict):
            found.bad.append(BadLine(number, f"not a JSON object but {_json_kind(value)}"))
            continue
        unknown = sorted(k for k in value if k not in COLUMNS)
        if unknown:
            found.bad.append(
                BadLine(number, f"unknown key(s) {_names(unknown)}; the keys are {_names(COLUMNS)}")
            )
            continue
        _add(found, checked_line(number, value))
    return found


def _csv(text: str) -> RolloutInput:
    found = RolloutInput("csv")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    done = 0  # physical lines the reader has consumed so far
    while True:
        number = done + 1  # where the next record starts
        try:
            record = next(reader)
        except StopIteration:
            return found
        except csv.Error as exc:
            said = str(exc)
            if "unexpected end of data" in said:  # what an unclosed quote swallowed
                said = "a quote opened on this line is never closed"
            found.bad.append(BadLine(number, f"unreadable CSV: {said}"))
            if header is None:
                return found
            done = max(reader.line_num, number)
            continue
        done = reader.line_num
        if not any(cell.strip() for cell in record):
            continue  # a blank line
        if header is None:
            header = [cell.strip().lower() for cell in record]
            problem = _header_problem(header)
            if problem:
                found.bad.append(BadLine(number, problem))
                return found
            continue
        if len(record) != len(header):
            found.bad.append(
                BadLine(number, f"{len(record)} fields where the header has {len(header)}")
            )
            continue
        _add(found, checked_line(number, dict(zip(header, record, strict=True))))


def _header_problem(header: list[str]) -> str | None:
    wanted = _names(COLUMNS)
    if sorted(header) == sorted(COLUMNS):
        return None
    if not set(COLUMNS) & set(header):
        return f"no header row: the first line must name the columns {wanted}"
    missing = [c for c in COLUMNS if c not in header]
    unknown = sorted({c for c in header if c not in COLUMNS})
    twice = sorted({c for c in header if header.count(c) > 1})
    said = [
        f"missing {_names(missing)}" if missing else "",
        f"unknown {_names(unknown)}" if unknown else "",
        f"{_names(twice)} twice" if twice else "",
    ]
    return f"the header must name the columns {wanted} ({'; '.join(s for s in said if s)})"


def _add(found: RolloutInput, line: Line | BadLine) -> None:
    if isinstance(line, Line):
        found.lines.append(line)
    else:
        found.bad.append(line)


def _without_duplicates(found: RolloutInput) -> RolloutInput:
    numbers: dict[str, list[int]] = {}
    for line in found.lines:
        numbers.setdefault(line.brand_id, []).append(line.number)
    twice = {brand for brand, at in numbers.items() if len(at) > 1}
    if not twice:
        return found
    for line in found.lines:
        if line.brand_id in twice:
            others = ", ".join(str(n) for n in numbers[line.brand_id] if n != line.number)
            found.bad.append(
                BadLine(line.number, f"brand_id {line.brand_id!r} is on line(s) {others} too")
            )
    found.lines = [line for line in found.lines if line.brand_id not in twice]
    found.bad.sort(key=lambda bad: bad.number)
    return found
