"""The last findings of each parent's scheduled upstream audit, in the database beside
the heartbeats, for the web view's `/audit` page (which never calls the gateway).

Two tables, created on the first write (under the schema lock on PostgreSQL), so a
database set up before them needs nothing done:

- `provisioner_audits`: one row per parent audited, when (epoch seconds of the
  writer's clock) and how many findings and problems; "clean at T" is a row with 0;
- `provisioner_audit_findings`: that audit's findings, in the audit's order
  (`ordinal`), their evidence as JSON (title, upstream status, projects, and the
  action `provisioner audit --fix` would take, if any).

Each completed audit of a parent replaces that parent's rows in one transaction. A
write that fails is logged (once, until one succeeds again) and never stops the
reconciler: the page shows the last audit that was recorded, and when.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from domain.upstream_audit import INFORMATION, Action, Audit, Finding
from infrastructure.store.eventstore import SCHEMA_LOCK_KEY
from infrastructure.views.connection import ViewConnection

log = logging.getLogger("provisioner.reconciler")
AUDITS = "provisioner_audits"
FINDINGS = "provisioner_audit_findings"
COLUMNS = "parent_id, ordinal, kind, workspace_id, brand_ids, attempt_id, detail, evidence"


@dataclass(frozen=True, slots=True)
class RecordedFinding:
    kind: str
    workspace_id: str
    detail: str
    brand_ids: tuple[str, ...] = ()
    attempt_id: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)  # title, status, projects, action

    @property
    def is_problem(self) -> bool:
        return self.kind not in {k.value for k in INFORMATION}


@dataclass(frozen=True, slots=True)
class RecordedAudit:
    parent_id: str
    audited_at: float  # epoch seconds
    findings: tuple[RecordedFinding, ...] = ()

    @property
    def problems(self) -> int:
        return sum(1 for f in self.findings if f.is_problem)


def _evidence(finding: Finding) -> str:
    shown = {
        "title": finding.title,
        "status": finding.status,
        "projects": finding.projects,
        "action": None if finding.action is Action.NONE else finding.action.value,
        "to do": finding.advice if finding.is_problem else None,
    }
    return json.dumps({k: v for k, v in shown.items() if v is not None})


def create(conn: ViewConnection) -> None:
    number = "double precision" if conn.dialect.postgres else "real"
    with conn._tx() as cur:  # tables of their own, on the read models' connection
        if conn.dialect.postgres:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_KEY,))
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {AUDITS} (parent_id text PRIMARY KEY, "
            f"audited_at {number} NOT NULL, findings integer NOT NULL, problems integer NOT NULL)"
        )
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {FINDINGS} (parent_id text NOT NULL, "
            "ordinal integer NOT NULL, kind text NOT NULL, workspace_id text NOT NULL, "
            "brand_ids text NOT NULL, attempt_id text, detail text NOT NULL, "
            "evidence text NOT NULL, PRIMARY KEY (parent_id, ordinal))"
        )


def record(conn: ViewConnection, audit: Audit, audited_at: float) -> None:
    """Replace the parent's audit and findings with `audit`'s, in one transaction."""
    p = conn.dialect.p
    with conn._tx() as cur:
        cur.execute(f"DELETE FROM {FINDINGS} WHERE parent_id = {p}", (audit.parent_id,))
        cur.execute(f"DELETE FROM {AUDITS} WHERE parent_id = {p}", (audit.parent_id,))
        cur.execute(
            f"INSERT INTO {AUDITS} (parent_id, audited_at, findings, problems) "
            f"VALUES ({p}, {p}, {p}, {p})",
            (audit.parent_id, audited_at, len(audit.findings), len(audit.problems)),
        )
        marks = ", ".join([p] * 8)
        for ordinal, f in enumerate(audit.findings):
            cur.execute(
                f"INSERT INTO {FINDINGS} ({COLUMNS}) VALUES ({marks})",
                (
                    audit.parent_id,
                    ordinal,
                    f.kind.value,
                    f.workspace_id,
                    json.dumps(list(f.brand_ids)),
                    f.attempt_id,
                    f.detail,
                    _evidence(f),
                ),
            )


def _exists(cur: Any, postgres: bool, table: str) -> bool:
    if postgres:
        row = cur.execute("SELECT to_regclass(%s) AS n", (table,)).fetchone()
        return row is not None and dict(row)["n"] is not None
    query = "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?"
    return cur.execute(query, (table,)).fetchone() is not None


def read_audits(conn: ViewConnection) -> list[RecordedAudit]:
    """Every parent's last recorded audit, by parent id; none before the first write."""
    with conn._tx(immediate=False) as cur:
        if not _exists(cur, conn.dialect.postgres, AUDITS):
            return []
        audits = cur.execute(
            f"SELECT parent_id, audited_at FROM {AUDITS} ORDER BY parent_id"
        ).fetchall()
        rows = cur.execute(
            f"SELECT {COLUMNS} FROM {FINDINGS} ORDER BY parent_id, ordinal"
        ).fetchall()
    found: dict[str, list[RecordedFinding]] = {}
    for row in map(dict, rows):
        brands, evidence = json.loads(row["brand_ids"]), json.loads(row["evidence"])
        finding = RecordedFinding(
            row["kind"],
            row["workspace_id"],
            row["detail"],
            tuple(brands),
            row["attempt_id"],
            evidence,
        )
        found.setdefault(row["parent_id"], []).append(finding)
    return [
        RecordedAudit(a["parent_id"], float(a["audited_at"]), tuple(found.get(a["parent_id"], ())))
        for a in map(dict, audits)
    ]


class FindingsWriter:
    """Records each completed audit of a parent in the database at `url` (a
    connection opened for the write and closed after: audits are minutes apart)."""

    def __init__(self, url: str, *, clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self.clock = clock
        self._failing = False

    def write(self, audits: Iterable[Audit]) -> bool:
        """Record every audit given; False (logged, never raised) if that failed."""
        try:
            with ViewConnection(self.url, wait_s=0) as conn:
                create(conn)
                at = self.clock()
                for audit in audits:
                    record(conn, audit, at)
        except Exception as exc:  # noqa: BLE001 - the page shows the last one recorded
            level = logging.DEBUG if self._failing else logging.WARNING
            log.log(level, "upstream audit findings not recorded for the web view: %s", exc)
            self._failing = True
            return False
        if self._failing:
            log.info("upstream audit findings recorded again")
            self._failing = False
        return True
