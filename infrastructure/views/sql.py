"""The SQL the read models are written with: what differs between PostgreSQL and
SQLite (`Dialect`), a projection copy's tables and indexes (`copy_ddl`), and
one batch's reads, upserts (COPY-staged on PostgreSQL for many rows) and
position compare-and-set (`SqlBatch`). `infrastructure/views/store.py` holds the
store that opens transactions and hands batches out.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from infrastructure.store.eventstore import DatabaseNotInitialised
from projections.core import INT, LIST, TS, PositionConflict, Projection, Row

POSITIONS = "provisioner_projection_positions"
COPY_FROM = 64  # rows per batch from which PostgreSQL writes go through COPY


class ViewsNotInitialised(DatabaseNotInitialised):
    """The projection tables do not exist yet."""


def one(cur: Any, sql: str, *params: Any) -> Any:
    row = cur.execute(sql, params).fetchone()
    if row is None:
        return None
    return dict(row)


def all_rows(cur: Any, sql: str, *params: Any) -> list[dict[str, Any]]:
    return [dict(row) for row in cur.execute(sql, params).fetchall()]


class Dialect:
    """What differs between PostgreSQL and SQLite: placeholders, types, values."""

    postgres: bool

    def __init__(self, postgres: bool) -> None:
        self.postgres = postgres
        self.p = "%s" if postgres else "?"

    def sql_type(self, kind: str) -> str:
        if kind == TS:
            return "timestamptz" if self.postgres else "text"
        if kind == INT:
            return "bigint" if self.postgres else "integer"
        return "text"

    def converts(self, kind: str) -> bool:
        """Whether values of this kind need `to_db` (the rest pass as they are)."""
        return kind == LIST or (kind == TS and not self.postgres)

    def to_db(self, kind: str, value: Any) -> Any:
        if value is None:
            return None
        if kind == LIST:
            return json.dumps(value)
        if kind == TS and not self.postgres:
            # One offset for every stored time, so that text order is time order.
            return value.astimezone(UTC).isoformat(timespec="microseconds")
        return value

    def decode(self, proj: Projection, row: dict[str, Any]) -> Row:
        return {name: self.from_db(kind, row[name]) for name, kind in proj.columns.items()}

    def from_db(self, kind: str, value: Any) -> Any:
        if value is None:
            return None
        if kind == LIST:
            return json.loads(value)
        if kind == TS and not self.postgres:
            return datetime.fromisoformat(value)
        return value


def copy_ddl(dialect: Dialect, proj: Projection, copy: str) -> list[str]:
    columns = ", ".join(
        f"{name} {dialect.sql_type(kind)}" + (" PRIMARY KEY" if name == proj.key else "")
        for name, kind in proj.columns.items()
    )
    statements = [f"CREATE TABLE IF NOT EXISTS {copy} ({columns})"]
    for index in proj.indexes:
        cols = ", ".join(index.columns)
        name = f"{copy}_{index.suffix}"
        if index.unique and dialect.postgres:
            # Deferred: within one batch a workspace may pass from one row to another.
            statements.append(
                f"ALTER TABLE {copy} ADD CONSTRAINT {name} UNIQUE ({cols}) "
                "DEFERRABLE INITIALLY DEFERRED"
            )
            continue
        unique = "UNIQUE " if index.unique else ""
        where = f" WHERE {index.where}" if index.where else ""
        statements.append(f"CREATE {unique}INDEX IF NOT EXISTS {name} ON {copy} ({cols}){where}")
    return statements


class SqlBatch:
    def __init__(self, dialect: Dialect, cur: Any, proj: Projection, copy: str) -> None:
        self.dialect = dialect
        self.cur = cur
        self.proj = proj
        self.copy = copy
        p = dialect.p
        found = one(cur, f"SELECT position FROM {POSITIONS} WHERE copy = {p}", copy)
        if found is None:
            raise ViewsNotInitialised(f"copy {copy} has no position: was it dropped?")
        self.position: int = int(found["position"])
        cols = list(proj.columns)
        updates = ", ".join(f"{c} = excluded.{c}" for c in cols if c != proj.key)
        self._upsert = (
            f"INSERT INTO {copy} ({', '.join(cols)}) VALUES ({', '.join([p] * len(cols))}) "
            f"ON CONFLICT ({proj.key}) DO UPDATE SET {updates}"
        )
        self._upsert_from = (
            f"INSERT INTO {copy} ({', '.join(cols)}) SELECT {', '.join(cols)} FROM {{stage}} "
            f"ON CONFLICT ({proj.key}) DO UPDATE SET {updates}"
        )
        self._unique = [c for i in proj.indexes if i.unique for c in i.columns]

    def load(self, column: str, values: set[str]) -> list[Row]:
        found: list[dict[str, Any]] = []
        if self.dialect.postgres:
            sql = f"SELECT * FROM {self.copy} WHERE {column} = ANY(%s)"
            found = all_rows(self.cur, sql, list(values))
        else:
            ordered = list(values)
            for start in range(0, len(ordered), 500):
                chunk = ordered[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                sql = f"SELECT * FROM {self.copy} WHERE {column} IN ({marks})"
                found += all_rows(self.cur, sql, *chunk)
        return [self.dialect.decode(self.proj, row) for row in found]

    def write(self, rows: list[Row]) -> None:
        if not rows:
            return
        if not self.dialect.postgres:
            self._release_unique_values(rows)
        to_db = self.dialect.to_db
        names = list(self.proj.columns)
        convert = [
            (i, kind)
            for i, kind in enumerate(self.proj.columns.values())
            if self.dialect.converts(kind)
        ]
        params = []
        for row in rows:
            values = [row.get(name) for name in names]
            for i, kind in convert:
                values[i] = to_db(kind, values[i]) if values[i] is not None else None
            params.append(tuple(values))
        if self.dialect.postgres and len(params) >= COPY_FROM:
            self._copy_upsert(params)
        else:
            self.cur.executemany(self._upsert, params)

    def _release_unique_values(self, rows: list[Row]) -> None:
        """SQLite checks a unique index row by row, not at commit: a workspace passing
        from one stored row to another within the batch would collide with the
        value the other row still holds. Clearing the batch's rows' unique values
        first (in the same transaction) lets the upserts set them in any order."""
        if not self._unique:
            return
        keys = [row[self.proj.key] for row in rows]
        clear = ", ".join(f"{column} = NULL" for column in self._unique)
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            marks = ", ".join("?" * len(chunk))
            self.cur.execute(
                f"UPDATE {self.copy} SET {clear} WHERE {self.proj.key} IN ({marks})", chunk
            )

    def _copy_upsert(self, params: list[tuple[Any, ...]]) -> None:
        """Many rows: COPY them into a session-local staging table, upsert from there.

        Several times cheaper for the server than one upsert statement per row.
        """
        stage = f"stage_{self.copy}"
        cols = ", ".join(self.proj.columns)
        # Dropped at commit; emptied first, since one transaction (the switch)
        # may write several batches.
        self.cur.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {stage} "
            f"(LIKE {self.copy} INCLUDING DEFAULTS) ON COMMIT DROP"
        )
        self.cur.execute(f"TRUNCATE {stage}")
        with self.cur.copy(f"COPY {stage} ({cols}) FROM STDIN") as copy:
            for row in params:
                copy.write_row(row)
        self.cur.execute(self._upsert_from.format(stage=stage))

    def advance(self, to: int) -> None:
        p = self.dialect.p
        result = self.cur.execute(
            f"UPDATE {POSITIONS} SET position = {p} WHERE copy = {p} AND position = {p}",
            (to, self.copy, self.position),
        )
        if result.rowcount != 1:
            raise PositionConflict(
                f"{self.copy} moved past {self.position} meanwhile (another runner?)"
            )
        self.position = to
