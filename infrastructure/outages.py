"""How long-running processes ride out a broker or database outage.

Every long-running component (worker, relay, projections, reconciler) runs a
loop that never ends on a failure retrying can fix: it backs off (`ReconnectPauses`:
0.5 s doubling to 15 s, with jitter so that many processes do not come back in
step), logs the outage once and the recovery once (`Outage`), and carries on.
What retrying cannot fix (credentials refused, a vhost or database that does
not exist) is raised as `ServiceRefused` instead: `refusal` tells the two
apart, asking `infrastructure.broker.publisher` about broker errors and
`infrastructure.store.pg_connect` about database errors.
"""

from __future__ import annotations

import logging
import sqlite3

import psycopg
from eventsourcing import persistence

from infrastructure.broker.failures import broker_refusal, is_broker_error
from infrastructure.failures import ServiceRefused, causes
from infrastructure.redaction import redact
from infrastructure.store.pg_connect import classify

# What a database that is down, restarting or unreachable raises.
_DATABASE_UNAVAILABLE = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    persistence.OperationalError,
    persistence.InterfaceError,
    sqlite3.OperationalError,
)


class Outage:
    """One component's outages: a WARNING when a service goes away, an INFO
    "connected to <url>" (credentials redacted) when it is up again or first
    up, and nothing in between."""

    def __init__(
        self, log: logging.Logger, component: str, url: str, *, announce_start: bool = True
    ) -> None:
        self.log = log
        self.component = component
        self.url = url  # the service named when connected at start
        self.down: str | None = None  # the URL of the service that is down
        self._connected_once = not announce_start
        self.outages = 0

    def failed(self, url: str, exc: BaseException, pause: float | None = None) -> None:
        """A try failed because the service at `url` is unavailable."""
        if self.down is None:
            self.down = url
            self.outages += 1
            self.log.warning(
                "%s: %s unavailable (%s); retrying with backoff until it is back",
                self.component,
                redact(url),
                one_line(exc),
            )
        else:
            self.log.debug(
                "%s: still unavailable (%s); next try in %.1fs",
                self.component,
                one_line(exc),
                pause or 0.0,
            )

    def up(self) -> None:
        """A try succeeded: log the recovery (or the first connection) once."""
        if self.down is not None:
            url, self.down = self.down, None
            self.log.info("%s: connected to %s", self.component, redact(url))
        elif not self._connected_once:
            self.log.info("%s: connected to %s", self.component, redact(self.url))
        self._connected_once = True


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_database_error(exc: BaseException) -> bool:
    """True when `exc` is the database (or the network to it) failing us: a lost or
    refused connection, an exhausted pool, a server shutting down."""
    return any(isinstance(error, _DATABASE_UNAVAILABLE) for error in causes(exc))


def database_refusal(exc: BaseException, url: str) -> ServiceRefused | None:
    """ServiceRefused when the database refused us for good (login, missing database)."""
    failure = classify(exc, redact(url))
    return failure if isinstance(failure, ServiceRefused) else None


def refusal(
    exc: BaseException, *, broker_url: str | None = None, database_url: str | None = None
) -> ServiceRefused | None:
    """ServiceRefused when `exc` says a service refused us for good, else None."""
    if broker_url is not None and (refused := broker_refusal(exc, broker_url)) is not None:
        return refused
    if database_url is not None:
        return database_refusal(exc, database_url)
    return None


def which_service(
    exc: BaseException, *, broker_url: str | None = None, database_url: str | None = None
) -> str:
    """The URL of the service `exc` most likely came from (for the outage's log line)."""
    if broker_url is not None and (database_url is None or is_broker_error(exc)):
        return broker_url
    return database_url or broker_url or "?"
