"""What our unresolved creates made, read for the rule of `domain.creates`.

The hop's recovery of an unconfirmed create and the orphan search of an ended
attempt both call `made_by_unresolved_create`: it reads the title slot's gate,
the family and what is taken elsewhere, and asks `creates.made_by_our_creates`.
"""

from __future__ import annotations

from collections.abc import Callable

from domain import creates
from domain import hop as decide
from domain.attempt import ProvisioningAttempt
from domain.ports import FamilyMember
from domain.slot import TitleSlot
from infrastructure.usecases.reads import ServiceReads


def claimed_by_other(svc: ServiceReads, workspace_id: str, brand_id: str) -> bool:
    claim = svc.claim(workspace_id)
    return claim is not None and claim.held_by_other_than(brand_id)


def slot_busy(svc: ServiceReads, slot: TitleSlot, attempt: ProvisioningAttempt) -> bool:
    """Another attempt holds the title slot afresh: its create of the same title may
    be in flight and would look like ours (`domain.hop.slot_gate`)."""
    return slot.busy_for(attempt.id, svc.clock.now(), svc.settings.create_grace_s)


def taken_elsewhere(svc: ServiceReads, workspace_id: str, attempt: ProvisioningAttempt) -> bool:
    """Cannot be what the attempt's unresolved create made: another brand holds it,
    or another attempt the claim ever named has it on record as made by its create.

    The second covers a shell that attempt created and released (unclaimed
    now) and the workspace of the brand's own next attempt (claimed by the
    same brand): both are new to an older create's baseline, and counted as
    candidates they would make the search ambiguous for good, so the orphan
    would never be recorded.
    """
    claim = svc.claim(workspace_id)
    if claim is None:
        return False
    if claim.held_by_other_than(attempt.brand_id):
        return True
    others = svc.load(*(claim.attempts_named - {attempt.id}))
    return any(isinstance(o, ProvisioningAttempt) and workspace_id in o.created_ids for o in others)


def made_by_unresolved_create(
    svc: ServiceReads,
    attempt: ProvisioningAttempt,
    slot: TitleSlot,
    family_of: Callable[[], list[FamilyMember]] | None = None,
) -> decide.Wait | creates.Made:
    """What the attempt's unconfirmed creates made, the family read after the title
    slot (a wait while another attempt's create may be in flight); `family_of`: the
    hop's, read once per round.

    The caller saves what it records with the slot bumped, so a reservation
    taken after the slot's read makes that save conflict.
    """
    waiting = decide.slot_gate(slot_busy(svc, slot, attempt), attempt.title)
    if waiting is not None:
        return waiting
    parent = attempt.parent_workspace_id
    family = family_of() if family_of else svc.family(parent, attempt.title)
    args = (family, attempt.title, parent, attempt.creates)
    taken = {m.id for m in creates.unaccounted(*args) if taken_elsewhere(svc, m.id, attempt)}
    return creates.made_by_our_creates(*args, taken)
