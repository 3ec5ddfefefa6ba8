"""What our lost creates made, read for ownership's rule (`domain.ownership.credit`).

The hop's recovery of an unconfirmed create and the orphan search of an ended
attempt both call `credit_lost_creates` (the search through
`made_by_unresolved_create`, which reads the title slot's gate and the family
first): it reads why each new child is someone else's (claims, other attempts'
creates) and the projects of the rest, and asks `ownership.credit`.
"""

from __future__ import annotations

from domain import ownership
from domain.attempt import ProvisioningAttempt
from domain.hop import slot_gate
from domain.ports import FamilyMember, WorkspaceGone
from domain.slot import TitleSlot
from domain.steps import Wait
from infrastructure.usecases.reads import ServiceReads


def claimed_by_other(svc: ServiceReads, workspace_id: str, brand_id: str) -> bool:
    claim = svc.claim(workspace_id)
    return claim is not None and claim.held_by_other_than(brand_id)


def slot_busy(svc: ServiceReads, slot: TitleSlot, attempt: ProvisioningAttempt) -> bool:
    """Another attempt holds the title slot afresh: its create of the same title may
    be in flight and would look like ours (`domain.hop.slot_gate`)."""
    return slot.busy_for(attempt.id, svc.clock.now(), svc.settings.create_grace_s)


def taken_elsewhere(
    svc: ServiceReads, workspace_id: str, attempt: ProvisioningAttempt
) -> str | None:
    """Why the workspace cannot be what the attempt's lost create made
    (`ownership.taken_because`), or None.

    Another attempt the claim ever named with it on record as made by its create
    covers a shell that attempt created and released (unclaimed now) and the
    workspace of the brand's own next attempt (claimed by the same brand): both
    are new to an older create's baseline, and counted as candidates they would
    make the search ambiguous for good, so the orphan would never be recorded.
    """
    claim = svc.claim(workspace_id)
    if claim is None:
        return None
    others = svc.load(*(claim.attempts_named - {attempt.id}))
    made = any(isinstance(o, ProvisioningAttempt) and workspace_id in o.created_ids for o in others)
    return ownership.taken_because(
        attempt.brand_id, claim.brand_id, claim.releasing_by is not None, made
    )


def project_count(svc: ServiceReads, workspace_id: str) -> int | None:
    """How many projects the workspace holds; None when it is gone (404)."""
    try:
        return len(svc.gateway.list_projects(workspace_id))
    except WorkspaceGone:
        return None


def made_by_unresolved_create(
    svc: ServiceReads, attempt: ProvisioningAttempt, slot: TitleSlot
) -> Wait | ownership.Made:
    """What the attempt's lost creates made, the family read after the title slot: a
    wait while another attempt's create may be in flight (the orphan search's; the
    hop reads the slot itself, `domain.hop.decide`)."""
    waiting = slot_gate(slot_busy(svc, slot, attempt), attempt.title)
    if waiting is not None:
        return waiting
    return credit_lost_creates(svc, attempt, svc.family(attempt.parent_workspace_id, attempt.title))


def credit_lost_creates(
    svc: ServiceReads, attempt: ProvisioningAttempt, family: list[FamilyMember]
) -> ownership.Made:
    """What ownership credits the attempt's lost creates with, in `family` (read after
    the title slot). Projects are read only of new children nobody else holds, and only
    while the window is open (past it, nothing is credited).

    The caller saves what it records with the slot bumped, so a reservation
    taken after the slot's read makes that save conflict.
    """
    parent, title, creates = attempt.parent_workspace_id, attempt.title, attempt.creates
    window = creates.window_open(svc.clock.now(), svc.settings.inference_window_s)
    new = ownership.new_children(family, title, parent, creates, svc.parents)
    taken = {m.id: why for m in new if (why := taken_elsewhere(svc, m.id, attempt))}
    counts = {m.id: project_count(svc, m.id) for m in new if window and m.id not in taken}
    gone = {ws for ws, n in counts.items() if n is None}  # listed, then gone: not a child
    return ownership.credit(
        [m for m in family if m.id not in gone],
        title,
        parent,
        creates,
        taken=taken,
        projects=counts,
        window_open=window,
        parents=svc.parents,
    )


def evidence(attempt: ProvisioningAttempt, svc: ServiceReads) -> str:
    """Why a workspace is credited to the attempt's lost create, for its log."""
    since = attempt.creates.window_from
    began = since.isoformat(timespec="seconds") if since else "unknown"
    return (
        f"new beside a create titled {attempt.title!r} whose answer was lost (its grace "
        f"began {began}), seen at {svc.clock.now().isoformat(timespec='seconds')}, empty, "
        "held by nobody else"
    )
