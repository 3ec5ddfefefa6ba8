"""What the CLI says when something at the edge fails: one line, and an exit code.

`describe` turns any exception a command let escape into an `EdgeFailure`
whose message says what failed (credentials redacted) and what to do, and
whose `exit_code` is the command's (infrastructure/failures.py). The CLI's
one wrapper (worker/cli/main.py) prints it; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import errno
import sqlite3

import httpx
from eventsourcing.persistence import PersistenceError

from infrastructure.broker.failures import broker_failure
from infrastructure.failures import (
    ConfigurationError,
    EdgeFailure,
    ServiceRefused,
    ServiceUnavailable,
    causes,
)
from infrastructure.redaction import redact
from infrastructure.settings.model import Settings
from infrastructure.store.pg_connect import classify


def _urls() -> tuple[str, str, str]:
    """The configured database, broker and gateway, redacted, for the messages."""
    try:
        settings = Settings.from_env()
    except ConfigurationError:
        return "the configured database", "the configured broker", "the configured gateway"
    return (
        redact(settings.database_url),
        redact(settings.broker_url),
        redact(settings.gateway_url) if settings.gateway_url else "the gateway",
    )


def _os(exc: OSError) -> EdgeFailure:
    what = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ServiceRefused(f"permission denied ({what}): fix the permissions or the path")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ServiceUnavailable(f"no space left ({what}): free disk space and run it again")
    return EdgeFailure(f"operating system error ({what})")


def describe(exc: BaseException) -> EdgeFailure:
    """The one-line failure an exception escaping a command stands for."""
    database, broker, gateway = _urls()
    found = classify(exc, database)
    if found is not None:
        return found
    for cause in causes(exc):
        if (failure := broker_failure(cause, broker)) is not None and not isinstance(
            cause, OSError
        ):
            return failure
        if isinstance(cause, httpx.HTTPError):
            return ServiceUnavailable(
                f"the gateway at {gateway} failed ({type(cause).__name__}: "
                f"{redact(str(cause))}): check PROVISIONER_GATEWAY_URL and that the gateway is up"
            )
        if isinstance(cause, sqlite3.Error):
            refused = any(s in str(cause) for s in ("unable to open", "readonly", "read-only"))
            kind = ServiceRefused if refused else ServiceUnavailable
            return kind(
                f"the SQLite store {database} failed ({cause}): check the file, its folder, "
                "their permissions and the free disk space"
            )
    for cause in causes(exc):
        if isinstance(cause, OSError) and not isinstance(cause, ConnectionError):
            return _os(cause)
        if isinstance(cause, ConnectionError):
            return ServiceUnavailable(f"a connection failed ({cause}): check the services")
    if isinstance(exc, PersistenceError):
        return ServiceUnavailable(f"the event store at {database} failed ({exc})")
    return EdgeFailure(
        f"unexpected {type(exc).__name__}: {redact(str(exc))} (run with --debug for the traceback)"
    )
