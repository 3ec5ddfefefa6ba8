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

import json
import logging
import os
import sqlite3
import stat
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
from eventsourcing.application import Application
from eventsourcing.persistence import InfrastructureFactory, Recording, TrackingRecorder
from eventsourcing.utils import Environment
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from infrastructure.failures import ConfigurationError, EdgeFailure
from infrastructure.redaction import redact_url
from infrastructure.store.pg_connect import connect, log, retrying
from infrastructure.store.pg_factory import CONNECT_WAIT_S, LIBPQ_OPTIONS, POOLED, WHERE

APP_NAME = "provisioner"
EVENTS_TABLE = f"{APP_NAME}_events"
RELAY_NAME = "provisioner_relay"  # its table: provisioner_relay_tracking
# Any fixed 64-bit number; all processes of the project agree on it.
SCHEMA_LOCK_KEY = 7_351_204_118
DATABASE_SCHEMES = ("postgresql", "postgres", "sqlite", "memory")
SQLITE_EVENTS_TABLE = "stored_events"  # the library's name for it on SQLite
# A one-shot connection's wait when the caller gives none; 0 means one try, no wait.
# The default of PROVISIONER_CONNECT_WAIT_S too (infrastructure/settings/table.py).
CONNECT_WAIT_DEFAULT_S = 30.0


class DatabaseNotInitialised(EdgeFailure, RuntimeError):
    """The event tables (or the SQLite file) do not exist yet: run `provisioner db init`."""


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
        """The library's own `save`, counting the saves that recorded something."""
        recordings = super().save(*objs, **kwargs)
        if recordings:
            with self._saves_lock:
                self.saves += 1
        return recordings


def check_database_url(url: str) -> None:
    """Raise ConfigurationError (one line) unless the URL can be used as it is."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DATABASE_SCHEMES:
        raise ConfigurationError(
            f"unsupported database URL {redact_url(url)}: use postgresql://user@host:port/db, "
            "sqlite:///path/file.sqlite or memory://"
        )
    if scheme in ("postgresql", "postgres"):
        if not parts.hostname:
            raise ConfigurationError(f"database URL names no host: {redact_url(url)}")
        if not parts.path.lstrip("/"):
            raise ConfigurationError(f"database URL names no database: {redact_url(url)}")
        _libpq_options(url)


# A peer that goes silent (a partition that drops packets, a host that died)
# neither answers nor closes: without these a pooled connection waits on it
# until the kernel gives up (minutes to hours). TCP keepalives probe an idle
# connection after 30 s, every 10 s, 3 times; `tcp_user_timeout` (ms) ends a
# connection whose sent data stays unacknowledged for 60 s. The URL's own
# query options win (`?keepalives_idle=5`, `?keepalives=0`).
SILENT_PEER_DEFAULTS = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",
}


def _libpq_options(url: str) -> dict[str, str]:
    """Every connection parameter of a postgresql:// URL, parsed by libpq itself.

    An option libpq does not know is refused here (one line) rather than
    dropped; the ones it knows reach it unchanged.
    """
    try:
        options = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        # libpq repeats what it could not parse, the password too ("pa ss"): by value.
        reason = " ".join(str(exc).split())
        raise ConfigurationError(redact_url(url, f"{reason} in the database URL {url}")) from None
    options.setdefault("host", "127.0.0.1")
    options.setdefault("port", "5432")
    options.setdefault("user", "postgres")
    options.setdefault("connect_timeout", "5")
    for key, value in SILENT_PEER_DEFAULTS.items():
        options.setdefault(key, value)
    return {key: str(value) for key, value in options.items()}


def persistence_env(
    url: str,
    *,
    pool_size: int = 5,
    create_table: bool = False,
    pooled: bool = True,
    connect_wait_s: float = CONNECT_WAIT_DEFAULT_S,
) -> dict[str, str]:
    """Translate a database URL into the library's environment keys.

    `pooled=False` (one-shot commands): no pool, one connection at a time,
    opened per use (see infrastructure/store/pg_factory.py).
    """
    check_database_url(url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("postgresql", "postgres"):
        options = _libpq_options(url)
        fixed = {key: options.pop(key, "") for key in ("dbname", "host", "port", "user")}
        password = options.pop("password", "")
        return {
            "PERSISTENCE_MODULE": "infrastructure.store.pg_factory:ProvisionerPostgresFactory",
            "POSTGRES_DBNAME": fixed["dbname"],
            "POSTGRES_HOST": fixed["host"],
            "POSTGRES_PORT": fixed["port"],
            "POSTGRES_USER": fixed["user"],
            "POSTGRES_PASSWORD": password,
            "POSTGRES_POOL_SIZE": str(pool_size),
            "POSTGRES_MAX_OVERFLOW": "0",
            "POSTGRES_CONNECT_TIMEOUT": options["connect_timeout"],
            "POSTGRES_ENABLE_DB_FUNCTIONS": "n",
            "APPLICATION_RECORDER_TOPIC": (
                "infrastructure.store.pg_recorder:OneTripPostgresRecorder"
            ),
            "CREATE_TABLE": "y" if create_table else "n",
            LIBPQ_OPTIONS: json.dumps(options),
            POOLED: "y" if pooled else "n",
            CONNECT_WAIT_S: str(connect_wait_s),
            WHERE: redact_url(url),
        }
    if scheme == "sqlite":
        # As in SQLAlchemy: sqlite:///relative/path, sqlite:////absolute/path, sqlite://.
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        return {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "SQLITE_DBNAME": unquote(path) if path else ":memory:",
            "CREATE_TABLE": "y" if create_table else "n",
        }
    return {"PERSISTENCE_MODULE": "eventsourcing.popo"}


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
    env = persistence_env(url, pool_size=1, create_table=True, pooled=False)
    ProvisionerApplication(env).close()
    open_position_store(url, create_table=True)


def init_database(url: str, *, wait_s: float | None = CONNECT_WAIT_DEFAULT_S) -> None:
    """Create the event and tracking tables if missing; idempotent and concurrency-safe."""
    if not is_postgres(url):
        _sqlite_parent(url)
        _create_tables(url)
        return
    with connect(postgres_conninfo(url), redact_url(url), wait_s=wait_s, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (SCHEMA_LOCK_KEY,))
        try:
            _create_tables(url)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (SCHEMA_LOCK_KEY,))


def postgres_conninfo(url: str, *, options: str = "") -> str:
    """libpq's connection string for the URL: every query option kept, unchanged.

    `options` (server settings such as `-c TimeZone=UTC`) is added to the
    URL's own `options`, never in place of it.
    """
    params: dict[str, Any] = _libpq_options(url)
    if options:
        params["options"] = f"{params.get('options', '')} {options}".strip()
    return make_conninfo(**params)


def sqlite_path(url: str) -> Path | None:
    """The SQLite file a URL names (None for in-memory stores and PostgreSQL)."""
    name = persistence_env(url).get("SQLITE_DBNAME", ":memory:")
    return None if name == ":memory:" else Path(name)


def _sqlite_parent(url: str) -> None:
    """The SQLite file's folder (0700 when made here) and the file (0600 when made here:
    it holds every brand, title and workspace; SQLite gives its -wal and -shm files the
    same mode). A file that exists keeps its mode; one anybody may read is warned of."""
    path = sqlite_path(url)
    if path is None:
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        if path.stat().st_mode & stat.S_IROTH:
            log.warning("the event store %s is readable by every user: chmod 600 it", path)


def no_sqlite_store(url: str) -> DatabaseNotInitialised | None:
    """Why a read of this SQLite store cannot be served (None if it can), creating nothing."""
    path = sqlite_path(url)
    if path is None:
        return None
    if not path.is_file():
        return DatabaseNotInitialised(f"no event store at {path}: run `provisioner db init`")
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as conn:
        sql = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?"
        (found,) = conn.execute(sql, (SQLITE_EVENTS_TABLE,)).fetchone()
    if not found:
        return DatabaseNotInitialised(
            f"the event tables are missing in {path}: run `provisioner db init`"
        )
    return None


def open_event_store(
    url: str,
    *,
    pool_size: int = 5,
    one_shot: bool = False,
    read_only: bool = False,
    wait_s: float | None = CONNECT_WAIT_DEFAULT_S,
    stop: threading.Event | None = None,
) -> ProvisionerApplication:
    """Open the event store.

    In-memory and SQLite stores create their tables themselves, unless
    `read_only`: then a missing file or table is an error and nothing is
    created. On PostgreSQL the tables must exist; the check's connection is
    retried while the server is unavailable for `wait_s` seconds (None: until
    `stop`), and a refusal (credentials, missing database) is raised at once.
    `one_shot`: no pool, one connection at a time, none held between uses.
    """
    if not is_postgres(url):
        if read_only and (missing := no_sqlite_store(url)):
            raise missing
        if not _is_ephemeral(url) and not read_only:
            _sqlite_parent(url)
        return ProvisionerApplication(persistence_env(url, create_table=not read_only))
    if not _tables_exist(url, wait_s=wait_s, stop=stop):
        raise DatabaseNotInitialised(
            f"the event tables are missing in {redact_url(url)}: run `provisioner db init` first"
        )
    # A long-running process says it once at start; a one-shot use (a probe, a CLI
    # read, every /readyz) says nothing at INFO.
    log.log(logging.DEBUG if one_shot else logging.INFO, "connected to %s", redact_url(url))
    env = persistence_env(
        url,
        pool_size=pool_size,
        pooled=not one_shot,
        connect_wait_s=CONNECT_WAIT_DEFAULT_S if wait_s is None else wait_s,
    )
    return ProvisionerApplication(env)


def _tables_exist(url: str, *, wait_s: float | None, stop: threading.Event | None) -> bool:
    def check() -> bool:
        with psycopg.connect(postgres_conninfo(url), autocommit=True) as conn:
            row = conn.execute("SELECT to_regclass(%s)", (f"public.{EVENTS_TABLE}",)).fetchone()
        return row is not None and row[0] is not None

    return bool(retrying(check, redact_url(url), wait_s=wait_s, stop=stop))
