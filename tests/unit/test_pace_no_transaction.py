"""A call waiting for its turn at the fleet's rate waits with no pace update open:
the store's update (PostgreSQL: a transaction holding the pace row FOR UPDATE)
has returned before the call sleeps, so one waiting call never holds up the
fleet's other calls, nor a database connection."""

from __future__ import annotations

import threading
import time
from typing import Any

from infrastructure.gateway.pacing import MemoryPaceStore, Pace
from tests.support import pace_rules


class WatchedStore(MemoryPaceStore):
    """The in-memory store, saying whether an update is running now."""

    def __init__(self) -> None:
        super().__init__()
        self.updating = threading.Event()

    def update(self, fn: Any) -> Any:
        self.updating.set()
        try:
            return super().update(fn)
        finally:
            self.updating.clear()


def test_a_call_that_must_wait_about_a_second_waits_outside_any_update() -> None:
    store = WatchedStore()
    during: list[tuple[bool, bool]] = []
    others: list[threading.Thread] = []

    def sleep(seconds: float) -> None:
        """Sleep; first see whether an update is open, and whether another
        thread's update gets the store meanwhile (not if this one held it)."""
        other = threading.Thread(target=store.update, args=(lambda s, now: (s, None),))
        others.append(other)
        other.start()
        other.join(0.5)
        during.append((store.updating.is_set(), not other.is_alive()))
        time.sleep(seconds)

    pace = Pace(store, pace_rules(rate=1.0, burst=1, max_wait_s=2.0), sleep=sleep)
    assert pace.before() is None  # the first call goes at once

    started = time.monotonic()
    assert pace.before() is None  # the second: its turn is a second later
    waited = time.monotonic() - started
    for other in others:
        other.join(5.0)

    assert 0.9 <= waited < 2.0  # it did wait its turn
    assert during == [(False, True)]  # once, no update open, the store free to others
