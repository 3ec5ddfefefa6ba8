"""How long-running processes ride out a broker or database outage.

Every long-running component (worker, relay, projections, reconciler) runs a
loop that never ends on a failure retrying can fix: it backs off (`Backoff`:
0.5 s doubling to 15 s, with jitter so that many processes do not come back in
step), logs the outage once and the recovery once (`Outage`), and carries on.
What retrying cannot fix (credentials refused, a vhost or database that does
not exist) is raised as `ServiceRefused` instead: `refusal` tells the two
apart, asking `infrastructure.broker` about broker errors and looking at the
SQLSTATE or libpq message of database errors.
"""

from __future__ import annotations

import logging
import random
import sqlite3
from collections.abc import Callable, Iterator

import psycopg
from eventsourcing import persistence

from infrastructure.broker import broker_refusal, is_broker_error
from infrastructure.eventstore import redact
from infrastructure.failures import ServiceRefused

# What a database that is down, restarting or unreachable raises.
_DATABASE_UNAVAILABLE = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    persistence.OperationalError,
    persistence.InterfaceError,
    sqlite3.OperationalError,
)

FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 15.0

# SQLSTATEs retrying cannot change.
_DATABASE_REFUSED_STATES = {
    "28000": "refused the login",  # invalid_authorization_specification
    "28P01": "refused the password",  # invalid_password
    "3D000": "has no such database",  # invalid_catalog_name
}


def _refused_at_connect(text: str) -> str | None:
    """libpq's connection errors carry no SQLSTATE: read its words instead."""
    text = text.lower()
    if "password authentication failed" in text or "no pg_hba.conf entry" in text:
        return "refused the login"
    if "does not exist" in text and 'role "' in text:
        return "refused the login"
    if "does not exist" in text and 'database "' in text:
        return "has no such database"
    return None


class Backoff:
    """Pauses between reconnection tries: FIRST_PAUSE_S doubling to MAX_PAUSE_S, each
    drawn between half and all of its nominal value (jitter)."""

    def __init__(
        self,
        first_s: float = FIRST_PAUSE_S,
        max_s: float = MAX_PAUSE_S,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.rng = rng
        self._nominal = first_s

    def next(self) -> float:
        pause = self._nominal * (0.5 + 0.5 * self.rng())
        self._nominal = min(self._nominal * 2, self.max_s)
        return pause

    def reset(self) -> None:
        self._nominal = self.first_s


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
            self.log.debug("%s: still unavailable (%s); next try in %.1fs",
                           self.component, one_line(exc), pause or 0.0)  # fmt: skip

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


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_database_error(exc: BaseException) -> bool:
    """True when `exc` is the database (or the network to it) failing us: a lost or
    refused connection, an exhausted pool, a server shutting down."""
    return any(isinstance(error, _DATABASE_UNAVAILABLE) for error in _chain(exc))


def database_refusal(exc: BaseException, url: str) -> ServiceRefused | None:
    """ServiceRefused when the database refused us for good (login, missing database)."""
    for error in _chain(exc):
        if type(error).__module__.split(".")[0] != "psycopg":
            continue
        state = getattr(error, "sqlstate", None)
        if state is None:
            what = _refused_at_connect(str(error))
        else:
            what = _DATABASE_REFUSED_STATES.get(state)
        if what is not None:
            return ServiceRefused(
                f"PostgreSQL at {redact(url)} {what} ({one_line(error)}): fix "
                "PROVISIONER_DATABASE_URL or the server's roles and databases"
            )
    return None


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
