"""Why a long-running process stopped, in one log line.

`stopping(name)` is the one place where a long-running command (`worker`,
`relay`, `projections run`, `reconcile`, `run`, `web`, `fake-gateway`) takes
SIGTERM and SIGINT: each sets the event it yields, and the first one received
is noted. When the block ends it logs, at INFO on `provisioner.process` (shown
without `-v`), `NAME stopped (SIGTERM)`, `(SIGINT)`, or `(ended)` when it
returned by itself. An exception that ends it logs nothing here: the command
line turns it into the process's one error line (`Error: relay stopped: ...`),
which says why.

A server that takes the signals over meanwhile (uvicorn) gives them back when
it stops and raises the one it caught again: the handler here notes it then.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

log = logging.getLogger("provisioner.process")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _clean(exc: BaseException) -> bool:
    return isinstance(exc, SystemExit) and exc.code in (None, 0)


@contextmanager
def stopping(name: str, stop: threading.Event | None = None) -> Iterator[threading.Event]:
    """SIGTERM and SIGINT set the event yielded; one line says why the block ended."""
    event = stop or threading.Event()
    received: list[str] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)
        event.set()

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, on_signal) for sig in SIGNALS}
    if not log.isEnabledFor(logging.INFO):
        log.setLevel(logging.INFO)
    failed = False
    try:
        yield event
    except BaseException as exc:
        failed = not _clean(exc)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if received or not failed:
            log.info("%s stopped (%s)", name, received[0] if received else "ended")
