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
until its wait is spent; what is refused is raised at once.
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
    Backoff,
    EdgeFailure,
    ServiceRefused,
    ServiceUnavailable,
    causes,
)

log = logging.getLogger("provisioner.connect")

# (pattern in the server's or libpq's message, sqlstate, refused for good?, what to do)
_KNOWN: tuple[tuple[str, str, bool, str], ...] = (
    ("password authentication failed", "28P01", True,
     "check the user and password in PROVISIONER_DATABASE_URL"),
    (r"role .* does not exist|no pg_hba\.conf entry|authentication", "28000", True,
     "check the user in PROVISIONER_DATABASE_URL and the server's pg_hba.conf"),
    (r"database .* does not exist", "3D000", True,
     "create the database, or correct its name in PROVISIONER_DATABASE_URL"),
    ("permission denied", "42501", True, "grant the database user the privileges it needs"),
    (r"does not support SSL|certificate|sslmode|sslrootcert|sslcert|sslkey", "", True,
     "check the sslmode/sslrootcert options of PROVISIONER_DATABASE_URL and the server's TLS"),
    (r"too many clients|remaining connection slots", "53300", False,
     "retry later, or raise max_connections (see docs/configuration.md)"),
    (r"starting up|shutting down|in recovery", "57P03", False, "retry when the server is up"),
)  # fmt: skip


def _reason(message: str) -> str:
    """The useful part of libpq's message: the server's FATAL text, or the last cause."""
    text = " ".join(message.split())
    if "FATAL:" in text:
        return text.split("FATAL:", 1)[1].strip()
    return re.sub(r"^connection failed: ", "", text).split(" Is the server running")[0]


def classify(exc: BaseException, where: str) -> EdgeFailure | None:
    """The edge failure `exc` means for the database `where` (redacted), or None."""
    for cause in causes(exc):
        if isinstance(cause, EdgeFailure):
            return cause
        if not isinstance(cause, psycopg.Error):
            continue
        if not isinstance(cause, (psycopg.OperationalError, psycopg.InterfaceError)) and (
            cause.sqlstate != "42501"
        ):
            return None  # a query's own error (a bug or a conflict), not an edge failure
        message = str(cause)
        for pattern, sqlstate, refused, todo in _KNOWN:
            if (sqlstate and cause.sqlstate == sqlstate) or re.search(pattern, message):
                kind = ServiceRefused if refused else ServiceUnavailable
                verb = "refused us" if refused else "is unavailable"
                return kind(f"PostgreSQL at {where} {verb}: {_reason(message)}: {todo}")
        return ServiceUnavailable(
            f"PostgreSQL at {where} is unavailable: {_reason(message)}: "
            "check that the server is running and reachable"
        )
    return None


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
) -> Any:
    """Run `attempt` until it succeeds, retrying unavailability with backoff.

    `wait_s` bounds the retrying (None: forever, for long-running processes,
    which log the outage once and the recovery once). Refusals and errors
    that are no edge failure are raised at once.
    """
    deadline = None if wait_s is None else time.monotonic() + wait_s
    backoff, outage = Backoff(first_pause_s, max_pause_s), None
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
            if outage is None and wait_s is None:
                log.warning("%s; retrying with backoff", failure)
            outage = outage or failure
            nap = backoff.next()
            if _sleep(stop, nap if left is None else min(nap, left)):
                raise failure from exc
            continue
        if outage is not None and wait_s is None:
            log.warning("PostgreSQL at %s is back", where)
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
