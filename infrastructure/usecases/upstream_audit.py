"""The upstream audit's use case: read a parent's family, the projects that matter
and the log, classify (`domain.upstream_audit`), and with `fix` act on what is
provably ours. Every gateway call goes through the service's gateway port (paced
by the fleet's limiter); the family is read before the log, so a create that made
a child the family lists is on record in the read that follows it.

    parents_on_record(svc)     every parent an attempt on record names
    audit_parent(svc, parent)  the audit of one parent (read-only)
    fix(svc, audit)            release orphans and owed workspaces through the release
                               use case; provision again brands whose workspace is gone
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import project_aggregate
from eventsourcing.utils import get_topic

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.claim import WorkspaceClaim
from domain.errors import ProvisionerError
from domain.ids import brand_aggregate_id, claim_aggregate_id
from domain.ownership import same_title
from domain.ports import FamilyMember, GatewayError, TransientGatewayError, WorkspaceGone
from domain.upstream_audit import (
    Action,
    AttemptRecord,
    Audit,
    BrandRecord,
    ClaimRecord,
    Finding,
    Kind,
    ParentRecord,
    Upstream,
    classify,
    needs_projects,
    on_record,
)
from domain.waits import AUDIT_READ_TRIES, audit_pause_s
from infrastructure.usecases import commands, releases
from infrastructure.usecases.reads import ServiceReads
from infrastructure.usecases.retry import retry_on_conflict

log = logging.getLogger("provisioner.audit")
STARTED = get_topic(ProvisioningAttempt.Started)
PAGE = 1000  # notifications, or aggregates, per read
UNBOUND_GONE = "gone upstream (provisioner audit --fix)"
T = TypeVar("T")


def _asked(read: Callable[[], T], sleep: Callable[[float], None] = time.sleep) -> T:
    """`read()`, asked again while the gateway does not answer (at most
    `AUDIT_READ_TRIES`, after `audit_pause_s`: domain/waits.py)."""
    for n in range(AUDIT_READ_TRIES):
        try:
            return read()
        except TransientGatewayError as exc:
            if n + 1 == AUDIT_READ_TRIES:
                raise
            sleep(audit_pause_s(n, exc.retry_after_s))
    raise AssertionError("unreachable")


def _started(svc: ServiceReads, after: int = 0) -> Iterator[tuple[int, UUID, str]]:
    """Every attempt's start after notification `after`: (position, attempt id, parent)."""
    recorder, to_event = svc.app.recorder, svc.app.mapper.to_domain_event
    start = after + 1
    while notes := recorder.select_notifications(start, PAGE, topics=[STARTED]):
        for note in notes:
            event: Any = to_event(note)
            yield note.id, event.originator_id, event.parent_workspace_id
        start = notes[-1].id + 1


def parents_on_record(svc: ServiceReads) -> list[str]:
    """Every parent an attempt on record was started under, sorted."""
    return sorted({parent for _, _, parent in _started(svc)})


def _streams(svc: ServiceReads, ids: Iterable[UUID]) -> dict[UUID, list[Any]]:
    """The events of each aggregate, a page of aggregates per query where the
    recorder offers it (`select_events_of` on PostgreSQL)."""
    wanted = list(dict.fromkeys(ids))
    select_many = getattr(svc.app.recorder, "select_events_of", None)
    if select_many is None:
        return {i: list(svc.app.events.get(i)) for i in wanted}
    to_event = svc.app.mapper.to_domain_event
    found: dict[UUID, list[Any]] = {}
    for at in range(0, len(wanted), PAGE):
        for stored in select_many(wanted[at : at + PAGE]):
            found.setdefault(UUID(str(stored.originator_id)), []).append(to_event(stored))
    return found


def _attempt(a: ProvisioningAttempt) -> AttemptRecord:
    return AttemptRecord(
        attempt_id=str(a.id),
        brand_id=a.brand_id,
        parent_id=a.parent_workspace_id,
        title=a.title,
        pending=not a.is_terminal,
        creates=a.creates,
        orphan_search=a.orphan_search,
        created_ids=tuple(a.created_ids),
        released_ids=tuple(a.released_ids),
        owed=a.owed_releases,
        candidate_id=a.candidate_id,
        state=a.state.value,
        inferred_ids=tuple(a.inferred_ids),
    )


def _brand(events: list[Any]) -> BrandRecord:
    b: Any = project_aggregate(None, events)
    emptied = tuple(
        e.workspace_id
        for e in events
        if isinstance(e, Brand.WorkspaceUnbound) and e.reason == "decommissioned"
    )
    return BrandRecord(
        b.brand_id, b.parent_workspace_id, b.title, b.is_active, b.workspace_id, emptied
    )


def read_record(
    svc: ServiceReads, parent_id: str, attempt_ids: Iterable[UUID], family: list[FamilyMember]
) -> ParentRecord:
    """The attempts, their brands, and the claims of what they name and of the
    family's children titled as one of them."""
    attempts: list[Any] = [
        project_aggregate(None, events) for events in _streams(svc, attempt_ids).values() if events
    ]
    mine = tuple(_attempt(a) for a in attempts if isinstance(a, ProvisioningAttempt))
    brand_ids = {brand_aggregate_id(a.brand_id) for a in mine}
    brands = tuple(_brand(events) for events in _streams(svc, brand_ids).values() if events)
    titled = {m.id for t in {a.title for a in mine} for m in same_title(family, t, parent_id)}
    workspaces = sorted(on_record(ParentRecord(mine, brands)) | titled)
    by_id = {claim_aggregate_id(ws): ws for ws in workspaces}
    claims: dict[str, ClaimRecord] = {}
    for claim_id, events in _streams(svc, by_id).items():
        claim = project_aggregate(None, events) if events else None
        if isinstance(claim, WorkspaceClaim):
            ws = by_id[claim_id]
            claims[ws] = ClaimRecord(ws, claim.brand_id, claim.releasing_by is not None)
    return ParentRecord(mine, brands, claims)


def not_allowed(parent_id: str) -> Audit:
    """A parent on record that the service does not act under: not read, not touched."""
    why = (
        "attempts on record name this parent, which is not one the service acts under "
        "(PROVISIONER_PARENT_IDS): not audited, nothing touched"
    )
    return Audit(
        parent_id,
        (Finding(Kind.PARENT_NOT_ALLOWED, parent_id, parent_id, why),),
        {"bound_ready": 0, "bound_settling": 0, "released_empty": 0},
    )


def audit_parent(svc: ServiceReads, parent_id: str) -> Audit:
    """The audit of one parent: family first, then the log, then what it asks for. A
    parent the service does not act under is not read (`not_allowed`)."""
    if not svc.parent_allowed(parent_id):
        return not_allowed(parent_id)
    seen = list(_started(svc))
    read_at = svc.clock.now()
    family = _asked(lambda: svc.family(parent_id))
    after = seen[-1][0] if seen else 0
    seen += _started(svc, after)  # attempts begun while the family was read
    ids = [attempt_id for _, attempt_id, parent in seen if parent == parent_id]
    record = read_record(svc, parent_id, ids, family)
    listed = {m.id for m in family}
    statuses: dict[str, str | None] = {}
    for brand in record.brands:
        ws = brand.workspace_id
        if ws and brand.parent_id == parent_id and ws not in listed and not svc.is_parent(ws):
            statuses[ws] = _status(svc, ws)
    projects: dict[str, int] = {}
    for ws in sorted(needs_projects(parent_id, family, record)):
        count = _projects(svc, ws)
        if count is not None:
            projects[ws] = count
    upstream = Upstream(
        tuple(family), statuses, projects, read_at, window_s=svc.settings.inference_window_s
    )
    return classify(parent_id, upstream, record, svc.parents)


def _status(svc: ServiceReads, workspace_id: str) -> str | None:
    try:
        return _asked(lambda: svc.gateway.status(workspace_id))
    except WorkspaceGone:
        return None


def _projects(svc: ServiceReads, workspace_id: str) -> int | None:
    try:
        return len(_asked(lambda: svc.gateway.list_projects(workspace_id)))
    except WorkspaceGone:
        return None


@dataclass(frozen=True, slots=True)
class Fixed:
    finding: Finding
    done: str  # what was done, in a phrase


def fix(svc: ServiceReads, audit: Audit) -> list[Fixed]:
    """Act on the findings that have an action: each attempt's release once (it
    records what its unresolved create made, then empties it: `releases.release`),
    and for each active brand whose bound workspace is gone, its unbinding (on
    record) and a provision. Nothing else is touched, and never a parent."""
    done: list[Fixed] = []
    released: dict[str, tuple[str, ...] | str] = {}
    for finding in audit.findings:
        if finding.action is Action.RELEASE and finding.attempt_id:
            if finding.attempt_id not in released:
                released[finding.attempt_id] = _release(svc, finding.attempt_id)
            outcome = released[finding.attempt_id]
            if isinstance(outcome, str):
                done.append(Fixed(finding, outcome))
            elif finding.workspace_id in outcome:
                done.append(
                    Fixed(finding, f"recorded and released by attempt {finding.attempt_id}")
                )
            else:
                done.append(Fixed(finding, "not released: the release found it taken or busy"))
        elif finding.action is Action.PROVISION:
            done.append(Fixed(finding, _provision(svc, finding)))
    return done


def _release(svc: ServiceReads, attempt_id: str) -> tuple[str, ...] | str:
    try:
        emptied = releases.release(svc, UUID(attempt_id))
    except (GatewayError, ProvisionerError) as exc:
        return f"deferred: {exc}"
    log.warning("audit released attempt=%s workspaces=%s", attempt_id, ",".join(emptied))
    return emptied


def _provision(svc: ServiceReads, finding: Finding) -> str:
    """Unbind the brand from its workspace gone upstream (on record, asked once more
    first), then provision it again: a re-confirm alone would keep the gone one."""
    (brand_id,) = finding.brand_ids
    try:
        refused = _unbind_gone(svc, brand_id, finding.workspace_id)
        if refused is not None:
            return f"not requested: {refused}"
        attempt_id = commands.request_provisioning(
            svc, brand_id, finding.title or "", finding.parent_id
        )
    except (GatewayError, ProvisionerError) as exc:
        return f"not requested: {exc}"
    log.warning(
        "audit provisions again brand=%s attempt=%s: %s gone upstream",
        brand_id,
        attempt_id,
        finding.workspace_id,
    )
    return f"unbound; provisioned again: attempt {attempt_id}"


def _unbind_gone(svc: ServiceReads, brand_id: str, workspace_id: str) -> str | None:
    """Why the brand is not unbound from `workspace_id`, or None once it is."""
    if _status(svc, workspace_id) is not None:
        return f"{workspace_id} answers again"

    def step() -> str | None:
        brand = svc.brand(brand_id)
        if not brand.is_active or brand.workspace_id != workspace_id:
            return "the brand changed since the audit read it"
        current = svc.attempt(brand.current_attempt_id) if brand.current_attempt_id else None
        if current is not None and not current.is_terminal:
            return f"attempt {current.id} is pending: audit again once it ends"
        brand.unbind(UNBOUND_GONE)
        touched: list[Any] = [brand]
        claim = svc.claim(workspace_id)
        if claim is not None and claim.brand_id == brand_id:
            claim.release(UNBOUND_GONE)
            touched.append(claim)
        svc.app.save(*touched)
        return None

    return retry_on_conflict(svc.settings.max_rounds, step, f"brand {brand_id} is busy; retry")


__all__ = ["Fixed", "audit_parent", "fix", "parents_on_record", "read_record"]
