"""One run of one hop of one attempt (docs/architecture.md): observe, decide, save.

The decisions are `domain.hop`'s; each named step below reads, asks the gateway,
feeds what it answered (a failure as a value) to them, records what they decide
and returns the next step or the hop's outcome. A round works on one `HopUnit`:
a round that loses a race starts a fresh one and decides again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TypeAlias

from eventsourcing.persistence import IntegrityError

from domain import creates, ownership
from domain import hop as decide
from domain.errors import AlreadyClaimed, BrandDeactivated, CommandRefused
from domain.outcomes import HopOutcome, Outcome
from domain.policies import Provenance, StatusClass, classify_status
from domain.ports import FamilyMember, GatewayError, GatewayFault, fault_of
from infrastructure.usecases import recovery, releases
from infrastructure.usecases.hop_base import HopBase
from infrastructure.usecases.retry import retry_on_conflict
from infrastructure.usecases.unit import HopUnit

log = logging.getLogger("provisioner.engine")
lifecycle = logging.getLogger("provisioner.engine.lifecycle")  # shown without -v

Next: TypeAlias = "HopOutcome | Callable[[], Next]"  # the next step, or how the hop ended


class HopRun(HopBase):
    """One run of one hop of one attempt: observe, decide, save."""

    def run(self) -> HopOutcome:
        contended = f"attempt {self.attempt_id} is contended; retry the hop later"
        outcome = retry_on_conflict(
            self.svc.settings.max_rounds, self._round, contended, self._raced
        )
        if outcome.stand_down is not None and self.observed is not None:
            why = outcome.stand_down.value
            log.info("hop stood down after a race attempt=%s hop=%d: %s; it had observed: %s",
                     self.attempt_id, self.hop, why, self.observed)  # fmt: skip
        return outcome

    def _round(self) -> HopOutcome:
        """A fresh unit of work, then each step in turn until one is the outcome. A gateway
        failure that gets here is acquiring's: polling and releasing answer theirs."""
        self.unit = HopUnit(self.svc, self.attempt_id)
        step: Next = self._begin
        while not isinstance(step, HopOutcome):
            try:
                step = step()
            except GatewayError as exc:
                step = self._end(decide.acquire_faulted(fault_of(exc)))
        return step

    def _raced(self) -> None:
        seen = f" (it had observed: {self.observed})" if self.observed else ""
        log.info("hop raced another writer; deciding again attempt=%s hop=%d%s",
                 self.attempt_id, self.hop, seen)  # fmt: skip

    def _begin(self) -> Next:
        """Put a late create on record, perform owed releases, then pass the gate."""
        attempt = self.attempt
        placed_late = self.created is not None
        if placed_late:
            failed = self._record_created()
            if failed:
                self._fail(failed)  # the attempt has ended: the gate says so
            self._save()
        releases.release_owed(self.svc, attempt, self.released)
        stand = decide.gate(attempt.state, attempt.expected_hop, self.hop, placed_late)
        if stand:
            return self._outcome(stand.outcome, stand.detail, stand_down=stand.why)
        if attempt.candidate_id is not None:
            return self._poll
        return self._recover if attempt.create_unresolved else self._adopt_or_create

    # Create or adopt.

    def _recover(self) -> Next:
        """A create was requested and not recorded: find what it made, by the family.

        The title slot is read first: if another attempt holds it afresh, its
        create of the same title may be in flight and would look like ours. The
        acceptance is saved with the slot bumped, so a reservation taken after
        our read makes it conflict and decide again.
        """
        attempt, slot = self.attempt, self.unit.slot()
        made = recovery.made_by_unresolved_create(self.svc, attempt, slot, self.unit.family)
        if isinstance(made, decide.Wait):
            return self._end(made)
        at = attempt.create_requested_at  # None only in a log older than the field
        waited_s = 0.0
        if at is not None:
            since = creates.grace_start(at, attempt.deferred_until, attempt.create_answered)
            waited_s = (self.now - since).total_seconds()
        step = creates.recover(made, attempt.title, requested_hop=attempt.create_requested_hop,
                               hop=self.hop, waited_s=waited_s, grace_s=self.grace_s)  # fmt: skip
        for workspace_id, why in made.held:
            log.warning("not credited to a lost create attempt=%s workspace=%s: %s",
                        attempt.id, workspace_id, why)  # fmt: skip
        if isinstance(step, decide.Accept):
            if slot.holder != attempt.id:  # no Freed to save: bump it another way
                slot.note_adoption(attempt.id, step.workspace_id)
            for workspace_id in made.ours:  # on record as inferred: never emptied of projects
                attempt.note_inferred(workspace_id, recovery.evidence(attempt, self.svc))
            self._accept(step.workspace_id, step.provenance)
            for shell in made.ours:
                attempt.record_created(shell, self.hop)  # the rest: surplus, owed a release
            return self._poll
        if step is None:
            return self._adopt_or_create  # that create did not happen: adopt or create afresh
        return self._end(step)

    def _adopt_or_create(self) -> Next:
        attempt, parent = self.attempt, self.attempt.parent_workspace_id
        # The slot is read before the family, so an adoption that raced a
        # same-title create conflicts on the slot's version and decides again.
        slot, _ = self.unit.slot_and_brand()
        waiting = decide.slot_gate(recovery.slot_busy(self.svc, slot, attempt), attempt.title)
        if waiting:
            return self._end(waiting)
        titled = ownership.same_title(self.unit.family(), attempt.title, parent, self.svc.parents)
        eligible = [m.id for m in titled if self._adoptable(m)]
        step = decide.adopt_or_create(eligible, attempt.title)
        if isinstance(step, decide.Accept):
            slot.note_adoption(attempt.id, step.workspace_id)
            self._accept(step.workspace_id, step.provenance)
            return self._poll
        if isinstance(step, decide.Fail):
            return self._end(step)
        refused = creates.may_create(attempt.creates_given_up, attempt.title)
        if refused and attempt.create_unresolved:  # an unconfirmed create given up
            return self._end(refused)
        return self._create

    def _adoptable(self, member: FamilyMember) -> bool:
        """Ownership's verdict (`domain.ownership.judge`); its projects are read only of
        a ready workspace nobody else holds."""
        attempt = self.attempt
        facts = ownership.Facts(member.id, (attempt.parent_workspace_id, *self.svc.parents),
                                same_title=True, status=member.status)  # fmt: skip
        if classify_status(member.status) is not StatusClass.READY:
            return False
        if recovery.claimed_by_other(self.svc, member.id, attempt.brand_id):
            return False
        projects = recovery.project_count(self.svc, member.id)
        verdict = ownership.judge(replace(facts, projects=projects))
        return verdict.owner is ownership.Owner.ADOPTABLE

    def _create(self) -> Next:
        attempt, slot, parent = self.attempt, self.unit.slot(), self.attempt.parent_workspace_id
        titled = ownership.same_title(self.unit.family(), attempt.title, parent, self.svc.parents)
        known = [m.id for m in titled]
        attempt.request_create(self.hop, known, self.now)
        slot.reserve(attempt.id, self.now, self.grace_s)
        self.unit.touch(slot)
        try:
            self.unit.save()
        except IntegrityError:
            again = self.svc.attempt(attempt.id)
            lost = decide.lost_create_race(again.create_requested_hop, again.candidate_id, self.hop)
            if lost:
                return self._outcome(lost.outcome, lost.detail, stand_down=lost.why)
            raise
        answer: str | GatewayFault
        try:
            answer = self.svc.gateway.create_child(parent, attempt.title)
        except GatewayError as exc:
            answer = fault_of(exc)
        step = creates.create_answered(answer, parent, self.svc.settings.parent_ids or ())
        if isinstance(step, decide.Record):
            if step.workspace_id in (*known, *attempt.created_ids):
                return self._fail(creates.created_again(step.workspace_id))
            self.created = step.workspace_id
            failed = self._record_created()
            return self._fail(failed) if failed else self._poll
        if isinstance(step, decide.Recover):
            log.warning("create unconfirmed attempt=%s hop=%d", attempt.id, self.hop)
            attempt.record_create_unconfirmed(self.hop, step.message, step.answered)
            self.unit.family_read = None  # read before our create: read it again
            return self._recover
        if isinstance(step, decide.Refused):
            attempt.record_create_refused(self.hop, step.detail)
            return self._end(step.then)
        assert isinstance(step, decide.Fail | decide.Wait | decide.Defer)
        return self._end(step)

    def _accept(self, workspace_id: str, prov: Provenance) -> None:
        """The candidate, claimed and its slot freed: saved with the first poll's outcome."""
        attempt = self.attempt
        try:
            claim = self.unit.open_claim(workspace_id)
            claim.claim(attempt.brand_id, attempt.id)
        except AlreadyClaimed as exc:
            raise IntegrityError(str(exc)) from None  # decide again from fresh state
        attempt.accept_candidate(workspace_id, prov, self.hop)
        slot = self.unit.slot()
        slot.free(attempt.id)
        self.unit.touch(claim, slot)

    def _record_created(self) -> decide.Fail | None:
        """Put what this run created on record: as the candidate, else as a surplus.

        Saved with the attempt's next save (after the first poll on the fresh path).
        A surplus (the attempt moved on meanwhile) is owed a release, which the next
        step performs. Returns a Fail when the attempt must fail instead.
        """
        attempt, workspace_id = self.attempt, self.created
        assert workspace_id is not None
        if workspace_id in attempt.created_ids:
            return None
        takes_candidate = creates.created_takes_candidate(attempt.candidate_id, attempt.state)
        claimed = []
        if takes_candidate:
            # Just created, its claim cannot exist yet on the first try: opened unread.
            # If it does exist, the save conflicts and the next round reads it.
            claim = self.unit.open_claim(workspace_id, read=self._claim_read_needed)
            self._claim_read_needed = True
            try:
                claim.claim(attempt.brand_id, attempt.id)
            except AlreadyClaimed as exc:
                # A "new" id that another brand already holds: a gateway bug. It is
                # not ours to release; never bind it.
                self.created = None
                log.error(  # noqa: TRY400 - an expected condition; a traceback adds nothing
                    "create answered a claimed workspace attempt=%s: %s", attempt.id, exc
                )
                return creates.created_is_claimed(str(exc))
            claimed.append(claim)
        slot = self.unit.slot()
        slot.free(attempt.id)
        attempt.record_created(workspace_id, self.hop)
        self.unit.touch(slot, *claimed)
        if not takes_candidate:
            log.warning(
                "a create lost its race; releasing it attempt=%s workspace=%s",
                attempt.id,
                workspace_id,
            )
        return None

    # Poll.

    def _poll(self) -> Next:
        workspace_id = self.attempt.candidate_id
        assert workspace_id is not None
        answer: str | GatewayFault
        try:
            answer = self.svc.gateway.status(workspace_id)
        except GatewayError as exc:
            answer = fault_of(exc)
        step = decide.status_answered(answer, self.attempt.provenance, workspace_id)
        if isinstance(step, decide.Promote):
            return self._promote
        if isinstance(step, decide.DropExisting):
            return self._drop_existing(step)
        if isinstance(step, decide.DropCandidate):
            return self._drop_candidate(step)
        return self._end(step)

    def _promote(self) -> HopOutcome:
        attempt, brand = self.attempt, self.unit.brand()
        workspace_id = attempt.candidate_id
        assert workspace_id is not None
        try:
            brand.bind(workspace_id, attempt.id)
        except (BrandDeactivated, CommandRefused) as exc:
            # The brand moved on (deactivated, newer attempt) in a save that also
            # ended this attempt: re-read and stand down through the gate.
            raise IntegrityError(str(exc)) from None
        attempt.promote(self.hop)
        self.unit.touch(brand)
        self._save()
        lifecycle.info("brand promoted brand=%s attempt=%s workspace=%s hop=%d (%s)",
                       attempt.brand_id, attempt.id, workspace_id, self.hop,
                       attempt.provenance.value if attempt.provenance else "bound")  # fmt: skip
        return self._outcome(Outcome.PROMOTED, "ready")

    def _drop_existing(self, step: decide.DropExisting) -> HopOutcome:
        """The bound workspace went terminal: unbind it; the next hop creates or adopts."""
        attempt, brand = self.attempt, self.unit.brand()
        brand.unbind(f"status {step.raw!r}")
        self.unit.touch(brand)
        claim = self.unit.claim(attempt.candidate_id or "")
        if claim is not None and claim.brand_id == attempt.brand_id:
            claim.release("bound workspace went terminal")
            self.unit.touch(claim)
        attempt.drop_candidate(step.raw, self.hop)
        return self._end(step.then)

    def _drop_candidate(self, step: decide.DropCandidate) -> HopOutcome:
        """The candidate's creation failed: drop it; the next hop creates again. A
        created one is then owed a release; an adopted one's claim goes back."""
        self.unit.touch(releases.adopted_claim_to_release(self.svc, self.attempt, self.unit.claim))
        self.attempt.drop_candidate(step.raw, self.hop)
        return self._end(step.then)
