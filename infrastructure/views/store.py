"""SQL storage of the read models, on PostgreSQL and SQLite (see docs/read-models.md).

Tables, for each projection NAME:
    NAME_gN                      a copy of the projection (N = its generation)
    NAME                         a view over the live copy: what readers query
    provisioner_projections      name -> live copy, copy being rebuilt, last generation
    provisioner_projection_positions   copy -> notification id applied up to
    provisioner_projection_versions    name -> version of the code that built the live copy

Every batch is one transaction that writes its rows and moves its copy's
position with a compare-and-set, so it applies exactly once. A batch on the
live copy holds a share lock on the projection's registry row (PostgreSQL;
SQLite has one writer at a time anyway); a switch takes it exclusively, so the
live runner never writes to a copy that is being retired, and readers move to
the new copy in the same transaction that retires the old one.

`memory://` stores keep their rows in an in-process SQLite database. The
connection is in `infrastructure/views/connection.py`, the SQL of the tables and
of one batch in `infrastructure/views/sql.py`; what readers ask, in
`infrastructure/views/queries.py`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from infrastructure.redaction import redact
from infrastructure.store.eventstore import SCHEMA_LOCK_KEY, postgres_conninfo
from infrastructure.store.pg_connect import connect
from infrastructure.views.connection import ViewConnection
from infrastructure.views.sql import (
    POSITIONS,
    SqlBatch,
    ViewsNotInitialised,
    all_rows,
    copy_ddl,
    one,
)
from projections.attempts import Attempts
from projections.brand_workspaces import BrandWorkspaces
from projections.core import PositionConflict, Projection, Row

__all__ = [
    "PROJECTIONS",
    "REGISTRY",
    "VERSIONS",
    "SqlViewStore",
    "UnknownProjection",
    "init_read_models",
    "memory_views_url",
    "projection",
    "version_of",
]

PROJECTIONS: dict[str, Projection] = {p.name: p for p in (BrandWorkspaces(), Attempts())}
REGISTRY = "provisioner_projections"
VERSIONS = "provisioner_projection_versions"


def version_of(proj: Projection) -> int:
    """What a projection's rows mean, as a number (1 unless it says otherwise)."""
    return int(getattr(proj, "version", 1))


class UnknownProjection(ValueError):
    pass


def projection(name: str) -> Projection:
    try:
        return PROJECTIONS[name]
    except KeyError:
        names = ", ".join(PROJECTIONS)
        raise UnknownProjection(f"no projection named {name!r}; known: {names}") from None


class SqlViewStore(ViewConnection):
    """The read models of one database (its connection: `ViewConnection`): the
    `ViewStore` port, status, and queries."""

    # Schema.

    def setup(self) -> None:
        """Create the registry and, for each projection, its first copy and view.

        Idempotent; on PostgreSQL it runs under the schema advisory lock, so
        several processes may run it at once.
        """
        if self.dialect.postgres:
            conninfo, where = postgres_conninfo(self.url), redact(self.url)
            with connect(conninfo, where, wait_s=self.wait_s, autocommit=True) as conn:
                conn.execute("SELECT pg_advisory_lock(%s)", (SCHEMA_LOCK_KEY,))
                try:
                    self._setup()
                finally:
                    conn.execute("SELECT pg_advisory_unlock(%s)", (SCHEMA_LOCK_KEY,))
            return
        self._setup()

    def _setup(self) -> None:
        p = self.dialect.p
        with self._tx() as cur:
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {REGISTRY} (name text PRIMARY KEY, "
                "live text NOT NULL, building text, generation integer NOT NULL)"
            )
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {POSITIONS} "
                "(copy text PRIMARY KEY, position bigint NOT NULL)"
            )
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {VERSIONS} "
                "(name text PRIMARY KEY, version integer NOT NULL)"
            )
            for proj in PROJECTIONS.values():
                if one(cur, f"SELECT name FROM {REGISTRY} WHERE name = {p}", proj.name):
                    continue
                copy = f"{proj.name}_g1"
                for statement in copy_ddl(self.dialect, proj, copy):
                    cur.execute(statement)
                cur.execute(f"INSERT INTO {POSITIONS} VALUES ({p}, 0)", (copy,))
                cur.execute(f"INSERT INTO {REGISTRY} VALUES ({p}, {p}, NULL, 1)", (proj.name, copy))
                self._set_version(cur, proj)
                self._point_view(cur, proj.name, copy)

    def _set_version(self, cur: Any, proj: Projection) -> None:
        p = self.dialect.p
        cur.execute(
            f"INSERT INTO {VERSIONS} VALUES ({p}, {p}) "
            "ON CONFLICT (name) DO UPDATE SET version = excluded.version",
            (proj.name, version_of(proj)),
        )

    def outdated(self) -> list[Projection]:
        """Projections whose live copy was built by older code (a copy from before
        versions were recorded counts as version 1): rebuild them."""
        with self._tx(immediate=False) as cur:
            stored = {r["name"]: r["version"] for r in all_rows(cur, f"SELECT * FROM {VERSIONS}")}
        return [p for p in PROJECTIONS.values() if stored.get(p.name, 1) < version_of(p)]

    def _point_view(self, cur: Any, name: str, copy: str) -> None:
        if self.dialect.postgres:
            cur.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM {copy}")
        else:
            cur.execute(f"DROP VIEW IF EXISTS {name}")
            cur.execute(f"CREATE VIEW {name} AS SELECT * FROM {copy}")

    def check(self) -> None:
        """Raise ViewsNotInitialised with what to do if the tables are missing."""
        if self.dialect.postgres:
            with self._tx() as cur:
                found = one(cur, "SELECT to_regclass(%s) AS t", f"public.{REGISTRY}")
            if found and found["t"]:
                return
            raise ViewsNotInitialised(
                "the projection tables are missing: run `provisioner db init` first"
            )
        with self._tx(immediate=False) as cur:
            sql = "SELECT count(*) AS n FROM sqlite_master WHERE type = 'view' AND name = ?"
            views = sum(one(cur, sql, name)["n"] for name in PROJECTIONS)
        if views < len(PROJECTIONS):
            if self.read_only:
                raise ViewsNotInitialised(
                    "the projection tables are missing: run `provisioner db init` first"
                )
            self.setup()  # SQLite and memory stores set themselves up

    def _registry(self, cur: Any, name: str, lock: str = "") -> dict[str, Any]:
        p = self.dialect.p
        lock = lock if self.dialect.postgres else ""
        entry = one(cur, f"SELECT * FROM {REGISTRY} WHERE name = {p} {lock}", name)
        if entry is None:
            raise ViewsNotInitialised(
                f"projection {name} is not set up: run `provisioner db init` first"
            )
        return dict(entry)

    # The ViewStore port.

    def position(self, proj: Projection, copy: str | None = None) -> tuple[str, int]:
        p = self.dialect.p
        with self._tx(immediate=False) as cur:
            if copy is None:
                copy = str(self._registry(cur, proj.name)["live"])
            found = one(cur, f"SELECT position FROM {POSITIONS} WHERE copy = {p}", copy)
        if found is None:
            raise ViewsNotInitialised(f"copy {copy} has no position: was it dropped?")
        return copy, int(found["position"])

    @contextmanager
    def live_batch(self, proj: Projection) -> Iterator[SqlBatch]:
        with self._tx() as cur:
            entry = self._registry(cur, proj.name, "FOR SHARE")
            yield SqlBatch(self.dialect, cur, proj, entry["live"])

    @contextmanager
    def copy_batch(self, proj: Projection, copy: str) -> Iterator[SqlBatch]:
        with self._tx() as cur:
            yield SqlBatch(self.dialect, cur, proj, copy)

    def begin_rebuild(self, proj: Projection) -> str:
        p = self.dialect.p
        with self._tx() as cur:
            entry = self._registry(cur, proj.name, "FOR UPDATE")
            if entry["building"]:
                return str(entry["building"])
            generation = entry["generation"] + 1
            copy = f"{proj.name}_g{generation}"
            cur.execute(f"DROP TABLE IF EXISTS {copy}")
            for statement in copy_ddl(self.dialect, proj, copy):
                cur.execute(statement)
            cur.execute(f"DELETE FROM {POSITIONS} WHERE copy = {p}", (copy,))
            cur.execute(f"INSERT INTO {POSITIONS} VALUES ({p}, 0)", (copy,))
            cur.execute(
                f"UPDATE {REGISTRY} SET building = {p}, generation = {p} WHERE name = {p}",
                (copy, generation, proj.name),
            )
        return copy

    @contextmanager
    def switch(self, proj: Projection, copy: str) -> Iterator[SqlBatch]:
        p = self.dialect.p
        with self._tx() as cur:
            entry = self._registry(cur, proj.name, "FOR UPDATE")
            if entry["building"] != copy:
                raise PositionConflict(f"{copy} is no longer being built for {proj.name}")
            yield SqlBatch(self.dialect, cur, proj, copy)
            old = entry["live"]
            cur.execute(
                f"UPDATE {REGISTRY} SET live = {p}, building = NULL WHERE name = {p}",
                (copy, proj.name),
            )
            self._point_view(cur, proj.name, copy)
            self._set_version(cur, proj)
            cur.execute(f"DROP TABLE {old}")
            cur.execute(f"DELETE FROM {POSITIONS} WHERE copy = {p}", (old,))

    # Status and queries.

    def status(self, source: Any) -> list[dict[str, Any]]:
        """Per projection: live copy, position, head of the log, events behind, rows."""
        head = source.head()
        report = []
        with self._tx(immediate=False) as cur:
            positions = {
                r["copy"]: r["position"] for r in all_rows(cur, f"SELECT * FROM {POSITIONS}")
            }
            for proj in PROJECTIONS.values():
                entry = self._registry(cur, proj.name)
                # Through the view: a switch may drop the copy named in `entry`.
                rows = one(cur, f"SELECT count(*) AS n FROM {proj.name}")["n"]
                position = positions.get(entry["live"], 0)
                item = {
                    "projection": proj.name,
                    "copy": entry["live"],
                    "position": position,
                    "head": head,
                    "behind": source.count(position, proj.topics),
                    "rows": rows,
                    "rebuilding": entry["building"],
                }
                if entry["building"]:
                    item["rebuild_position"] = positions.get(entry["building"], 0)
                report.append(item)
        return report

    def count_events(self, table: str, after: int, topics: Sequence[str]) -> int:
        """How many events of these topics follow `after` in the event table."""
        p = self.dialect.p
        marks = ", ".join([p] * len(topics))
        column = "notification_id" if self.dialect.postgres else "rowid"
        sql = f"SELECT count(*) AS n FROM {table} WHERE {column} > {p} AND topic IN ({marks})"
        with self._tx(immediate=False) as cur:
            return int(one(cur, sql, after, *topics)["n"])

    def scalar(self, sql: str, *params: Any) -> Any:
        """The one value a read-only query returns (its column named `n`; `?` marks)."""
        with self._tx(immediate=False) as cur:
            return one(cur, sql.replace("?", self.dialect.p), *params)["n"]

    def rows(
        self,
        proj: Projection,
        where: str = "",
        params: Sequence[Any] = (),
        *,
        order: str = "",
        limit: int | None = None,
    ) -> list[Row]:
        """Rows of the live copy (through its view), decoded."""
        sql = f"SELECT * FROM {proj.name}"
        if where:
            sql += f" WHERE {where}"
        if order:
            sql += f" ORDER BY {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._tx(immediate=False) as cur:
            found = all_rows(cur, sql.replace("?", self.dialect.p), *params)
        return [self.dialect.decode(proj, row) for row in found]


def init_read_models(url: str) -> None:
    """Create the projection tables (part of `provisioner db init`)."""
    with SqlViewStore(url) as store:
        store.setup()


def memory_views_url() -> str:
    """Read models for a memory:// event store: an in-process SQLite database."""
    return f"memory://{uuid.uuid4().hex}"
