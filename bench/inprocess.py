"""Drive attempts hop by hop inside one process, as the broker-fed worker will.

N hops run at once on a thread pool (HTTP waits overlap); a heap holds the
hops scheduled for later, keyed by their due time, and releases each when it
is due. A hop that raises (database unreachable, too much contention) is
retried later like an unacknowledged message, never recorded as a failure.

Used by the engine benchmark (bench/engine.py) and an integration test
(tests/integration/test_invariants.py); the RabbitMQ worker drives the same
`ProvisioningService.run_hop`. Not part of the product: it lives with its users.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from uuid import UUID

from domain.outcomes import HopOutcome, Outcome
from infrastructure.service import ProvisioningService

log = logging.getLogger("provisioner.inprocess")


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    attempt_id: UUID = field(compare=False)
    hop: int = field(compare=False)
    tries: int = field(compare=False, default=0)


@dataclass
class RunReport:
    outcomes: list[HopOutcome] = field(default_factory=list)
    finals: dict[UUID, HopOutcome] = field(default_factory=dict)
    errors: int = 0

    @property
    def hops(self) -> int:
        return len(self.outcomes)


class InProcessEngine:
    """Runs hops concurrently and follows their schedules until nothing is due.

    `time_scale` multiplies every backoff delay (the demo compresses 155 s of
    backoff into a few seconds); `retry_s` is the wait before a hop that raised
    runs again, up to `max_tries` times.
    """

    def __init__(
        self,
        service: ProvisioningService,
        *,
        concurrency: int = 8,
        time_scale: float = 1.0,
        retry_s: float = 0.5,
        max_tries: int = 5,
        on_outcome: Callable[[HopOutcome], None] | None = None,
    ) -> None:
        self.service = service
        self.concurrency = concurrency
        self.time_scale = time_scale
        self.retry_s = retry_s
        self.max_tries = max_tries
        self.on_outcome = on_outcome
        self._due: list[_Due] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def submit(self, attempt_id: UUID, hop: int = 0, delay_s: float = 0.0) -> None:
        with self._lock:
            heapq.heappush(
                self._due, _Due(time.monotonic() + delay_s, next(self._seq), attempt_id, hop)
            )

    def run(self, timeout_s: float | None = None) -> RunReport:
        """Run until no hop is due or in flight (or the timeout passes)."""
        report = RunReport()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        in_flight: dict[Future[HopOutcome], _Due] = {}
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="hop") as pool:
            while True:
                self._start_due(pool, in_flight)
                if not in_flight and not self._due:
                    return report
                if deadline is not None and time.monotonic() > deadline:
                    log.warning("in-process run timed out with %d hops pending", len(self._due))
                    return report
                done, _ = wait(
                    in_flight, timeout=self._wait_s(len(in_flight)), return_when=FIRST_COMPLETED
                )
                for future in done:
                    self._finish(future, in_flight.pop(future), report)

    def _start_due(
        self, pool: ThreadPoolExecutor, in_flight: dict[Future[HopOutcome], _Due]
    ) -> None:
        now = time.monotonic()
        with self._lock:
            while self._due and self._due[0].at <= now and len(in_flight) < self.concurrency:
                due = heapq.heappop(self._due)
                in_flight[pool.submit(self.service.run_hop, due.attempt_id, due.hop)] = due

    def _wait_s(self, running: int) -> float | None:
        """How long to wait for a hop to finish before looking at the schedule again."""
        if running >= self.concurrency:
            return None  # nothing can start until a hop finishes
        with self._lock:
            if not self._due:
                return 0.5
            return max(0.0, min(0.5, self._due[0].at - time.monotonic()))

    def _finish(self, future: Future[HopOutcome], due: _Due, report: RunReport) -> None:
        try:
            outcome = future.result()
        except Exception as exc:
            report.errors += 1
            if due.tries + 1 >= self.max_tries:
                log.exception("hop gave up attempt=%s hop=%d", due.attempt_id, due.hop)
                return
            log.warning("hop raised, retrying attempt=%s hop=%d: %s", due.attempt_id, due.hop, exc)
            with self._lock:
                heapq.heappush(
                    self._due,
                    _Due(
                        time.monotonic() + self.retry_s,
                        next(self._seq),
                        due.attempt_id,
                        due.hop,
                        due.tries + 1,
                    ),
                )
            return
        report.outcomes.append(outcome)
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        if (
            outcome.outcome in (Outcome.SCHEDULED, Outcome.DEFERRED)
            and outcome.next_hop is not None
        ):
            self.submit(
                outcome.attempt_id, outcome.next_hop, (outcome.delay_s or 0) * self.time_scale
            )
        elif outcome.outcome is not Outcome.DUPLICATE:
            report.finals[outcome.attempt_id] = outcome
