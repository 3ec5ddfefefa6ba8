"""Reading a family listing as it arrives (docs/gateway.md, decision 032).

A family listing is a bare JSON array of ``{"id", "title", "status"}``, the
parent included, and grows with every brand of that parent. It is parsed one
entry at a time as its chunks arrive: each entry is decoded, compared on its
title and dropped unless it is wanted, so what a read holds is one network
chunk, one entry and the wanted entries, however long the listing. What bounds
a listing is its size in bytes, `FAMILY_ANSWER_MAX` (64 MiB: 100,000 members
of up to 670 bytes each), not a count of its entries.

Only the JSON structure is checked here; the wanted entries' fields are checked
and scrubbed by `AnswerReader.family` (infrastructure/gateway/answers.py), as
every other answer's. A listing that breaks the structure raises `Unreadable`.
"""

from __future__ import annotations

import codecs
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from infrastructure.gateway.answers import Unreadable

log = logging.getLogger(__name__)

FAMILY_ANSWER_MAX = 64 * 1024 * 1024  # bytes of one listing: 100,000 members of 670 bytes
ENTRY_MAX = 64 * 1024  # characters an unfinished entry may hold (an id is at most 128)
BATCH_TRIES = 3  # cuts tried for a chunk's entries in one call, from its last "}" back
NEAR_SHARE = 0.8  # a listing past this share of its bound is warned about
WARN_EVERY_S = 3600.0  # per parent, while it stays near

_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class Listing:
    """What a family listing held: its wanted entries (undecoded beyond JSON), its
    number of entries and its size in bytes."""

    wanted: list[dict[str, Any]]
    entries: int
    size: int


OVER = (
    "a family listing larger than {limit} bytes, the bound of one listing: this parent "
    "has too many children to be read (decision 032)"
)


def read_family(chunks: Iterable[bytes], title: str | Collection[str] | None) -> Listing:
    """Parse a listing from its body's chunks (already bounded: `capped_chunks` with
    `OVER`), keeping the entries of `title`, or of any of several titles (all of them
    when None). Refused (`Unreadable`) outside the shape."""
    decode = codecs.getincrementaldecoder("utf-8-sig")("strict").decode
    titles = None if title is None else frozenset((title,) if isinstance(title, str) else title)
    parser = _Parser(titles)
    size = 0
    try:
        for chunk in chunks:
            size += len(chunk)
            parser.feed(decode(chunk))
        parser.feed(decode(b"", final=True))
    except UnicodeDecodeError:
        raise Unreadable("the family listing is not UTF-8") from None
    parser.end()
    return Listing(parser.wanted, parser.entries, size)


class _Parser:
    """An incremental parser of one JSON array of objects."""

    def __init__(self, titles: frozenset[str] | None) -> None:
        self.titles = titles
        self.wanted: list[dict[str, Any]] = []
        self.entries = 0
        self._text = ""
        self._state = "start"  # start, first, entry, after, done
        self._retry_at = 0  # characters pending before an unfinished entry is tried again

    def feed(self, text: str) -> None:
        self._text += text
        pos = 0
        text = self._text
        batches = True  # until one fails: then one entry at a time to the end of the text
        while True:
            pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # always matches
            if pos == len(text):
                break
            char = text[pos]
            state = self._state
            if state == "start":
                if char != "[":
                    raise Unreadable("expected a bare JSON array")
                self._state, pos = "first", pos + 1
            elif state == "done":
                raise Unreadable("data after the JSON array")
            elif state == "after":
                if char not in ",]":
                    raise Unreadable("expected ',' or ']' between entries")
                self._state, pos = ("entry" if char == "," else "done"), pos + 1
            elif state == "first" and char == "]":
                self._state, pos = "done", pos + 1
            else:
                end = self._entries(text, pos) if batches else -1
                if end < 0:
                    batches = False
                    end = self._entry(text, pos)
                if end < 0:
                    break
                self._state, pos = "after", end
        self._text = text[pos:]

    def _entries(self, text: str, pos: int) -> int:
        """Decode the whole entries from `pos` on in one call: where they end, or -1 when
        they do not decode so (then one at a time). They run to one of the text's last
        few "}": cut inside a string or an entry (a title holding "}"), the text cannot
        decode, so a batch that does is exactly what one at a time would have given."""
        cut = len(text)
        for _ in range(BATCH_TRIES):
            cut = text.rfind("}", pos, cut)
            if cut < 0:
                return -1
            try:
                batch = json.loads(f"[{text[pos : cut + 1]}]")
            except (ValueError, RecursionError):
                continue
            for entry in batch:
                self._keep(entry)
            return cut + 1
        return -1

    def _keep(self, entry: object) -> None:
        if not isinstance(entry, dict):
            raise Unreadable("expected an array of objects")
        self.entries += 1
        title = entry.get("title")
        if self.titles is None or (isinstance(title, str) and title in self.titles):
            self.wanted.append(entry)  # a listing of K entries keeps only the wanted ones

    def _entry(self, text: str, pos: int) -> int:
        """Decode the entry at `pos`: where it ends, or -1 until more text is in."""
        if text[pos] != "{":
            raise Unreadable("expected an array of objects")
        pending = len(text) - pos
        if pending < self._retry_at:
            return -1
        try:
            entry, end = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            if pending > ENTRY_MAX:
                raise Unreadable(
                    f"an entry not JSON, or not whole in {ENTRY_MAX} characters"
                ) from None
            # Unfinished, or broken: tried again once twice as much is in (or at the end),
            # so that a long entry costs a few tries, not one a chunk.
            self._retry_at = 2 * pending
            return -1
        except (ValueError, RecursionError):  # an int past Python's digits, too deep
            raise Unreadable("an entry too deep or with a number too long") from None
        self._retry_at = 0
        self._keep(entry)
        return end

    def end(self) -> None:
        if self._state != "done" and self._text.strip():
            self._retry_at = 0
            self.feed("")  # the last entry's final try
        if self._state == "start":
            raise Unreadable("expected a bare JSON array")
        if self._state != "done":
            raise Unreadable("an entry that is not JSON, or a listing cut before its end")


class FamilyWatch:
    """Says when a parent's listing nears its bound: a warning line (at most once an
    hour per parent) and `on_share(share)`, the largest share of the bound among each
    parent's last listing read by this process (1 for one refused past it; a gauge in
    worker/health/metrics.py)."""

    def __init__(
        self,
        limit: int,
        on_share: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = limit
        self._on_share = on_share
        self._clock = clock
        self._lock = threading.Lock()
        self._shares: dict[str, float] = {}
        self._warned: dict[str, float] = {}

    def refused(self, parent_id: str) -> None:
        """The parent's listing was refused past the bound: its share counts as 1."""
        with self._lock:
            self._shares[parent_id] = 1.0
            largest = max(self._shares.values())
        if self._on_share is not None:
            self._on_share(largest)

    def seen(self, parent_id: str, listing: Listing) -> None:
        share = listing.size / self._limit
        with self._lock:
            self._shares[parent_id] = share
            largest = max(self._shares.values())
            now = self._clock()
            warn = share >= NEAR_SHARE and now - self._warned.get(parent_id, -WARN_EVERY_S) >= (
                WARN_EVERY_S
            )
            if warn:
                self._warned[parent_id] = now
        if warn:
            log.warning(
                "the family of parent %s nears its listing's bound: %d entries, %d bytes, "
                "%.0f%% of %d; past it every hop and audit of this parent fails (decision 032)",
                parent_id,
                listing.entries,
                listing.size,
                100 * share,
                self._limit,
            )
        if self._on_share is not None:
            self._on_share(largest)
