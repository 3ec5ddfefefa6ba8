"""Tracked projections: pure row logic over domain events, the ports it needs, and
the two procedures every projection shares: `catch_up` (follow the log) and
`rebuild` (a fresh copy beside the live one, then an atomic switch).

A projection never talks to a database. It says which rows a batch of events
needs (`prefetch`), then changes those rows in a `RowCache` (`apply`). The
storage port (`ViewStore`, implemented in `infrastructure.views.store`) runs each
batch in ONE transaction that writes the changed rows and moves the copy's
tracked position forward with a compare-and-set: a batch applied twice is
impossible, a crashed batch leaves nothing behind, and a second runner on the
same copy fails its compare-and-set and rolls back.

Positions are notification ids of the event store's log. Each copy of a
projection (`brand_workspaces_g1`, `brand_workspaces_g2`, ...) has its own
position, so a copy being rebuilt and the live copy never share one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

Row = dict[str, Any]

# Column kinds; the storage adapter maps them onto each database's types.
TEXT, INT, TS, LIST = "text", "int", "ts", "list"


@dataclass(frozen=True)
class Index:
    suffix: str
    columns: tuple[str, ...]
    unique: bool = False
    where: str | None = None  # a partial index's condition, in portable SQL


class PositionConflict(RuntimeError):
    """Another runner moved this copy's position first; this batch was rolled back."""


class Projection(Protocol):
    name: str
    key: str
    columns: ClassVar[dict[str, str]]
    indexes: tuple[Index, ...]
    topics: tuple[str, ...]

    def prefetch(self, events: Sequence[Any], rows: RowCache) -> dict[str, set[str]]:
        """Column -> values: the stored rows a batch of events may change."""
        ...

    def apply(self, event: Any, rows: RowCache) -> None:
        """Change the rows this event changes. Pure: no I/O, no clock."""
        ...


class RowCache:
    """The rows one batch works on: loaded once, changed in memory, written once.

    `index` names one more column to look rows up by (a brand's current attempt).
    """

    def __init__(self, key: str, index: str | None = None) -> None:
        self.key = key
        self.index = index
        self._rows: dict[str, Row] = {}
        self._by_index: dict[Any, str] = {}
        self._dirty: dict[str, None] = {}  # insertion-ordered set
        self._keys: dict[Any, str] = {}

    def key_of(self, event: Any) -> str:
        """The event's originator id as text (converted once per aggregate and batch)."""
        originator = event.originator_id
        key = self._keys.get(originator)
        if key is None:
            key = self._keys[originator] = str(originator)
        return key

    def add(self, rows: Sequence[Row]) -> None:
        for row in rows:
            self._rows.setdefault(row[self.key], row)
            if self.index and row.get(self.index) is not None:
                self._by_index[row[self.index]] = row[self.key]

    def get(self, key: str) -> Row | None:
        return self._rows.get(key)

    def by_index(self, value: Any) -> Row | None:
        key = self._by_index.get(value)
        row = self._rows.get(key) if key is not None else None
        if row is None or self.index is None or row.get(self.index) != value:
            return None
        return row

    def put(self, row: Row) -> None:
        self._rows[row[self.key]] = row
        if self.index and row.get(self.index) is not None:
            self._by_index[row[self.index]] = row[self.key]
        self._dirty[row[self.key]] = None

    def changed(self) -> list[Row]:
        return [self._rows[key] for key in self._dirty]


class EventSource(Protocol):
    """The event store's notification log, decoded."""

    def read(self, after: int, limit: int, topics: Sequence[str]) -> list[tuple[int, Any]]:
        """(notification id, domain event) pairs after `after`, oldest first."""
        ...

    def head(self) -> int:
        """The newest notification id (0 when the log is empty)."""
        ...

    def count(self, after: int, topics: Sequence[str]) -> int:
        """How many notifications of these topics follow `after`."""
        ...


class Batch(Protocol):
    """One transaction on one copy: load rows, write rows, move the position."""

    copy: str
    position: int

    def load(self, column: str, values: set[str]) -> list[Row]: ...

    def write(self, rows: list[Row]) -> None: ...

    def advance(self, to: int) -> None:
        """Record the new position (compare-and-set on the one read at the start)."""
        ...


class ViewStore(Protocol):
    def position(self, projection: Projection, copy: str | None = None) -> tuple[str, int]:
        """(copy, position) of the live copy, or of `copy`; takes no lock."""
        ...

    def live_batch(self, projection: Projection) -> AbstractContextManager[Batch]:
        """A transaction on the live copy; holds off a switch until it ends."""
        ...

    def copy_batch(self, projection: Projection, copy: str) -> AbstractContextManager[Batch]: ...

    def begin_rebuild(self, projection: Projection) -> str:
        """The copy being built (a fresh one, or the one an interrupted rebuild left)."""
        ...

    def switch(self, projection: Projection, copy: str) -> AbstractContextManager[Batch]:
        """A transaction that locks out the live runner; on success it makes `copy`
        the live copy, points readers at it and drops the old one."""
        ...


def apply_notes(projection: Projection, notes: list[tuple[int, Any]], batch: Batch) -> None:
    """Apply decoded notifications to the batch's rows and move its position past them."""
    events = [event for _, event in notes]
    rows = RowCache(projection.key, getattr(projection, "index", None))
    for column, values in projection.prefetch(events, rows).items():
        if values:
            rows.add(batch.load(column, values))
    for event in events:
        projection.apply(event, rows)
    batch.write(rows.changed())
    batch.advance(notes[-1][0])


def run_batch(projection: Projection, source: EventSource, batch: Batch, limit: int) -> int:
    """Read and apply, both inside the batch's transaction (the switch needs that)."""
    notes = source.read(batch.position, limit, projection.topics)
    if notes:
        apply_notes(projection, notes, batch)
    return len(notes)


def step(
    projection: Projection,
    source: EventSource,
    store: ViewStore,
    *,
    copy: str | None = None,
    limit: int = 2000,
) -> int:
    """Read the next events outside any transaction, then apply them in one.

    Reading first keeps the write transaction (on SQLite, the database's one
    write lock) as short as the writes. Returns how many events were applied,
    0 when there were none, -1 when the copy moved meanwhile (another runner, a
    switch): read again.
    """
    seen = store.position(projection, copy)
    notes = source.read(seen[1], limit, projection.topics)
    if not notes:
        return 0
    batch_of = store.live_batch(projection) if copy is None else store.copy_batch(projection, copy)
    with batch_of as batch:
        if (batch.copy, batch.position) != seen:
            return -1
        apply_notes(projection, notes, batch)
    return len(notes)


def catch_up(
    projection: Projection, source: EventSource, store: ViewStore, *, limit: int = 2000
) -> int:
    """Apply everything after the live copy's position; return how many events."""
    total = 0
    while done := step(projection, source, store, limit=limit):
        total += max(done, 0)
    return total


class ReadAhead:
    """An EventSource that reads the next batch while the current one is applied.

    The database works on the next read (and the decoding thread on its events)
    while this thread applies and writes: a rebuild reads the log in order, so
    the next request is always the one prefetched.
    """

    def __init__(self, source: EventSource) -> None:
        self.source = source
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="read-ahead")
        self._next: tuple[tuple[int, int, tuple[str, ...]], Future[Any]] | None = None

    def read(self, after: int, limit: int, topics: Sequence[str]) -> list[tuple[int, Any]]:
        key = (after, limit, tuple(topics))
        if self._next is not None and self._next[0] == key:
            notes: list[tuple[int, Any]] = self._next[1].result()
        else:
            notes = self.source.read(after, limit, topics)
        self._next = None
        if len(notes) == limit:
            ahead = (notes[-1][0], limit, tuple(topics))
            self._next = (ahead, self._pool.submit(self.source.read, *ahead))
        return notes

    def head(self) -> int:
        return self.source.head()

    def count(self, after: int, topics: Sequence[str]) -> int:
        return self.source.count(after, topics)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class RebuildProgress:
    copy: str
    done: int
    total: int


def rebuild(
    projection: Projection,
    source: EventSource,
    store: ViewStore,
    *,
    limit: int = 5000,
    on_progress: Callable[[RebuildProgress], None] = lambda _: None,
) -> str:
    """Build a fresh copy from the whole log while the live copy serves, then switch.

    Interrupted, it leaves the copy and its position behind; run again, it
    resumes from there. The final catch-up runs inside the switch transaction,
    which the live runner's batches exclude, so no event is lost or doubled at
    the switch. Returns the name of the new live copy.
    """
    copy = store.begin_rebuild(projection)
    _, position = store.position(projection, copy)
    total = source.count(0, projection.topics)
    progress = RebuildProgress(copy, total - source.count(position, projection.topics), total)
    on_progress(progress)
    ahead = ReadAhead(source)
    try:
        while done := step(projection, ahead, store, copy=copy, limit=limit):
            progress.done += max(done, 0)
            progress.total = max(progress.total, progress.done)
            on_progress(progress)
    finally:
        ahead.close()
    with store.switch(projection, copy) as batch:
        while done := run_batch(projection, source, batch, limit):
            progress.done += done
    progress.total = progress.done
    on_progress(progress)
    return copy
