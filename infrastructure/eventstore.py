"""The event store: an eventsourcing Application configured from one database URL.

URLs:
    postgresql://user[:password]@host[:port]/dbname   production
    sqlite:///relative/file.sqlite                    embedded default (WAL mode)
    sqlite:////absolute/file.sqlite
    memory://                                         in-process, for unit tests

Tables are created by one explicit step, `init_database(url)` (the CLI's
`provisioner db init`): idempotent, and safe when several processes run it at
once, because on PostgreSQL it holds an advisory lock around the library's
CREATE statements (run concurrently they fail with "tuple concurrently
updated"). Long-running processes open the store with CREATE_TABLE off and
get a clear error if the tables are missing.

`POSTGRES_ENABLE_DB_FUNCTIONS` stays off: its insert path skips the table lock
that keeps notification ids in commit order, and subscriptions can then miss
events.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
from eventsourcing.application import Application, ProcessingEvent
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import InfrastructureFactory, Recording, TrackingRecorder
from eventsourcing.utils import Environment

APP_NAME = "provisioner"
EVENTS_TABLE = f"{APP_NAME}_events"
RELAY_NAME = "provisioner_relay"  # its table: provisioner_relay_tracking
# Any fixed 64-bit number; all processes of the project agree on it.
SCHEMA_LOCK_KEY = 7_351_204_118


class DatabaseNotInitialised(RuntimeError):
    """The event tables do not exist yet."""


class ProvisionerApplication(Application[Any]):
    """The event store of attempts, brands and claims.

    `name` is pinned so renaming the class never renames the tables. It counts
    its successful saves (event-store transactions), which the benchmark and
    the transaction-budget tests read.
    """

    name = APP_NAME

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        super().__init__(env)
        self._saves_lock = threading.Lock()
        self.saves = 0

    def save(self, *objs: Any, **kwargs: Any) -> list[Recording[Any]]:
        """The library's `save`, collecting our aggregates' events directly.

        The library tells events from aggregates with runtime-protocol
        `isinstance` checks, which Python 3.11 computes afresh on every call
        (two per aggregate, about 30 us each: a tenth of a hop's CPU). An
        `Aggregate` is recognised by its class instead; anything else takes the
        library's path.
        """
        processing = ProcessingEvent[Any]()
        for obj in objs:
            if isinstance(obj, Aggregate):
                processing.events.extend(obj.collect_events())
                processing.aggregates[obj.id] = obj
            else:
                processing.collect_events(obj)
        processing.saved_kwargs.update(kwargs)
        recordings = self._record(processing)
        self._take_snapshots(processing)
        self._notify(recordings)
        if recordings:
            with self._saves_lock:
                self.saves += 1
        return recordings


def persistence_env(url: str, *, pool_size: int = 5, create_table: bool = False) -> dict[str, str]:
    """Translate a database URL into the library's environment keys."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("postgresql", "postgres"):
        dbname = parts.path.lstrip("/")
        if not dbname:
            raise ValueError(f"database URL names no database: {redact(url)}")
        return {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": unquote(dbname),
            "POSTGRES_HOST": parts.hostname or "127.0.0.1",
            "POSTGRES_PORT": str(parts.port or 5432),
            "POSTGRES_USER": unquote(parts.username or "postgres"),
            "POSTGRES_PASSWORD": unquote(parts.password or ""),
            "POSTGRES_POOL_SIZE": str(pool_size),
            "POSTGRES_MAX_OVERFLOW": str(pool_size),
            "POSTGRES_CONNECT_TIMEOUT": "5",
            "POSTGRES_ENABLE_DB_FUNCTIONS": "n",
            "APPLICATION_RECORDER_TOPIC": "infrastructure.pg_recorder:OneTripPostgresRecorder",
            "CREATE_TABLE": "y" if create_table else "n",
        }
    if scheme == "sqlite":
        # As in SQLAlchemy: sqlite:///relative/path, sqlite:////absolute/path, sqlite://.
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        return {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "SQLITE_DBNAME": unquote(path) if path else ":memory:",
            "CREATE_TABLE": "y" if create_table else "n",
        }
    if scheme == "memory":
        return {"PERSISTENCE_MODULE": "eventsourcing.popo"}
    raise ValueError(
        f"unsupported database URL {redact(url)}: use postgresql://user@host:port/db, "
        "sqlite:///path/file.sqlite or memory://"
    )


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = (parts.netloc or "").replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


def is_postgres(url: str) -> bool:
    return urlsplit(url).scheme.lower() in ("postgresql", "postgres")


def _is_ephemeral(url: str) -> bool:
    """In-memory stores live only in their own Application object."""
    env = persistence_env(url)
    return (
        env["PERSISTENCE_MODULE"] == "eventsourcing.popo" or env.get("SQLITE_DBNAME") == ":memory:"
    )


def open_position_store(url: str, *, create_table: bool = False) -> TrackingRecorder:
    """The relay's tracked position in the notification log (a tracking table)."""
    env = persistence_env(url, pool_size=1, create_table=create_table)
    env["SINGLE_ROW_TRACKING"] = "y"
    factory = InfrastructureFactory.construct(Environment(name=RELAY_NAME, env=env))
    return factory.tracking_recorder()


def _create_tables(url: str) -> None:
    ProvisionerApplication(persistence_env(url, pool_size=1, create_table=True)).close()
    open_position_store(url, create_table=True)


def init_database(url: str) -> None:
    """Create the event and tracking tables if missing; idempotent and concurrency-safe."""
    if not is_postgres(url):
        _create_tables(url)
        return
    with psycopg.connect(postgres_conninfo(url), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (SCHEMA_LOCK_KEY,))
        try:
            _create_tables(url)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (SCHEMA_LOCK_KEY,))


def postgres_conninfo(url: str) -> str:
    env = persistence_env(url)
    return psycopg.conninfo.make_conninfo(
        dbname=env["POSTGRES_DBNAME"],
        host=env["POSTGRES_HOST"],
        port=env["POSTGRES_PORT"],
        user=env["POSTGRES_USER"],
        password=env["POSTGRES_PASSWORD"] or None,
        connect_timeout=5,
    )


def open_event_store(url: str, *, pool_size: int = 5) -> ProvisionerApplication:
    """Open the event store; in-memory and SQLite stores create their tables themselves."""
    if _is_ephemeral(url) or not is_postgres(url):
        env = persistence_env(url, create_table=True)
        if env.get("SQLITE_DBNAME", ":memory:") != ":memory:":
            Path(env["SQLITE_DBNAME"]).parent.mkdir(parents=True, exist_ok=True)
        return ProvisionerApplication(env)
    if not _tables_exist(url):
        raise DatabaseNotInitialised(
            f"the event tables are missing in {redact(url)}: run `provisioner db init` first"
        )
    return ProvisionerApplication(persistence_env(url, pool_size=pool_size))


def _tables_exist(url: str) -> bool:
    with psycopg.connect(postgres_conninfo(url), autocommit=True) as conn:
        row = conn.execute("SELECT to_regclass(%s)", (f"public.{EVENTS_TABLE}",)).fetchone()
    return row is not None and row[0] is not None
