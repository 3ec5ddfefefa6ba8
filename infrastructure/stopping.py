"""Why a long-running process stopped, in one log line.

`stopping(name)` is the one place where a long-running command (`worker`,
`relay`, `projections run`, `reconcile`, `run`, `web`, `fake-gateway`) takes
SIGTERM and SIGINT: each sets the event it yields, and the first one received
is noted. When the block ends it logs on `provisioner.process`, at INFO (shown
without `-v`), `NAME stopped (SIGTERM)`, `(SIGINT)` or `(ended)` when it
returned by itself; at ERROR `NAME stopped (error, exit N)` (or `(error:
TypeName)`) when an exception ends it, whose message the command line prints
next, as its one error line.

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


def reason_of(exc: BaseException) -> str | None:
    """What an exception that ends the process comes to, or None for a clean exit.
    Not its message: the command line prints that as its last line, once."""
    code = exc.code if isinstance(exc, SystemExit) else getattr(exc, "exit_code", None)
    if isinstance(exc, SystemExit) and code in (None, 0):
        return None
    return f"error, exit {code}" if isinstance(code, int) else f"error: {type(exc).__name__}"


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
    reason: str | None = None
    try:
        yield event
    except BaseException as exc:
        reason = reason_of(exc)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        why = received[0] if received else reason or "ended"
        log.log(logging.ERROR if why.startswith("error") else logging.INFO, "%s stopped (%s)",
                name, why)  # fmt: skip
