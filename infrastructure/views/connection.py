"""One connection to the read models' database (PostgreSQL, SQLite, or memory://'s
in-process SQLite), and its transactions; `SqlViewStore` (infrastructure/views/store.py)
is what is stored there."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import psycopg
from psycopg.rows import dict_row

from infrastructure.redaction import redact
from infrastructure.store.eventstore import (
    CONNECT_WAIT_DEFAULT_S,
    DatabaseNotInitialised,
    is_postgres,
    persistence_env,
    postgres_conninfo,
)
from infrastructure.store.pg_connect import connect
from infrastructure.views.sql import Dialect


class ViewConnection:
    """Not thread-safe: each runner thread and each reader opens its own. One
    connection, opened on first use (retried while the server is unavailable
    for `wait_s` seconds; None: until it is back). `read_only` readers create
    nothing: a SQLite file that does not exist is an error, not a new file.
    """

    def __init__(
        self, url: str, *, read_only: bool = False, wait_s: float | None = CONNECT_WAIT_DEFAULT_S
    ) -> None:
        self.url = url
        self.read_only = read_only
        self.wait_s = wait_s
        self.dialect = Dialect(is_postgres(url))
        self._pg: psycopg.Connection[Any] | None = None
        self._lite: sqlite3.Connection | None = None

    @property
    def pg(self) -> psycopg.Connection[Any]:
        if self._pg is None or self._pg.closed:
            self._pg = connect(
                postgres_conninfo(self.url, options="-c TimeZone=UTC"),
                redact(self.url),
                wait_s=self.wait_s,
                row_factory=dict_row,
            )
        return self._pg

    @property
    def lite(self) -> sqlite3.Connection:
        if self._lite is None:
            self._lite = sqlite3.connect(
                _sqlite_target(self.url, read_only=self.read_only),
                isolation_level=None,
                timeout=30,
                check_same_thread=False,
                uri=True,
            )
            self._lite.row_factory = sqlite3.Row
            if not self.read_only:
                self._lite.execute("PRAGMA journal_mode=WAL")
        return self._lite

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
        if self._lite is not None:
            self._lite.close()
        self._pg = self._lite = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self, *, immediate: bool = True) -> Iterator[Any]:
        """A transaction; yields a cursor-like object with execute/fetch."""
        if self.dialect.postgres:
            with self.pg.transaction(), self.pg.cursor() as cur:
                yield cur
            return
        conn = self.lite
        if conn.in_transaction:  # nested: part of the enclosing transaction
            yield conn
            return
        conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


def _sqlite_target(url: str, *, read_only: bool = False) -> str:
    """A URI for sqlite3: the event store's own file, or a shared in-memory database."""
    if url.startswith("memory://"):
        # memory://TOKEN: rows live as long as one connection to it stays open.
        return f"file:views-{url.removeprefix('memory://') or 'default'}?mode=memory&cache=shared"
    env = persistence_env(url)
    name = env.get("SQLITE_DBNAME", ":memory:")
    if name == ":memory:":
        raise ValueError(f"read models need a database file or a server, not {url}")
    if read_only:
        if not Path(name).is_file():
            raise DatabaseNotInitialised(f"no event store at {name}: run `provisioner db init`")
        return f"{Path(name).resolve().as_uri()}?mode=ro"
    return Path(name).resolve().as_uri()
