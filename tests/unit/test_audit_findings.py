"""The recorded findings of the scheduled upstream audit (SQLite): each audit of a
parent replaces that parent's rows, a clean audit is recorded as clean, and a write
that fails is logged once and never stops the schedule."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from domain.upstream_audit import Action, Audit, Finding, Kind
from infrastructure.views.audit_findings import FindingsWriter, RecordedFinding, read_audits
from infrastructure.views.connection import ViewConnection
from worker import audit_schedule
from worker.audit_schedule import AuditSchedule

ORPHAN = Finding(Kind.ORPHAN, "org-a", "ws-1", "made by attempt a1's unresolved create",
                 "<b>Co</b>", ("brand-1",), "a1", status="ready", projects=0,
                 action=Action.RELEASE)  # fmt: skip
FOREIGN = Finding(Kind.FOREIGN, "org-a", "ws-2", "someone else's", "Co", status="ready")
CLEAN = {"bound_ready": 1, "bound_settling": 0, "released_empty": 0}


def read(url: str) -> dict[str, Any]:
    with ViewConnection(url) as conn:
        return {a.parent_id: a for a in read_audits(conn)}


def test_nothing_is_read_before_the_first_audit_is_recorded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    assert read(url) == {}


def test_each_audit_of_a_parent_replaces_its_findings_and_a_clean_one_says_when(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    times = iter([100.0, 200.0])
    writer = FindingsWriter(url, clock=lambda: next(times))

    assert writer.write([Audit("org-a", (ORPHAN, FOREIGN), CLEAN), Audit("org-b", (), CLEAN)])
    first = read(url)
    assert writer.write([Audit("org-a", (), CLEAN)])
    second = read(url)

    assert first["org-a"].audited_at == 100.0
    assert first["org-a"].findings == (
        RecordedFinding("orphan", "ws-1", "made by attempt a1's unresolved create", ("brand-1",),
                        "a1", {"title": "<b>Co</b>", "status": "ready", "projects": 0,
                               "action": "release"}),
        RecordedFinding("foreign", "ws-2", "someone else's", (), None,
                        {"title": "Co", "status": "ready"}),
    )  # fmt: skip
    assert first["org-a"].problems == 1  # foreign is information
    assert (second["org-a"].audited_at, second["org-a"].findings) == (200.0, ())
    assert (second["org-b"].audited_at, second["org-b"].findings) == (100.0, ())  # not audited


def test_the_schedule_records_what_it_audited_and_a_failed_write_never_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(audit_schedule, "parents_on_record", lambda _svc: ["org-a", "org-x"])
    monkeypatch.setattr("worker.health.metrics.observe_audit", lambda _counts: None)

    def audit(_svc: Any, parent: str) -> Audit:
        if parent == "org-x":
            raise ConnectionError("the gateway is down")
        return Audit(parent, (ORPHAN,), CLEAN)

    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    recorded = AuditSchedule(None, 60, audit=audit, findings=FindingsWriter(url))  # type: ignore[arg-type]
    broken = FindingsWriter(f"sqlite:///{tmp_path / 'no-such-dir' / 'events.sqlite'}")
    failing = AuditSchedule(None, 60, audit=audit, findings=broken)  # type: ignore[arg-type]

    assert recorded.once() is False  # org-x failed: not recorded, org-a is
    with caplog.at_level(logging.DEBUG, "provisioner.reconciler"):
        failing.once()
        failing.once()

    assert list(read(url)) == ["org-a"]
    assert [f.kind for f in read(url)["org-a"].findings] == ["orphan"]
    lost = [r for r in caplog.records if "findings not recorded" in r.getMessage()]
    assert [r.levelno for r in lost] == [logging.WARNING, logging.DEBUG]
    assert failing.runs == 2
