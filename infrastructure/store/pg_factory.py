"""The event-sourcing library's PostgreSQL factory, with two things it lacks.

1. The database URL's query options (`sslmode`, `sslrootcert`,
   `application_name`, ... every libpq connection parameter) reach libpq
   unchanged: the library builds its connections from five fixed keys, so the
   rest is handed over as `POSTGRES_LIBPQ_OPTIONS` (JSON) and added to its
   pool's connection arguments before the pool opens.
2. A one-shot command (`POSTGRES_POOLED=n`) holds no pool: each use of the
   datastore opens one connection, uses it and closes it, so the process never
   has more than one connection and none idle between uses (`provision
   --wait` polls this way). Opening it retries "too many clients" and refused
   connections with backoff for `POSTGRES_CONNECT_WAIT_S` seconds.

The library's `get_connection` (its error mapping, type adapters) is kept:
only the pool behind it is replaced.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from eventsourcing.postgres import PostgresFactory
from eventsourcing.utils import Environment, strtobool

from infrastructure.store.pg_connect import connect

LIBPQ_OPTIONS = "POSTGRES_LIBPQ_OPTIONS"
POOLED = "POSTGRES_POOLED"
CONNECT_WAIT_S = "POSTGRES_CONNECT_WAIT_S"
WHERE = "POSTGRES_REDACTED_URL"


class OneConnectionAtATime:
    """Stands in for the library's pool: a fresh connection per use, closed after it."""

    def __init__(self, kwargs: dict[str, Any], configure: Any, where: str, wait_s: float) -> None:
        self.kwargs = kwargs
        self.configure = configure
        self.where = where
        self.wait_s = wait_s
        self._lock = threading.RLock()  # one connection per process, even with threads

    def open(self, *_: object, **__: object) -> None:
        return None

    def close(self, *_: object, **__: object) -> None:
        return None

    def __enter__(self) -> OneConnectionAtATime:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @contextmanager
    def connection(self, *_: object, **__: object) -> Iterator[psycopg.Connection[Any]]:
        with self._lock:
            conn = connect("", self.where, wait_s=self.wait_s, **self.kwargs)
            try:
                self.configure(conn)
                yield conn
            finally:
                conn.close()


class ProvisionerPostgresFactory(PostgresFactory):
    def __init__(self, env: Environment) -> None:
        super().__init__(env)
        pool: Any = self.datastore.pool
        pool.kwargs.update(json.loads(self.env.get(LIBPQ_OPTIONS) or "{}"))
        if not strtobool(self.env.get(POOLED) or "y"):
            self.datastore.pool = OneConnectionAtATime(  # type: ignore[assignment]
                pool.kwargs,
                self.datastore.after_connect_func(),
                self.env.get(WHERE) or "the database",
                float(self.env.get(CONNECT_WAIT_S) or "30"),
            )
