"""`brand_workspaces`: brand -> lifecycle, provisioning status, bound workspace,
current attempt, its state and failure reason, when a deactivated brand's
workspace is to be emptied (and the gateway's words if it refused that for
good), updated at. What the host platform reads to
answer "which workspace is brand B bound to?".

`status` is decided by `brand_status` from the lifecycle, the bound workspace
and the current attempt's state; the audit trail (which replays the
aggregates) decides with the same function, so the two cannot disagree on what
a state means. The current attempt's own outcome is the `attempt_state` column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from eventsourcing.utils import get_topic

from domain.attempt import ENDED_BY
from domain.brand import ACTIVE, DEACTIVATED, Brand
from domain.policies import AttemptState, FailureReason
from projections.core import TEXT, TS, Index, Row, RowCache

_ATTEMPT_STATE = ENDED_BY
_BRAND_EVENTS = (
    Brand.Registered,
    Brand.AttemptBegun,
    Brand.WorkspaceBound,
    Brand.DecommissionStarted,
    Brand.DecommissionRefused,
    Brand.WorkspaceUnbound,
    Brand.Deactivated,
    Brand.Reactivated,
)


def brand_status(
    lifecycle: str,
    attempt_state: str | None,
    workspace_id: str | None,
    failure_reason: str | None = None,
) -> str:
    """deactivated | ready | degraded | none | pending | failed | cancelled.

    A deactivated brand reads `deactivated` from its `Deactivated` event on (its
    workspace, if still bound, must not be used). An active brand with a bound
    workspace reads `ready` until it is unbound, whatever its current attempt (a
    pending or cancelled re-confirm, or one that failed for want of an answer,
    does not hide it), except `degraded` when the current attempt failed because
    the gateway reported the bound workspace terminal (`failed`, `error`,
    `invalid subscription`): the workspace is kept, but not to be used.
    Otherwise the current attempt's state decides: a superseded one is about to
    be followed by its successor (pending); a promoted one whose workspace was
    unbound since leaves the brand with none.
    """
    if lifecycle == DEACTIVATED:
        return "deactivated"
    if workspace_id is not None:
        broken = (attempt_state, failure_reason) == (
            AttemptState.FAILED.value,
            FailureReason.TERMINAL_STATUS.value,
        )
        return "degraded" if broken else "ready"
    if attempt_state is None:
        return "none"
    state = AttemptState(attempt_state)
    if state in (AttemptState.PENDING, AttemptState.SUPERSEDED):
        return "pending"
    if state is AttemptState.PROMOTED:
        return "none"
    return state.value


class BrandWorkspaces:
    name = "brand_workspaces"
    # Raised whenever what a row means changes; an older live copy is rebuilt.
    # 2: `status` reads `deactivated` from `Deactivated`, `ready` while bound.
    # 3: `degraded` while bound after a re-confirm saw a terminal status; `failure_reason`.
    # 4: `purge_at`, the end of a deactivated brand's retention window.
    # 5: `emptying_refused`, the gateway's refusal to empty a deactivated brand's workspace.
    version = 5
    key = "id"  # the Brand aggregate's id; `brand_id` is the host platform's id
    index = "attempt_id"
    columns: ClassVar[dict[str, str]] = {
        "id": TEXT,
        "brand_id": TEXT,
        "title": TEXT,
        "lifecycle": TEXT,
        "status": TEXT,
        "workspace_id": TEXT,
        "attempt_id": TEXT,
        "attempt_state": TEXT,
        "failure_reason": TEXT,  # the current attempt's, once it failed
        "purge_at": TS,  # deactivated: when its bound workspace is emptied
        "emptying_refused": TEXT,  # the gateway refused that for good: its words
        "updated_at": TS,
    }
    indexes: tuple[Index, ...] = (
        Index("workspace", ("workspace_id",), unique=True),
        Index("brand", ("brand_id",), unique=True),
        Index("attempt", ("attempt_id",)),
    )
    topics = tuple(get_topic(cls) for cls in (*_BRAND_EVENTS, *_ATTEMPT_STATE))

    def prefetch(self, events: Sequence[Any], rows: RowCache) -> dict[str, set[str]]:
        brands = {rows.key_of(e) for e in events if isinstance(e, _BRAND_EVENTS)}
        attempts = {rows.key_of(e) for e in events if type(e) in _ATTEMPT_STATE}
        return {"id": brands, "attempt_id": attempts}

    def apply(self, event: Any, rows: RowCache) -> None:
        row: Row | None
        if isinstance(event, Brand.Registered):
            row = {
                "id": rows.key_of(event),
                "brand_id": event.brand_id,
                "title": event.title,
                "lifecycle": ACTIVE,
                "workspace_id": None,
                "attempt_id": None,
                "attempt_state": None,
                "failure_reason": None,
                "purge_at": None,
                "emptying_refused": None,
            }
        elif type(event) in _ATTEMPT_STATE:
            row = rows.by_index(rows.key_of(event))
            if row is None:
                return  # not (or no longer) its brand's current attempt
            row["attempt_state"] = _ATTEMPT_STATE[type(event)].value
            row["failure_reason"] = getattr(event, "reason", None)
        else:
            row = rows.get(rows.key_of(event))
            if row is None:
                raise LookupError(
                    f"{type(event).__name__} of unregistered brand {event.originator_id}"
                )
            self._apply_brand_event(event, row)
        row["status"] = brand_status(
            row["lifecycle"], row["attempt_state"], row["workspace_id"], row["failure_reason"]
        )
        row["updated_at"] = event.timestamp
        rows.put(row)

    @staticmethod
    def _apply_brand_event(event: Any, row: Row) -> None:
        if isinstance(event, Brand.AttemptBegun):
            row["attempt_id"] = str(event.attempt_id)
            row["attempt_state"] = AttemptState.PENDING.value
            row["failure_reason"] = None
            row["title"] = event.title
        elif isinstance(event, Brand.WorkspaceBound):
            row["workspace_id"] = event.workspace_id
        elif isinstance(event, Brand.DecommissionRefused):
            row["emptying_refused"] = event.message
        elif isinstance(event, Brand.WorkspaceUnbound):
            row["workspace_id"] = row["purge_at"] = row["emptying_refused"] = None
        elif isinstance(event, Brand.Deactivated):
            row["lifecycle"] = DEACTIVATED
            row["purge_at"] = event.purge_at
            row["emptying_refused"] = None
        elif isinstance(event, Brand.Reactivated):
            row["lifecycle"] = ACTIVE
            row["purge_at"] = row["emptying_refused"] = None
