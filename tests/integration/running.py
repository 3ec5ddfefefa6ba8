"""The whole service in the test's process, on the settings it is given: worker,
relay, projections and a reconciler that sweeps often; and a wait until it drained."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from infrastructure.service import ProvisioningService
from infrastructure.settings.model import Settings
from worker.runtime import build


@contextmanager
def running(settings: Settings, *, resend_s: float = 300.0) -> Iterator[ProvisioningService]:
    """Every part of the service in this process (worker, relay, projections and a
    reconciler that sweeps often), stopped on exit."""
    stop = threading.Event()
    with build(settings, concurrency=2, stop=stop) as runtime:
        reconciler, publisher = runtime.reconciler(overdue_s=1.0, grace_s=0.0, interval_s=0.5)
        reconciler.resend_s = resend_s  # how soon it sends the same message again
        runtime.start(runtime.worker(2).run, "worker", stop)
        relay = runtime.relay()
        runtime.start(relay.run, "relay", stop)
        runtime.start(runtime.projector().run, "projections", stop)
        runtime.start(lambda s: reconciler.run(s, publisher), "reconciler", stop)
        try:
            yield runtime.service
        finally:
            stop.set()
            for thread in runtime.threads:
                thread.join(30)
            publisher.close()
            relay.broker.close()
        assert not runtime.failures, runtime.failures


def drained(service: ProvisioningService, active: list[str], timeout_s: float = 20.0) -> None:
    """Until every active brand is bound and its current attempt ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        brands = [service.brand(b) for b in active]
        attempts = [service.attempt(b.current_attempt_id) for b in brands if b.current_attempt_id]
        if all(b.workspace_id for b in brands) and all(a.is_terminal for a in attempts):
            return
        time.sleep(0.1)
    raise AssertionError("the restored service did not drain in time")
