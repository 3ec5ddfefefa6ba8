"""Delays for `memory://`, which has no TTL: `DelayScheduler`, a thread that
publishes each message when it is due."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Any, Protocol

from infrastructure.broker.messages import Message


class Publisher(Protocol):
    def publish(self, message: Message, *, headers: dict[str, Any] | None = None) -> Any: ...

    def close(self) -> None: ...


class DelayScheduler:
    """Holds delayed messages in memory and publishes each when due (memory:// only)."""

    def __init__(self, broker: Publisher) -> None:
        self._heap: list[tuple[float, int, Message, dict[str, Any] | None]] = []
        self._seq = itertools.count()
        self._wake = threading.Condition()
        self._stopped = False
        self._broker = broker  # one made with no scheduler: it publishes at once
        self._thread = threading.Thread(target=self._run, name="delay-scheduler", daemon=True)
        self._thread.start()

    def schedule(
        self, message: Message, delay_s: float, headers: dict[str, Any] | None = None
    ) -> None:
        with self._wake:
            due = time.monotonic() + delay_s
            heapq.heappush(self._heap, (due, next(self._seq), message, headers))
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(5)
        self._broker.close()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._wake.wait(timeout)
                if self._stopped:
                    return
                _, _, message, headers = heapq.heappop(self._heap)
            self._broker.publish(message, headers=headers)
