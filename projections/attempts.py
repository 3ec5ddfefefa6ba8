"""`attempts`: attempt -> brand, state, hops used, candidate, provenance, started,
finished, next hop due, last error (safe text), releases owed and done. What
"stuck", "failed since" and "every attempt of brand B" queries read.

Definitions:
- `hops_used`: hops that ran (a hop n that did work, or hop n+1 scheduled).
- `next_hop`: the hop the attempt expects next (what a re-published hop carries).
- `next_hop_due`: while pending, when the next hop may run (the start for hop
  0); None once terminal. Stuck = pending with this overdue.
- `last_error`: the last status or failure message the attempt recorded.
- `create_unresolved`: 1 while a create was requested and nothing came of it
  yet (the workspace may still appear upstream: ours to find and release).
- `create_lost`: 1 once an earlier create was given up unconfirmed (a new
  create requested, or a workspace adopted, after its grace): what it made may
  still appear upstream, whatever later creates did; searched for after the end.
- `release_owed` / `released`: how many created workspaces are owed a release
  (decided by `domain.policies.owed_releases`, as the aggregate decides) and
  how many were released or handed over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from eventsourcing.utils import get_topic

from domain.attempt import ENDED_BY
from domain.attempt import ProvisioningAttempt as A
from domain.policies import AttemptState, FailureReason, owed_releases
from projections.core import INT, LIST, TEXT, TS, Index, Row, RowCache

_TERMINAL = ENDED_BY
_EVENTS = (
    A.Started,
    A.CreateRequested,
    A.CreateRefused,
    A.SurplusCreated,
    A.CandidateAccepted,
    A.CandidateDropped,
    A.HopScheduled,
    *_TERMINAL,
    A.CandidateReleased,
    A.CandidateHandedOver,
    A.ReleaseRefused,
)

# Only these can change what is owed (the rest leave every input of the rule alone).
_CHANGES_OWED = frozenset(
    {
        A.Started,
        A.SurplusCreated,
        A.CandidateAccepted,
        A.CandidateDropped,
        *_TERMINAL,
        A.CandidateReleased,
        A.CandidateHandedOver,
        A.ReleaseRefused,
    }
)


# Rows the reconciler may send a release for (it also bounds all but the first
# by the end time): a partial index keeps the many promoted rows out of its scan.
OWING = (
    "release_owed > 0 OR create_unresolved = 1 OR create_lost = 1 OR failure_reason = 'exhausted'"
)


class Attempts:
    name = "attempts"
    key = "attempt_id"
    columns: ClassVar[dict[str, str]] = {
        "attempt_id": TEXT,
        "brand_id": TEXT,
        "title": TEXT,
        "state": TEXT,
        "hops_used": INT,
        "next_hop": INT,
        "candidate_id": TEXT,
        "provenance": TEXT,
        "failure_reason": TEXT,
        "last_error": TEXT,
        "started_at": TS,
        "finished_at": TS,
        "next_hop_due": TS,
        "created_ids": LIST,
        "released_ids": LIST,
        "release_owed": INT,
        "released": INT,
        "create_unresolved": INT,
        "create_lost": INT,
        "updated_at": TS,
    }
    indexes: tuple[Index, ...] = (
        Index("brand", ("brand_id", "started_at")),
        Index("state", ("state", "started_at")),
        Index("due", ("next_hop_due",), where="state = 'pending'"),
        Index("owing", ("updated_at",), where=OWING),
    )
    topics = tuple(get_topic(cls) for cls in _EVENTS)
    version = 2  # 2: create_lost, the owing index

    def prefetch(self, events: Sequence[Any], rows: RowCache) -> dict[str, set[str]]:
        started = {e.originator_id for e in events if isinstance(e, A.Started)}
        return {"attempt_id": {rows.key_of(e) for e in events if e.originator_id not in started}}

    def apply(self, event: Any, rows: RowCache) -> None:
        if isinstance(event, A.Started):
            row = self._started(event, rows.key_of(event))
        else:
            found = rows.get(rows.key_of(event))
            if found is None:
                raise LookupError(
                    f"{type(event).__name__} of unknown attempt {event.originator_id}"
                )
            row = found
            self._change(event, row)
        if type(event) in _CHANGES_OWED:
            row["release_owed"] = len(
                owed_releases(
                    row["created_ids"],
                    row["released_ids"],
                    row["candidate_id"],
                    AttemptState(row["state"]),
                    FailureReason(row["failure_reason"]) if row["failure_reason"] else None,
                )
            )
            row["released"] = len(row["released_ids"])
        row["updated_at"] = event.timestamp
        rows.put(row)

    @staticmethod
    def _started(event: Any, key: str) -> Row:
        existing = event.existing_workspace_id
        return {
            "attempt_id": key,
            "brand_id": event.brand_id,
            "title": event.title,
            "state": AttemptState.PENDING.value,
            "hops_used": 0,
            "next_hop": 0,
            "candidate_id": existing,
            "provenance": "existing" if existing else None,
            "failure_reason": None,
            "last_error": None,
            "started_at": event.timestamp,
            "finished_at": None,
            "next_hop_due": event.timestamp,
            "created_ids": [],
            "released_ids": [],
            "create_unresolved": 0,
            "create_lost": 0,
        }

    @staticmethod
    def _note_lost(event: Any, row: Row) -> None:
        """An unconfirmed create given up: a new create requested, or a workspace adopted."""
        gave_up = isinstance(event, A.CreateRequested) or (
            isinstance(event, A.CandidateAccepted) and event.provenance == "adopted"
        )
        if gave_up and row["create_unresolved"]:
            row["create_lost"] = 1

    @staticmethod
    def _change(event: Any, row: Row) -> None:
        hop = getattr(event, "hop", None)
        if hop is not None:
            ran = hop if isinstance(event, A.HopScheduled) else hop + 1
            row["hops_used"] = max(row["hops_used"], ran)
        Attempts._note_lost(event, row)
        if isinstance(event, A.CreateRequested):
            row["create_unresolved"] = 1
        elif isinstance(event, A.CreateRefused):
            row["create_unresolved"] = 0
        elif isinstance(event, A.SurplusCreated):
            row["created_ids"] = [*row["created_ids"], event.workspace_id]
            row["create_unresolved"] = 0
        elif isinstance(event, A.CandidateAccepted):
            row["candidate_id"] = event.workspace_id
            row["provenance"] = event.provenance
            row["create_unresolved"] = 0
            if event.provenance == "created":
                row["created_ids"] = [*row["created_ids"], event.workspace_id]
        elif isinstance(event, A.CandidateDropped):
            row["candidate_id"] = None
            row["provenance"] = None
            row["last_error"] = event.status or None
        elif isinstance(event, A.HopScheduled):
            row["next_hop"] = event.hop
            row["next_hop_due"] = event.not_before
            row["last_error"] = event.last_status or None
        elif type(event) in _TERMINAL:
            row["state"] = _TERMINAL[type(event)].value
            row["finished_at"] = event.timestamp
            row["next_hop_due"] = None
            if isinstance(event, A.Failed):
                row["failure_reason"] = event.reason
                row["last_error"] = event.message or None
        elif isinstance(event, (A.CandidateReleased, A.CandidateHandedOver, A.ReleaseRefused)):
            row["released_ids"] = [*row["released_ids"], event.workspace_id]  # none owed
            if isinstance(event, A.CandidateReleased):
                row["create_unresolved"] = 0
