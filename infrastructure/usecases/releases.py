"""Off the request path: what ended attempts and deactivated brands still owe.

    release(attempt_id)        the owed release of an attempt that ended unpromoted
    decommission(brand_id)     empty, unbind and unclaim a deactivated brand's workspace

`discharge` is what an ended attempt still owes (releases, the workspace of an
unresolved create, an adopted claim, its title slot); a hop that finds its
attempt ended performs it too. What an unresolved create made is read by
`recovery`, as for the hop.

The decisions are `domain.releases`' pure functions of plain values (what to do
about one owed workspace, what its emptying came to, whether a decommission is
due and what it may empty); this module loads, observes through the gateway port,
asks them and saves. Saves are version-checked, and a claim (or the brand) is
marked `Releasing` in its own save before any delete.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from uuid import UUID

from eventsourcing.domain import Aggregate

from domain import ownership
from domain import releases as rules
from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.claim import WorkspaceClaim
from domain.errors import CommandRefused, NotOurs
from domain.policies import AttemptState, FailureReason, Provenance
from domain.ports import GatewayError, RequestRejected, TransientGatewayError, WorkspaceGone
from domain.releases import Decommissioned, DecommissionKind, Released, ReleaseKind
from infrastructure.usecases import recovery
from infrastructure.usecases.reads import ServiceReads
from infrastructure.usecases.retry import retry_on_conflict

log = logging.getLogger("provisioner.engine")


def _attempt_contended(attempt_id: UUID) -> str:
    return f"attempt {attempt_id} is being changed concurrently; retry"


def release(svc: ServiceReads, attempt_id: UUID) -> tuple[str, ...]:
    """Perform what an attempt that ended unpromoted still owes; safe to repeat."""

    def step() -> tuple[str, ...]:
        attempt = svc.attempt(attempt_id)
        return discharge(svc, attempt) if attempt.is_terminal else ()

    return retry_on_conflict(svc.settings.max_rounds, step, _attempt_contended(attempt_id))


def decommission(svc: ServiceReads, brand_id: str) -> Decommissioned:
    """Empty a deactivated brand's workspace, then unbind it and release its claim.

    Returns what it did (`domain.releases.Decommissioned`): emptied, with the
    projects deleted; nothing bound; not due (active again, or its retention window
    not over: the reconciler sends it again once it is); refused (the gateway, or a
    parent not ours: recorded as `DecommissionRefused`, logged once, not retried
    until an operator deactivates the brand again); or unbound, not emptied (not
    provably ours). The decisions are `domain.releases`'; this loads, marks,
    empties and saves. Safe to repeat.
    """

    def step() -> Decommissioned:
        brand = svc.brand(brand_id)
        ended = rules.decommission_gate(
            rules.BrandFacts(
                brand_id,
                brand.workspace_id,
                brand.decommission_due(svc.clock.now()),
                brand.is_active,
                brand.emptying_refused,
            )
        )
        if ended is not None:
            return ended
        workspace_id = brand.workspace_id
        assert workspace_id is not None
        claim = svc.claim(workspace_id)
        plan = rules.plan_decommission(
            rules.BoundFacts(
                brand_id,
                workspace_id,
                brand.parent_workspace_id,
                tuple(svc.parents),
                brand.decommissioning,
                svc.parent_allowed(brand.parent_workspace_id),
                svc.is_parent(workspace_id),
                claim is not None,
                None if claim is None else claim.brand_id,
            )
        )
        if plan.mark:
            # On record before any delete: a reactivation now waits for us.
            brand.start_decommission()
            svc.app.save(brand)
        match plan:
            case rules.KeepBound():
                brand.refuse_decommission(f"not emptied: {plan.why}")  # kept, bound; not retried
                svc.app.save(brand)
                log.error(
                    "decommission refused to empty brand=%s workspace=%s: %s",
                    brand_id,
                    workspace_id,
                    plan.why,
                )
                return rules.decommission_refused(brand_id, workspace_id, plan)
            case rules.UnbindUnemptied():
                brand.unbind(f"not emptied: {plan.why}")
                svc.app.save(brand)
                log.error(
                    "decommission refused to empty brand=%s workspace=%s: %s",
                    brand_id,
                    workspace_id,
                    plan.why,
                )
                return rules.decommission_unbound(brand_id, workspace_id, plan)
            case rules.EmptyBound():
                assert claim is not None
                answer = _empty(svc, plan.facts)
                return _record_decommission(
                    svc, brand, claim, rules.decommission_answered(brand_id, workspace_id, answer)
                )

    return retry_on_conflict(
        svc.settings.max_rounds, step, f"brand {brand_id} is being changed concurrently; retry"
    )


def _record_decommission(
    svc: ServiceReads, brand: Brand, claim: WorkspaceClaim, outcome: Decommissioned
) -> Decommissioned:
    """Emptied: unbound and unclaimed in one save. Refused for good: on record, the
    claim kept (still bound, still ours), one ERROR line."""
    if outcome.kind is DecommissionKind.EMPTIED:
        brand.unbind("decommissioned", outcome.projects_deleted)
        claim.release("decommissioned")
        svc.app.save(brand, claim)
        log.info(
            "workspace decommissioned brand=%s workspace=%s projects_deleted=%d",
            outcome.brand_id,
            outcome.workspace_id,
            outcome.projects_deleted,
        )
        return outcome
    brand.refuse_decommission(outcome.why)
    svc.app.save(brand)
    log.error(
        "decommission refused for good brand=%s workspace=%s: %s; its projects are "
        "kept and it is not retried: fix it upstream, then `provisioner deactivate "
        "%s --purge-now`",
        outcome.brand_id,
        outcome.workspace_id,
        brand.emptying_refused,
        outcome.brand_id,
    )
    return replace(outcome, why=brand.emptying_refused or outcome.why)


def _empty(svc: ServiceReads, facts: ownership.Facts) -> rules.Emptying:
    """Empty the workspace as ownership allows; what came back, as a value."""
    try:
        return rules.Emptied(empty_workspace(svc, facts))
    except NotOurs as exc:
        return rules.NotOursToEmpty(str(exc))
    except RequestRejected as exc:
        return rules.RejectedForGood(str(exc))


# Shared steps.


def empty_workspace(svc: ServiceReads, facts: ownership.Facts) -> int:
    """Delete every project of the workspace (404 = already gone); never the workspace.
    Ownership judges it on the projects listed now (`ownership.judge`, `may_empty`):
    a parent, someone else's, or one credited by inference that holds projects is
    refused (NotOurs) before any delete."""
    workspace_id = facts.workspace_id
    facts = replace(facts, parents=(*facts.parents, *svc.parents))
    if ownership.is_parent(workspace_id, facts.parents):
        raise NotOurs(f"{workspace_id} is a parent the service acts under: never emptied")
    try:
        project_ids = svc.gateway.list_projects(workspace_id)
    except WorkspaceGone:
        return 0
    verdict = ownership.judge(replace(facts, projects=len(project_ids)))
    if not ownership.may_empty(verdict):
        raise NotOurs(f"{workspace_id} is not emptied ({verdict.owner.value}): {verdict.why}")
    for project_id in project_ids:
        svc.gateway.delete_project(workspace_id, project_id)
    return len(project_ids)


def adopted_claim_to_release(
    svc: ServiceReads,
    attempt: ProvisioningAttempt,
    lookup: Callable[[str], WorkspaceClaim | None] | None = None,
) -> WorkspaceClaim | None:
    """An adopted candidate's claim goes back when the attempt ends unpromoted."""
    workspace_id = rules.adopted_claim(
        attempt.provenance is Provenance.ADOPTED, attempt.candidate_id
    )
    if workspace_id is None:
        return None
    claim = (lookup or svc.claim)(workspace_id)
    if claim is None or claim.attempt_id != attempt.id:  # not this attempt's to give back
        return None
    claim.release(f"attempt {attempt.state.value}")
    return claim


def release_workspace(svc: ServiceReads, attempt: ProvisioningAttempt, workspace_id: str) -> bool:
    """Empty one workspace the attempt owes a release of, and record it; True if it
    was emptied. What it did is `release_one`'s typed outcome."""
    return release_one(svc, attempt, workspace_id).emptied


def release_one(svc: ServiceReads, attempt: ProvisioningAttempt, workspace_id: str) -> Released:
    """Empty one workspace the attempt owes a release of, and record it.

    The claim is marked `Releasing` in its own version-checked save before
    any delete, so nobody adopts the workspace while it is being emptied. If
    a later attempt already holds the claim, the workspace was handed over:
    that is recorded and nothing is deleted. The decisions are
    `domain.releases.plan_release` and `release_answered`.
    """
    parent_allowed = svc.parent_allowed(attempt.parent_workspace_id)
    claim = svc.claim(workspace_id) if parent_allowed else None
    plan = rules.plan_release(
        rules.ReleaseFacts(
            workspace_id,
            attempt.id,
            attempt.parent_workspace_id,
            owed=workspace_id in attempt.owed_releases,
            parent_allowed=parent_allowed,
            inferred=workspace_id in attempt.inferred_ids,
            claim_holder=None if claim is None else claim.attempt_id,
            releasing_by=None if claim is None else claim.releasing_by,
        )
    )
    match plan:
        case rules.NotOwed():
            raise CommandRefused(plan.why)
        case rules.LeaveForAPerson():
            outcome = Released(ReleaseKind.LEFT_FOR_A_PERSON, workspace_id, why=plan.why)
        case rules.HandOver():
            attempt.record_hand_over(workspace_id, plan.to_attempt)
            svc.app.save(attempt)
            return Released(ReleaseKind.HANDED_OVER, workspace_id)
        case rules.EmptyOwed():
            claim = claim or WorkspaceClaim.open(workspace_id)
            if plan.mark:
                claim.begin_release(attempt.brand_id, attempt.id)
                svc.app.save(claim)
            outcome = rules.release_answered(workspace_id, _empty(svc, plan.facts))
    RECORD_RELEASE[outcome.kind](svc, attempt, claim, outcome)
    return outcome


def _record_emptied(
    svc: ServiceReads, attempt: ProvisioningAttempt, claim: WorkspaceClaim | None, r: Released
) -> None:
    assert claim is not None
    attempt.record_release(r.workspace_id, r.projects_deleted)
    claim.release("emptied")
    svc.app.save(attempt, claim)
    log.info(
        "released brand=%s attempt=%s workspace=%s projects_deleted=%d",
        attempt.brand_id,
        attempt.id,
        r.workspace_id,
        r.projects_deleted,
    )


def _record_refused_for_good(
    svc: ServiceReads, attempt: ProvisioningAttempt, claim: WorkspaceClaim | None, r: Released
) -> None:
    assert claim is not None
    attempt.record_release_refused(r.workspace_id, r.why)
    claim.release("the gateway refused to empty it")
    svc.app.save(attempt, claim)
    log.error(
        "release refused for good brand=%s attempt=%s workspace=%s: %s; nothing more "
        "is deleted: empty it by hand once the gateway allows it",
        attempt.brand_id,
        attempt.id,
        r.workspace_id,
        r.why,
    )


def _record_left_for_a_person(
    svc: ServiceReads, attempt: ProvisioningAttempt, claim: WorkspaceClaim | None, r: Released
) -> None:
    """Ownership refused to empty what the attempt owes: on record (`ReleaseRefused`,
    no longer owed: never asked again), nothing deleted, one ERROR line."""
    attempt.record_release_refused(r.workspace_id, r.why)
    if claim is not None:
        claim.release("not emptied: ownership refused")
    svc.app.save(attempt, *([claim] if claim is not None else []))
    log.error(
        "release not performed brand=%s attempt=%s workspace=%s: %s; its projects are "
        "kept: a person decides (provisioner audit)",
        attempt.brand_id,
        attempt.id,
        r.workspace_id,
        r.why,
    )


# How each release's outcome is put on record (a handed-over one already is).
RECORD_RELEASE: dict[
    ReleaseKind,
    Callable[[ServiceReads, ProvisioningAttempt, WorkspaceClaim | None, Released], None],
] = {
    ReleaseKind.EMPTIED: _record_emptied,
    ReleaseKind.REFUSED_FOR_GOOD: _record_refused_for_good,
    ReleaseKind.LEFT_FOR_A_PERSON: _record_left_for_a_person,
}


def release_owed(svc: ServiceReads, attempt: ProvisioningAttempt, released: list[str]) -> None:
    """Empty what the attempt owes now (an ended attempt: `discharge`; a pending one:
    its surplus creates), appending each workspace emptied to `released`. A gateway
    failure defers the rest: it stays owed for the next hop, release or reconciler."""
    try:
        if attempt.is_terminal:
            released.extend(discharge(svc, attempt))
        else:
            for workspace_id in attempt.owed_releases:
                if release_workspace(svc, attempt, workspace_id):
                    released.append(workspace_id)
    except TransientGatewayError as exc:  # no answer: the pace logs the outage once
        log.info("release deferred brand=%s attempt=%s: %s", attempt.brand_id, attempt.id, exc)
    except GatewayError as exc:
        log.warning("release deferred brand=%s attempt=%s: %s", attempt.brand_id, attempt.id, exc)


def discharge(svc: ServiceReads, attempt: ProvisioningAttempt) -> tuple[str, ...]:
    """What an ended attempt still owes: releases, an unresolved create, claims, slot,
    and an exhausted attempt's shells re-checked."""
    released = [ws for ws in attempt.owed_releases if release_workspace(svc, attempt, ws)]
    earlier = rules.shells_to_recheck(
        attempt.failure_reason is FailureReason.EXHAUSTED,
        attempt.released_ids,
        released,
        attempt.refused_ids,
    )
    released += [ws for ws in earlier if empty_shell_again(svc, attempt, ws)]
    if attempt.orphan_search:
        released += _release_orphans(svc, attempt)
    touched: list[Aggregate] = []
    if attempt.state is not AttemptState.PROMOTED:
        claim = adopted_claim_to_release(svc, attempt)
        if claim is not None:
            touched.append(claim)
    slot = svc.slot(attempt.parent_workspace_id, attempt.title)
    if rules.frees_slot(slot.holder, attempt.id, attempt.create_unresolved):
        slot.free(attempt.id)
        touched.append(slot)
    if touched:
        svc.app.save(*touched)
    return tuple(released)


def _release_orphans(svc: ServiceReads, attempt: ProvisioningAttempt) -> list[str]:
    """What the ended attempt's unresolved create made, as ownership credits it: put
    on record, then released; what it cannot credit is logged for a person. While
    another attempt holds the title slot afresh (a wait), nothing is looked at."""
    slot = svc.slot(attempt.parent_workspace_id, attempt.title)
    match recovery.made_by_unresolved_create(svc, attempt, slot):
        case ownership.Made() as made:
            pass
        case _:
            return []
    for workspace_id, why in made.held:
        log.warning(
            "not credited to a lost create brand=%s attempt=%s workspace=%s: %s",
            attempt.brand_id,
            attempt.id,
            workspace_id,
            why,
        )
    if not made.ours:
        return []
    for orphan in made.ours:
        attempt.note_inferred(orphan, recovery.evidence(attempt, svc))
        attempt.record_created(orphan, attempt.expected_hop)
        slot.note_adoption(attempt.id, orphan)
    svc.app.save(attempt, slot)
    return [ws for ws in made.ours if release_workspace(svc, attempt, ws)]


def empty_shell_again(svc: ServiceReads, attempt: ProvisioningAttempt, workspace_id: str) -> bool:
    """A shell the exhausted attempt emptied while it was still `not ready` may get
    projects once it settles: if nobody holds it and it has some, empty it again.

    Recorded on its claim (`Releasing`, then `Released`), marked before any
    delete in a version-checked save, so an adoption that raced it conflicts.
    """
    inferred = workspace_id in attempt.inferred_ids
    claim = None if inferred else svc.claim(workspace_id)
    held = claim is not None and claim.brand_id is not None  # adopted or claimed since
    if not rules.may_recheck_shell(inferred, claim is not None, held):
        return False
    assert claim is not None
    try:
        project_ids = svc.gateway.list_projects(workspace_id)
    except WorkspaceGone:
        return False
    if not rules.shell_to_empty_again(len(project_ids)):
        return False
    claim.begin_release(attempt.brand_id, attempt.id)
    svc.app.save(claim)
    facts = ownership.Facts(workspace_id, (attempt.parent_workspace_id,), proven=True)
    deleted = empty_workspace(svc, facts)
    claim.release("projects appeared after its release")
    svc.app.save(claim)
    log.warning(
        "released again brand=%s attempt=%s workspace=%s projects_deleted=%d",
        attempt.brand_id,
        attempt.id,
        workspace_id,
        deleted,
    )
    return True
