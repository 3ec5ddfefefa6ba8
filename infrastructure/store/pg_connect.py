"""PostgreSQL connections: every failure classified in one place, connecting retried.

`classify` turns whatever a connection or a query raised (psycopg's errors,
or the event-sourcing library's, which keep psycopg's as their cause) into one
of the edge failures of `infrastructure.failures`:

| what the server or the network said                 | failure              |
|-----------------------------------------------------|----------------------|
| authentication failed, unknown role (28P01, 28000)  | ServiceRefused       |
| the database does not exist (3D000)                 | ServiceRefused       |
| permission denied (42501), TLS refused or unverified | ServiceRefused       |
| too many clients (53300), starting up (57P03)       | ServiceUnavailable   |
| connection refused, timed out, host not resolved    | ServiceUnavailable   |

`connect` opens one connection and retries what is unavailable with capped
exponential backoff (jittered, so a crowd of clients does not retry in step)
until its wait is spent; what is refused is raised at once. A long-running
process waits without end (`wait_s=None`, until its `stop`): a database that is
full or unreachable at start-up is a wait, never an exit. It says so once at
WARNING (`database at postgresql://... full (too many clients); waiting ...`,
credentials redacted), again every `REMIND_S` while it lasts, and at INFO once
a connection came.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from infrastructure.failures import (
    EdgeFailure,
    ReconnectPauses,
    ServiceRefused,
    ServiceUnavailable,
    causes,
)

log = logging.getLogger("provisioner.connect")

FULL = "full (too many clients)"
# What a waiting process advises, where it differs from a one-shot command's "retry later".
_WAIT_TODO = {
    FULL: "raise max_connections, or hold fewer: docs/configuration.md, "
    '"Database connections", counts them per process',
}

# (pattern in the server's or libpq's message, sqlstate, refused for good?, what to do,
#  what the database is while we wait for it: the wait's log line says it)
_KNOWN: tuple[tuple[str, str, bool, str, str], ...] = (
    (
        "password authentication failed",
        "28P01",
        True,
        "check the user and password in PROVISIONER_DATABASE_URL",
        "",
    ),
    (
        r"role .* does not exist|no pg_hba\.conf entry|authentication",
        "28000",
        True,
        "check the user in PROVISIONER_DATABASE_URL and the server's pg_hba.conf",
        "",
    ),
    (
        r"database .* does not exist",
        "3D000",
        True,
        "create the database, or correct its name in PROVISIONER_DATABASE_URL",
        "",
    ),
    ("permission denied", "42501", True, "grant the database user the privileges it needs", ""),
    (
        r"does not support SSL|certificate|sslmode|sslrootcert|sslcert|sslkey",
        "",
        True,
        "check the sslmode/sslrootcert options of PROVISIONER_DATABASE_URL and the server's TLS",
        "",
    ),
    (
        r"too many clients|remaining connection slots",
        "53300",
        False,
        "retry later, or raise max_connections (see docs/configuration.md)",
        FULL,
    ),
    (
        r"starting up|shutting down|in recovery",
        "57P03",
        False,
        "retry when the server is up",
        "not accepting connections (starting up or shutting down)",
    ),
)
_UNKNOWN_TODO = "check that the server is running and reachable"
# A long-running process waiting for the database says so again this often (seconds).
REMIND_S = 60.0


def _reason(message: str) -> str:
    """The useful part of libpq's message: the server's FATAL text, or the last cause."""
    text = " ".join(message.split())
    if "FATAL:" in text:
        return text.split("FATAL:", 1)[1].strip()
    return re.sub(r"^connection failed: ", "", text).split(" Is the server running")[0]


def _diagnosis(cause: psycopg.Error) -> tuple[bool, str, str, str] | None:
    """(refused for good?, the server's reason, what to do, what the database is) for
    a driver's error that is an edge failure; None for a query's own error."""
    if not isinstance(cause, (psycopg.OperationalError, psycopg.InterfaceError)) and (
        cause.sqlstate != "42501"
    ):
        return None  # a query's own error (a bug or a conflict), not an edge failure
    message = str(cause)
    reason = _reason(message)
    for pattern, sqlstate, refused, todo, state in _KNOWN:
        if (sqlstate and cause.sqlstate == sqlstate) or re.search(pattern, message):
            return refused, reason, todo, state or f"unavailable ({reason})"
    return False, reason, _UNKNOWN_TODO, f"unavailable ({reason})"


def classify(exc: BaseException, where: str) -> EdgeFailure | None:
    """The edge failure `exc` means for the database `where` (redacted), or None."""
    for cause in causes(exc):
        if isinstance(cause, EdgeFailure):
            return cause
        if not isinstance(cause, psycopg.Error):
            continue
        found = _diagnosis(cause)
        if found is None:
            return None
        refused, reason, todo, _state = found
        kind = ServiceRefused if refused else ServiceUnavailable
        verb = "refused us" if refused else "is unavailable"
        return kind(f"PostgreSQL at {where} {verb}: {reason}: {todo}")
    return None


def waiting_line(exc: BaseException, where: str, *, waited: str = "") -> str:
    """What a process waiting for the database `where` (redacted) logs about `exc`:
    what the database is (full, starting up, unavailable and why), and what to do;
    `waited`: how long the wait has lasted, for the reminders."""
    state, todo = f"unavailable ({one_line(exc)})", _UNKNOWN_TODO
    for cause in causes(exc):
        if isinstance(cause, psycopg.Error) and (found := _diagnosis(cause)) is not None:
            _refused, _why, todo, state = found
            todo = _WAIT_TODO.get(state, todo)
            break
    if waited:
        return f"database at {where} still {state} after {waited}; waiting ({todo})"
    return f"database at {where} {state}; waiting, retrying with backoff ({todo})"


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _took(seconds: float) -> str:
    """A wait's length for a person: `12 s`, `3 min`."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class _Wait:
    """A long-running process's wait for the database: a WARNING when it begins,
    another every `remind_s` while it lasts, an INFO when a connection came."""

    def __init__(
        self, where: str, remind_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.where = where
        self.remind_s = remind_s
        self.clock = clock
        self.began: float | None = None
        self.said = 0.0

    def failed(self, exc: BaseException) -> None:
        now = self.clock()
        if self.began is None:
            self.began = self.said = now
            log.warning("%s", waiting_line(exc, self.where))
        elif now - self.said >= self.remind_s:
            self.said = now
            log.warning("%s", waiting_line(exc, self.where, waited=_took(now - self.began)))

    def done(self) -> None:
        if self.began is not None:
            took = _took(self.clock() - self.began)
            log.info("database at %s: connected after waiting %s", self.where, took)


def _sleep(stop: threading.Event | None, seconds: float) -> bool:
    """Wait; True when `stop` was set meanwhile."""
    if stop is None:
        time.sleep(seconds)
        return False
    return stop.wait(seconds)


def retrying(
    attempt: Callable[[], Any],
    where: str,
    *,
    wait_s: float | None,
    stop: threading.Event | None = None,
    first_pause_s: float = 0.1,
    max_pause_s: float = 5.0,
    remind_s: float = REMIND_S,
) -> Any:
    """Run `attempt` until it succeeds, retrying unavailability with backoff.

    `wait_s` bounds the retrying (None: until `stop`, for long-running processes,
    which log the wait when it begins, every `remind_s` while it lasts and when it
    ends; a one-shot command logs nothing and reports the failure when its wait is
    spent). Refusals and errors that are no edge failure are raised at once.
    """
    deadline = None if wait_s is None else time.monotonic() + wait_s
    backoff = ReconnectPauses(first_pause_s, max_pause_s)
    wait = _Wait(where, remind_s) if wait_s is None else None
    while True:
        try:
            result = attempt()
        except Exception as exc:
            failure = classify(exc, where)
            if not isinstance(failure, ServiceUnavailable):
                if failure is not None:
                    raise failure from exc
                raise
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise failure from exc
            if wait is not None:
                wait.failed(exc)
            nap = backoff.next()
            if _sleep(stop, nap if left is None else min(nap, left)):
                raise failure from exc
            continue
        if wait is not None:
            wait.done()
        return result


def connect(
    conninfo: str,
    where: str,
    *,
    wait_s: float | None,
    stop: threading.Event | None = None,
    **kwargs: Any,
) -> psycopg.Connection[Any]:
    """One connection, retried while the server is unavailable (see `retrying`)."""
    conn: psycopg.Connection[Any] = retrying(
        lambda: psycopg.connect(conninfo, **kwargs), where, wait_s=wait_s, stop=stop
    )
    return conn
