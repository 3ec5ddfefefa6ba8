"""One run of one hop of one attempt (docs/architecture.md): observe, decide, save.

The decisions are `domain.hop`'s; this module reads the aggregates, asks the
gateway, feeds what it answered (a failure as a value) to those functions and
records and performs the step they return. Saves are version-checked; a round
that loses a race reads afresh and decides again (`retry_on_conflict`).
"""

from __future__ import annotations

import logging

from eventsourcing.domain import Aggregate
from eventsourcing.persistence import IntegrityError

from domain import creates
from domain import hop as decide
from domain.attempt import ProvisioningAttempt
from domain.claim import WorkspaceClaim
from domain.errors import AlreadyClaimed, BrandDeactivated, CommandRefused
from domain.outcomes import HopOutcome, Outcome
from domain.policies import Provenance, adoption_shortlist, same_title
from domain.ports import FamilyMember, GatewayError, WorkspaceGone
from domain.slot import TitleSlot
from infrastructure.usecases import releases
from infrastructure.usecases.hop_base import HopBase
from infrastructure.usecases.retry import retry_on_conflict

log = logging.getLogger("provisioner.engine")


class HopRun(HopBase):
    """One run of one hop of one attempt: observe, decide, save."""

    def run(self) -> HopOutcome:
        return retry_on_conflict(
            self.svc.settings.max_rounds,
            self._round,
            f"attempt {self.attempt_id} is contended; retry the hop later",
            self._forget_round,
        )

    def _round(self) -> HopOutcome:
        attempt, self._context = self.svc.attempt_in_context(self.attempt_id)
        if self._context is not None:
            self._brand = self._context[1]
        return self._step(attempt)

    def _forget_round(self) -> None:
        log.info(
            "hop raced another writer; deciding again attempt=%s hop=%d", self.attempt_id, self.hop
        )
        self._family = None
        self.pending = []
        self._saved_slot = None
        self._brand = None

    def _step(self, attempt: ProvisioningAttempt) -> HopOutcome:
        placed_late = self.created is not None
        if placed_late:
            self._record_created(attempt)
            self._save(attempt)
        releases.release_owed(self.svc, attempt, self.released)
        gate = decide.gate(attempt.state, attempt.expected_hop, self.hop, placed_late)
        if isinstance(gate, decide.Stand):
            return self._outcome(attempt, gate.outcome, gate.detail, stand_down=gate.why)
        if attempt.candidate_id is None:
            outcome = self._acquire(attempt)
            if outcome is not None:
                return outcome
        return self._poll(attempt)

    # Create or adopt.

    def _acquire(self, attempt: ProvisioningAttempt) -> HopOutcome | None:
        """Give the attempt a candidate; None when it has one, else the hop's outcome."""
        try:
            if attempt.create_unresolved:
                outcome = self._recover_create(attempt)
                if outcome is not None or attempt.candidate_id is not None:
                    return outcome
            return self._adopt_or_create(attempt)
        except GatewayError as exc:
            return self._end(attempt, decide.acquire_failed(decide.failed(exc)))

    def _recover_create(self, attempt: ProvisioningAttempt) -> HopOutcome | None:
        """A create was requested and not recorded: find what it made, by the family.

        The title slot is read first: if another attempt holds it afresh, its
        create of the same title may be in flight and would look like ours. The
        acceptance is saved with the slot bumped, so a reservation taken after
        our read makes it conflict and decide again.
        """
        slot = self._slot(attempt)
        made = releases.made_by_unresolved_create(self.svc, attempt, slot, self._family_of)
        if isinstance(made, decide.Wait):
            return self._end(attempt, made)
        # The grace counts from the create, or from the end of the last deferral after
        # it: while the gateway did not answer, the family could not show the create.
        since = max(filter(None, (attempt.create_requested_at, attempt.deferred_until)),
                    default=None)  # fmt: skip
        waited_s = 0.0 if since is None else (self.now - since).total_seconds()
        step = creates.recover(made, attempt.title, requested_hop=attempt.create_requested_hop,
                               hop=self.hop, waited_s=waited_s, grace_s=self.grace_s)  # fmt: skip
        if isinstance(step, decide.Accept):
            if slot.holder != attempt.id:  # no Freed to save: bump it another way
                slot.note_adoption(attempt.id, step.workspace_id)
            self._accept(attempt, step.workspace_id, step.provenance, slot)
            for shell in made.ours:
                attempt.record_created(shell, self.hop)  # the rest: surplus, owed a release
            return None
        if isinstance(step, decide.Proceed):
            return None  # that create did not happen: adopt or create afresh
        return self._end(attempt, step)

    def _adopt_or_create(self, attempt: ProvisioningAttempt) -> HopOutcome | None:
        # The slot is read before the family, so an adoption that raced a
        # same-title create conflicts on the slot's version and decides again.
        slot, self._brand = self._context or self.svc.slot_and_brand(attempt)
        self._context = (slot, self._brand)
        waiting = decide.slot_gate(releases.slot_busy(self.svc, slot, attempt), attempt.title)
        if isinstance(waiting, decide.Wait):
            return self._end(attempt, waiting)
        family = self._family_of(attempt)
        eligible = [
            m.id
            for m in adoption_shortlist(family, attempt.title, attempt.parent_workspace_id)
            if not releases.claimed_by_other(self.svc, m.id, attempt.brand_id)
            and self._is_empty(m.id)
        ]
        step = decide.adopt_or_create(eligible, attempt.title)
        if isinstance(step, decide.Accept):
            slot.note_adoption(attempt.id, step.workspace_id)
            self._accept(attempt, step.workspace_id, step.provenance, slot)
            return None
        if isinstance(step, decide.Fail):
            return self._end(attempt, step)
        if attempt.create_unresolved:  # giving an unconfirmed create up: at most so often
            allowed = creates.may_create(attempt.creates_given_up, attempt.title)
            if isinstance(allowed, decide.Fail):
                return self._end(attempt, allowed)
        return self._create(attempt, family, slot)

    def _is_empty(self, workspace_id: str) -> bool:
        try:
            return not self.svc.gateway.list_projects(workspace_id)
        except WorkspaceGone:
            return False

    def _create(
        self, attempt: ProvisioningAttempt, family: list[FamilyMember], slot: TitleSlot
    ) -> HopOutcome | None:
        known = [m.id for m in same_title(family, attempt.title, attempt.parent_workspace_id)]
        attempt.request_create(self.hop, known, self.now)
        slot.reserve(attempt.id, self.now, self.grace_s)
        try:
            self.svc.app.save(attempt, slot)
            self._saved_slot = slot
        except IntegrityError:
            again = self.svc.attempt(attempt.id)
            lost = decide.lost_create_race(again.create_requested_hop, again.candidate_id, self.hop)
            if isinstance(lost, decide.Stand):
                return self._outcome(again, lost.outcome, lost.detail, stand_down=lost.why)
            raise
        parent = attempt.parent_workspace_id
        answer: str | decide.Failed
        try:
            answer = self.svc.gateway.create_child(parent, attempt.title)
        except GatewayError as exc:
            answer = decide.failed(exc)
        step = creates.create_answered(answer, parent, self.svc.settings.parent_ids or ())
        if isinstance(step, decide.Record):
            if step.workspace_id in (*known, *attempt.created_ids):
                return self._fail(attempt, creates.created_again(step.workspace_id))
            self.created = step.workspace_id
            return self._record_created(attempt)
        if isinstance(step, decide.Recover):
            log.warning("create unconfirmed attempt=%s hop=%d", attempt.id, self.hop)
            self._family = None
            return self._recover_create(attempt)
        if isinstance(step, decide.Refused):
            attempt.record_create_refused(self.hop, step.detail)
            return self._end(attempt, step.then)
        assert isinstance(step, decide.Fail | decide.Wait | decide.Defer)
        return self._end(attempt, step)

    def _accept(
        self,
        attempt: ProvisioningAttempt,
        workspace_id: str,
        prov: Provenance,
        slot: TitleSlot | None = None,
    ) -> None:
        try:
            claim = releases.claim_for(self.svc, workspace_id, attempt.brand_id, attempt.id)
        except AlreadyClaimed as exc:
            raise IntegrityError(str(exc)) from None  # decide again from fresh state
        attempt.accept_candidate(workspace_id, prov, self.hop)
        slot = slot or self._slot(attempt)
        slot.free(attempt.id)
        self.pending += [claim, slot]

    def _record_created(self, attempt: ProvisioningAttempt) -> HopOutcome | None:
        """Put what this run created on record: as the candidate, else as a surplus.

        The events are saved with the attempt's next save (right after the first
        poll on the fresh path). A surplus (the attempt moved on meanwhile) is owed
        a release, which the next step performs. Returns an outcome only when the
        attempt failed here.
        """
        workspace_id = self.created
        assert workspace_id is not None
        if workspace_id in attempt.created_ids:
            return None
        takes_candidate = creates.created_takes_candidate(attempt.candidate_id, attempt.state)
        touched: list[Aggregate] = []
        if takes_candidate:
            try:
                touched.append(self._fresh_claim(workspace_id, attempt))
            except AlreadyClaimed as exc:
                # A "new" id that another brand already holds: a gateway bug. It is
                # not ours to release; never bind it.
                self.created = None
                log.error(  # noqa: TRY400 - an expected condition; a traceback adds nothing
                    "create answered a claimed workspace attempt=%s: %s", attempt.id, exc
                )
                return self._fail(attempt, creates.created_is_claimed(str(exc)))
        slot = self._slot(attempt)
        slot.free(attempt.id)
        attempt.record_created(workspace_id, self.hop)
        self.pending += [slot, *touched]
        if not takes_candidate:
            log.warning(
                "a create lost its race; releasing it attempt=%s workspace=%s",
                attempt.id,
                workspace_id,
            )
        return None

    def _fresh_claim(self, workspace_id: str, attempt: ProvisioningAttempt) -> WorkspaceClaim:
        """The claim of a workspace we just created: on the first try it cannot exist
        yet, so it is opened without a read; if it does exist, the save conflicts and
        the next round reads it."""
        if self._claim_read_needed:
            return releases.claim_for(self.svc, workspace_id, attempt.brand_id, attempt.id)
        self._claim_read_needed = True
        claim = WorkspaceClaim.open(workspace_id)
        claim.claim(attempt.brand_id, attempt.id)
        return claim

    # Poll.

    def _poll(self, attempt: ProvisioningAttempt) -> HopOutcome:
        workspace_id = attempt.candidate_id
        assert workspace_id is not None
        answer: str | decide.Failed
        try:
            answer = self.svc.gateway.status(workspace_id)
        except GatewayError as exc:
            answer = decide.failed(exc)
        step = decide.status_answered(answer, attempt.provenance, workspace_id)
        if isinstance(step, decide.Promote):
            return self._promote(attempt)
        if isinstance(step, decide.DropExisting):
            return self._drop_existing(attempt, step.raw)
        if isinstance(step, decide.DropCandidate):
            return self._drop_candidate(attempt, step.raw)
        return self._end(attempt, step)

    def _promote(self, attempt: ProvisioningAttempt) -> HopOutcome:
        workspace_id = attempt.candidate_id
        assert workspace_id is not None
        brand = self._brand or self.svc.brand(attempt.brand_id)
        try:
            brand.bind(workspace_id, attempt.id)
        except (BrandDeactivated, CommandRefused) as exc:
            # The brand moved on (deactivated, newer attempt) in a save that also
            # ended this attempt: re-read and stand down through the gate.
            raise IntegrityError(str(exc)) from None
        attempt.promote(self.hop)
        self._save(attempt, brand)
        return self._outcome(attempt, Outcome.PROMOTED, "ready", workspace_id=workspace_id)

    def _drop_existing(self, attempt: ProvisioningAttempt, raw: str) -> HopOutcome:
        """The bound workspace went terminal: unbind it; the next hop creates or adopts."""
        brand = self.svc.brand(attempt.brand_id)
        touched: list[Aggregate] = [brand]
        brand.unbind(f"status {raw!r}")
        claim = self.svc.claim(attempt.candidate_id or "")
        if claim is not None and claim.brand_id == attempt.brand_id:
            claim.release("bound workspace went terminal")
            touched.append(claim)
        attempt.drop_candidate(raw, self.hop)
        return self._end(attempt, decide.drop_existing_status(raw), touched)

    def _drop_candidate(self, attempt: ProvisioningAttempt, raw: str) -> HopOutcome:
        """The candidate's creation failed: drop it; the next hop creates again. A
        created one is then owed a release; an adopted one's claim goes back."""
        claim = releases.adopted_claim_to_release(self.svc, attempt, self._claim)
        attempt.drop_candidate(raw, self.hop)
        return self._end(attempt, decide.drop_candidate_status(raw), [claim] if claim else [])
