"""The `EventSource` port over the event store's notification log."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from infrastructure.store.eventstore import ProvisionerApplication

if TYPE_CHECKING:
    from infrastructure.views.store import SqlViewStore


class LogSource:
    """The `EventSource` port over the event store's notification log."""

    def __init__(self, app: ProvisionerApplication, store: SqlViewStore | None = None) -> None:
        self.app = app
        self.store = store

    def read(self, after: int, limit: int, topics: Sequence[str]) -> list[tuple[int, Any]]:
        notes = self.app.recorder.select_notifications(start=after + 1, limit=limit, topics=topics)
        to_event = self.app.mapper.to_domain_event
        return [(note.id, to_event(note)) for note in notes]

    def head(self) -> int:
        return self.app.recorder.max_notification_id() or 0

    def count(self, after: int, topics: Sequence[str]) -> int:
        if self.store is not None:
            table = self.app.recorder.events_table_name  # type: ignore[attr-defined]
            return self.store.count_events(table, after, topics)
        total, start = 0, after + 1
        while notes := self.app.recorder.select_notifications(start, 10_000, topics=topics):
            total += len(notes)
            start = notes[-1].id + 1
        return total
