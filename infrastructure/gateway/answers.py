"""Reading the workspace gateway's answers for `HttpGateway` (infrastructure/gateway/adapter.py).

Answers are bounded: the body is read a chunk at a time and refused once past
its cap, so an oversize answer is never held whole. A compressed body is
refused unread (httpx would inflate each network chunk whole: a gzip bomb).
Every id taken from an answer must match ``domain.ids.GATEWAY_ID``. Every text
taken from the wire is scrubbed of the token: error texts and statuses have it
replaced, an id carrying it is refused as `MalformedAnswer` (an id is stored and
called back, so it cannot be altered). Rejection texts are whitespace-collapsed
and truncated to 200 characters.
"""

from __future__ import annotations

import json as jsonlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from domain.ids import GATEWAY_ID, is_gateway_id
from domain.ports import FamilyMember, MalformedAnswer
from domain.waits import believed_retry_after

SUMMARY_MAX = 200


class Unreadable(Exception):
    """An answer refused while it was read: over its cap, or compressed."""


class TooLarge(Unreadable):
    """An answer refused at the first byte past its cap."""


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer, body read (never compressed: see `read_capped`)."""

    status_code: int
    content: bytes
    retry_after: str = ""
    encoding: str = "utf-8"
    date: str = ""  # the Date header: what an HTTP-date Retry-After is counted from
    parsed: Any = None  # what a reader made of a 2xx body as it arrived (then `content` is b"")

    def json(self) -> Any:
        """The body as JSON; ValueError for anything else (not UTF-8, nested too deeply)."""
        try:
            return jsonlib.loads(self.content)
        except RecursionError:
            raise ValueError("nested too deeply") from None

    def body_text(self) -> str:
        try:
            return self.content.decode(self.encoding, "replace")
        except LookupError:  # a charset Python does not know
            return self.content.decode("utf-8", "replace")


class AnswerReader:
    """The fields of answers, checked and scrubbed of `token`."""

    def __init__(self, token: str) -> None:
        self._token = token

    def scrub(self, text: str) -> str:
        return text.replace(self._token, "[redacted]")

    def json(self, response: Answer, op: str) -> Any:
        try:
            return response.json()
        except ValueError:  # JSONDecodeError, UnicodeDecodeError, nested too deeply
            pass
        raise MalformedAnswer(f"{op}: the answer is not JSON (HTTP {response.status_code})")

    def error_text(self, response: Answer) -> str:
        """The gateway's own words about a rejection, safe to log and store."""
        text = response.body_text()
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict):
            for key in ("error", "message", "detail"):
                if isinstance(body.get(key), str):
                    text = body[key]
                    break
        summary = self.scrub(" ".join(text.split()))
        return summary[:SUMMARY_MAX] or "(no detail)"

    def field(self, value: object, op: str, field: str) -> str:
        """A string field of an answer, safe to store and log.

        A status or title that carries the token is scrubbed of it (it is only
        read and recorded). An id that carries it is refused: an id is called
        back and bound, so it cannot be altered, and it must not be stored. A
        non-empty id must match `GATEWAY_ID` (it is not quoted in the error:
        it may be long or hold terminal escapes).
        """
        text = _text(value, op, field)
        if field == "id" and text and not is_gateway_id(text):
            raise MalformedAnswer(
                f"{op}: an id of {len(text)} characters not matching {GATEWAY_ID.pattern}"
            )
        if self._token not in text:
            return text
        if field == "id":
            raise MalformedAnswer(f"{op}: an id carries our credentials; answer refused")
        return self.scrub(text)

    def family(self, entries: list[dict[str, Any]], op: str) -> list[FamilyMember]:
        """The members of a family listing's wanted entries (infrastructure/gateway/family.py
        decoded them and left the others out); an entry without an id is skipped."""
        members: list[FamilyMember] = []
        for entry in entries:
            member_id = self.field(entry.get("id"), op, "id")
            if not member_id:
                continue
            members.append(
                FamilyMember(
                    id=member_id,
                    title=self.field(entry.get("title"), op, "title"),
                    status=self.field(entry.get("status"), op, "status"),
                )
            )
        return members

    def project_ids(self, body: Any, op: str) -> list[str]:
        """The ids of a project listing; an item without one is malformed."""
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise MalformedAnswer(f"{op}: expected an object with an 'items' array")
        ids: list[str] = []
        for item in items:
            project_id = self.field(item.get("id"), op, "id") if isinstance(item, dict) else ""
            if not project_id:
                # Never under-report projects: release and adoption rely on the count.
                raise MalformedAnswer(f"{op}: an item without an id")
            ids.append(project_id)
        return ids


def _text(value: object, op: str, field: str) -> str:
    """A string field of an answer: missing/null -> "", numbers as text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise MalformedAnswer(f"{op}: field {field!r} is not a string")


def retry_after(response: Answer, now: datetime | None = None) -> float:
    """Retry-After in seconds, as far as it is believed (`domain.waits.believed_retry_after`:
    0 when absent, unreadable or past, at most an hour). An HTTP date counts from the
    answer's own Date (the gateway's clock), else from `now`."""
    try:
        seconds = float(response.retry_after)
    except ValueError:
        at = _http_date(response.retry_after)
        if at is None:
            return 0.0
        since = _http_date(response.date) or now or datetime.now(UTC)
        seconds = (at - since).total_seconds()
    return believed_retry_after(seconds)


def _http_date(text: str) -> datetime | None:
    try:
        at = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def read_capped(response: httpx.Response, limit: int) -> bytes:
    """The body, whole, refused once past `limit` bytes (see `capped_chunks`)."""
    return b"".join(capped_chunks(response, limit))


def capped_chunks(
    response: httpx.Response, limit: int, over: str = "an answer larger than {limit} bytes"
) -> Iterator[bytes]:
    """The body, a network chunk (at most 64 KiB) at a time, refused (`over`) once past
    `limit` bytes. A compressed body is refused unread: we ask for identity, and httpx inflates
    a chunk whole before any cap sees it (a gzip bomb). An answer that can have no body
    (204, 304, `Content-Length: 0`) passes whatever its coding."""
    codings = [
        coding
        for coding in response.headers.get_list("Content-Encoding", split_commas=True)
        if coding.strip().lower() not in ("", "identity")
    ]
    empty = response.status_code in (204, 304) or response.headers.get("Content-Length") == "0"
    if codings and not empty:
        raise Unreadable("a compressed answer (Content-Encoding), though identity was asked")
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > limit:
            raise TooLarge(over.format(limit=limit))
        yield chunk
