"""Off the request path: what ended attempts and deactivated brands still owe.

    release(attempt_id)        the owed release of an attempt that ended unpromoted
    decommission(brand_id)     empty, unbind and unclaim a deactivated brand's workspace

`discharge` is what an ended attempt still owes (releases, the workspace of an
unresolved create, an adopted claim, its title slot); a hop that finds its
attempt ended performs it too. What an unresolved create made is read by
`recovery`, as for the hop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from uuid import UUID

from eventsourcing.domain import Aggregate

from domain import ownership
from domain.attempt import ProvisioningAttempt
from domain.claim import WorkspaceClaim
from domain.errors import CommandRefused, NotOurs
from domain.policies import AttemptState, FailureReason, Provenance
from domain.ports import GatewayError, RequestRejected, TransientGatewayError, WorkspaceGone
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


def decommission(svc: ServiceReads, brand_id: str) -> int | None:
    """Empty a deactivated brand's workspace, then unbind it and release its claim.

    Returns the number of projects deleted, or None when there was nothing
    to do now (brand active again, no workspace bound, or its retention window
    not over: the reconciler sends it again once it is) or the gateway refused
    for good to empty it: that is recorded (`DecommissionRefused`), logged once,
    and not retried until an operator deactivates the brand again. Safe to repeat.
    """

    def step() -> int | None:
        brand = svc.brand(brand_id)
        if not brand.decommission_due(svc.clock.now()) or brand.workspace_id is None:
            return None
        workspace_id = brand.workspace_id
        if brand.decommissioning != workspace_id:
            # On record before any delete: a reactivation now waits for us.
            brand.start_decommission()
            svc.app.save(brand)
        if not svc.parent_allowed(brand.parent_workspace_id):
            why = (f"parent {brand.parent_workspace_id} is not one the service acts under "
                   "(PROVISIONER_PARENT_IDS)")  # fmt: skip
            brand.refuse_decommission(f"not emptied: {why}")  # kept, bound; not retried
            svc.app.save(brand)
            log.error("decommission refused to empty brand=%s workspace=%s: %s",
                      brand_id, workspace_id, why)  # fmt: skip
            return None
        claim = svc.claim(workspace_id)
        if claim is None or claim.brand_id != brand_id or svc.is_parent(workspace_id):
            # Bound without this brand's claim on record: not provably ours to empty.
            holder = "no claim" if claim is None else f"claim held by {claim.brand_id}"
            if svc.is_parent(workspace_id):
                holder = "a parent the service acts under"
            brand.unbind(f"not emptied: {holder}")
            svc.app.save(brand)
            log.error("decommission refused to empty brand=%s workspace=%s: %s",
                      brand_id, workspace_id, holder)  # fmt: skip
            return 0
        bound = ownership.Facts(workspace_id, (brand.parent_workspace_id, *svc.parents),
                                proven=True)  # we bound it, with this brand's claim: ours by proof
        try:
            deleted = empty_workspace(svc, bound)
        except RequestRejected as exc:
            brand.refuse_decommission(str(exc))  # the claim stays: still bound, still ours
            svc.app.save(brand)
            log.error(  # noqa: TRY400 - a decision on record; a traceback adds nothing
                "decommission refused for good brand=%s workspace=%s: %s; its projects are "
                "kept and it is not retried: fix it upstream, then `provisioner deactivate "
                "%s --purge-now`", brand_id, workspace_id, brand.emptying_refused, brand_id,
            )  # fmt: skip
            return None
        brand.unbind("decommissioned", deleted)
        claim.release("decommissioned")
        svc.app.save(brand, claim)
        log.info(
            "workspace decommissioned brand=%s workspace=%s projects_deleted=%d",
            brand_id,
            workspace_id,
            deleted,
        )
        return deleted

    return retry_on_conflict(
        svc.settings.max_rounds, step, f"brand {brand_id} is being changed concurrently; retry"
    )


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
    if attempt.provenance is not Provenance.ADOPTED or attempt.candidate_id is None:
        return None
    claim = (lookup or svc.claim)(attempt.candidate_id)
    if claim is None or claim.attempt_id != attempt.id:
        return None
    claim.release(f"attempt {attempt.state.value}")
    return claim


def release_workspace(svc: ServiceReads, attempt: ProvisioningAttempt, workspace_id: str) -> bool:
    """Empty one workspace the attempt owes a release of, and record it.

    The claim is marked `Releasing` in its own version-checked save before
    any delete, so nobody adopts the workspace while it is being emptied. If
    a later attempt already holds the claim, the workspace was handed over:
    that is recorded and nothing is deleted. Returns True if it was emptied.
    """
    if workspace_id not in attempt.owed_releases:  # only what our creates made, on record
        raise CommandRefused(f"attempt {attempt.id} owes no release of {workspace_id}")
    if not svc.parent_allowed(attempt.parent_workspace_id):
        why = (f"parent {attempt.parent_workspace_id} is not one the service acts under "
               "(PROVISIONER_PARENT_IDS): not emptied")  # fmt: skip
        return _left_for_a_person(svc, attempt, workspace_id, why, None)
    claim = svc.claim(workspace_id)
    if (
        claim is not None
        and claim.releasing_by != attempt.id
        and claim.attempt_id not in (None, attempt.id)
    ):
        assert claim.attempt_id is not None
        attempt.record_hand_over(workspace_id, claim.attempt_id)
        svc.app.save(attempt)
        return False
    claim = claim or WorkspaceClaim.open(workspace_id)
    if claim.releasing_by != attempt.id:
        claim.begin_release(attempt.brand_id, attempt.id)
        svc.app.save(claim)
    facts = ownership.Facts(workspace_id, (attempt.parent_workspace_id,), proven=True)
    if workspace_id in attempt.inferred_ids:  # a lost create's, by inference: must be empty
        facts = ownership.Facts(workspace_id, (attempt.parent_workspace_id,), credited=True)
    try:
        deleted = empty_workspace(svc, facts)
    except NotOurs as exc:
        return _left_for_a_person(svc, attempt, workspace_id, str(exc), claim)
    except RequestRejected as exc:
        attempt.record_release_refused(workspace_id, str(exc))
        claim.release("the gateway refused to empty it")
        svc.app.save(attempt, claim)
        log.error(  # noqa: TRY400 - a decision on record; a traceback adds nothing
            "release refused for good brand=%s attempt=%s workspace=%s: %s; nothing more "
            "is deleted: empty it by hand once the gateway allows it",
            attempt.brand_id, attempt.id, workspace_id, exc,
        )  # fmt: skip
        return False
    attempt.record_release(workspace_id, deleted)
    claim.release("emptied")
    svc.app.save(attempt, claim)
    log.info(
        "released brand=%s attempt=%s workspace=%s projects_deleted=%d",
        attempt.brand_id,
        attempt.id,
        workspace_id,
        deleted,
    )
    return True


def _left_for_a_person(
    svc: ServiceReads, attempt: ProvisioningAttempt, workspace_id: str, why: str,
    claim: WorkspaceClaim | None,
) -> bool:  # fmt: skip
    """Ownership refused to empty what the attempt owes: on record (`ReleaseRefused`,
    no longer owed: never asked again), nothing deleted, one ERROR line."""
    attempt.record_release_refused(workspace_id, why)
    if claim is not None:
        claim.release("not emptied: ownership refused")
    svc.app.save(attempt, *([claim] if claim is not None else []))
    log.error("release not performed brand=%s attempt=%s workspace=%s: %s; its projects are "
              "kept: a person decides (provisioner audit)",
              attempt.brand_id, attempt.id, workspace_id, why)  # fmt: skip
    return False


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
    if attempt.failure_reason is FailureReason.EXHAUSTED:
        earlier = [ws for ws in attempt.released_ids if ws not in (*released, *attempt.refused_ids)]
        released += [ws for ws in earlier if empty_shell_again(svc, attempt, ws)]
    if attempt.orphan_search:
        slot = svc.slot(attempt.parent_workspace_id, attempt.title)
        made = recovery.made_by_unresolved_create(svc, attempt, slot)
        if isinstance(made, ownership.Made):
            for workspace_id, why in made.held:
                log.warning("not credited to a lost create brand=%s attempt=%s workspace=%s: "
                            "%s", attempt.brand_id, attempt.id, workspace_id, why)  # fmt: skip
        if isinstance(made, ownership.Made) and made.ours:
            for orphan in made.ours:
                attempt.note_inferred(orphan, recovery.evidence(attempt, svc))
                attempt.record_created(orphan, attempt.expected_hop)
                slot.note_adoption(attempt.id, orphan)
            svc.app.save(attempt, slot)
            released += [ws for ws in made.ours if release_workspace(svc, attempt, ws)]
    touched: list[Aggregate] = []
    if attempt.state is not AttemptState.PROMOTED:
        claim = adopted_claim_to_release(svc, attempt)
        if claim is not None:
            touched.append(claim)
    slot = svc.slot(attempt.parent_workspace_id, attempt.title)
    if slot.holder == attempt.id and not attempt.create_unresolved:
        slot.free(attempt.id)
        touched.append(slot)
    if touched:
        svc.app.save(*touched)
    return tuple(released)


def empty_shell_again(svc: ServiceReads, attempt: ProvisioningAttempt, workspace_id: str) -> bool:
    """A shell the exhausted attempt emptied while it was still `not ready` may get
    projects once it settles: if nobody holds it and it has some, empty it again.

    Recorded on its claim (`Releasing`, then `Released`), marked before any
    delete in a version-checked save, so an adoption that raced it conflicts.
    """
    if workspace_id in attempt.inferred_ids:  # never emptied of projects on inference
        return False
    claim = svc.claim(workspace_id)
    if claim is None or claim.brand_id is not None:  # held: adopted or claimed since
        return False
    try:
        project_ids = svc.gateway.list_projects(workspace_id)
    except WorkspaceGone:
        return False
    if not project_ids:
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
