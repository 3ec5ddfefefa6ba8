"""What a hop performs: each effect `domain.hop.decide` asks for, and each ending.

`HopEffects` holds one run of one hop of one attempt: what outlives a round (a
workspace created and not yet seen on record, what was emptied), the round's
`HopUnit`, and a method per effect that reads, calls or records, and returns
what it saw as a `Seen`. The order is never chosen here: the runner
(`infrastructure.usecases.hop`) asks `decide` after every effect.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from domain import creates, ownership, waits
from domain import hop as decide
from domain import releases as rules
from domain.attempt import ProvisioningAttempt
from domain.errors import AlreadyClaimed, BrandDeactivated, CommandRefused
from domain.outcomes import HopOutcome, Outcome, StandDown
from domain.policies import FailureReason, Provenance, StatusClass, classify_status
from domain.ports import FamilyMember, GatewayError, GatewayFault, fault_of
from domain.steps import Defer as DeferStep
from domain.steps import DropCandidate, DropExisting, Fail, Promote, Refused, Schedule, Stand, Wait
from infrastructure.usecases import recovery, releases
from infrastructure.usecases.reads import ServiceReads
from infrastructure.usecases.unit import HopUnit

log = logging.getLogger("provisioner.engine")
lifecycle = logging.getLogger("provisioner.engine.lifecycle")  # shown without -v


class HopEffects:
    """One run of one hop of one attempt: its effects, its endings, what outlives a round."""

    unit: HopUnit  # this round's: each round starts a fresh one

    def __init__(self, service: ServiceReads, attempt_id: UUID, hop: int) -> None:
        self.svc = service
        self.attempt_id = attempt_id
        self.hop = hop
        # A workspace this run created and has not yet seen recorded: it must
        # end up the attempt's candidate or a recorded surplus, never forgotten.
        self.created: str | None = None
        self.released: list[str] = []  # emptied by this run, whichever round
        self._claim_read_needed = False
        # What the latest round saw and was saving: said if that save lost a race.
        self.observed: str | None = None
        self._parents = tuple(service.settings.parent_ids or ())
        self._view: decide.HopView | None = None
        self._view_key: tuple[object, ...] = ()

    @property
    def attempt(self) -> ProvisioningAttempt:
        return self.unit.attempt

    def view(self) -> decide.HopView:
        """The attempt as the decider sees it: built again only when the attempt changed
        (its version moved) or this run's create did; `now` is when it was built."""
        a, svc = self.attempt, self.svc
        key = (a.version, self.created)
        if self._view is not None and key == self._view_key:
            return self._view
        self._view_key = key
        self._view = decide.HopView(
            hop=self.hop,
            now=svc.clock.now(),
            state=a.state,
            expected_hop=a.expected_hop,
            title=a.title,
            parent_id=a.parent_workspace_id,
            parents=self._parents,
            candidate_id=a.candidate_id,
            provenance=a.provenance,
            late_created=None if self.created in a.created_ids else self.created,
            created_ids=tuple(a.created_ids),
            create_unresolved=a.create_unresolved,
            create_requested_hop=a.create_requested_hop,
            create_requested_at=a.create_requested_at,
            create_answered=a.create_answered,
            deferred_until=a.deferred_until,
            creates_given_up=a.creates_given_up,
            grace_s=svc.settings.create_grace_s,
        )
        return self._view

    # Effects: each notes what it saw.

    def record_late(self, _e: decide.RecordLate, seen: decide.Seen) -> None:
        failed = self._record_created()
        if failed is None:
            self._save()
        seen.placed_late, seen.record_failed = True, failed

    def release_owed(self, _e: decide.ReleaseOwed, seen: decide.Seen) -> None:
        releases.release_owed(self.svc, self.attempt, self.released)
        seen.released = True

    def read_slot(self, _e: decide.ReadSlot, seen: decide.Seen) -> None:
        # The slot is read before the family: a create of the same title that raced
        # this hop then makes its save conflict on the slot's version.
        slot, _ = self.unit.slot_and_brand()
        seen.slot_busy = recovery.slot_busy(self.svc, slot, self.attempt)

    def credit_lost_creates(self, _e: decide.CreditLostCreates, seen: decide.Seen) -> None:
        family = self.unit.family()
        seen.family_answered = True
        made = recovery.credit_lost_creates(self.svc, self.attempt, family)
        for workspace_id, why in made.held:
            log.warning(
                "not credited to a lost create attempt=%s workspace=%s: %s",
                self.attempt.id,
                workspace_id,
                why,
            )
        seen.made = made

    def find_adoptable(self, _e: decide.FindAdoptable, seen: decide.Seen) -> None:
        attempt, family = self.attempt, self.unit.family()
        seen.family_answered = True
        titled = ownership.same_title(
            family, attempt.title, attempt.parent_workspace_id, self.svc.parents
        )
        eligible = tuple(m.id for m in titled if self._adoptable(m))
        seen.eligible, seen.known = eligible, tuple(m.id for m in titled)

    def take_candidate(self, e: decide.TakeCandidate, _seen: decide.Seen) -> None:
        """The candidate, claimed and its slot freed: saved with the first poll's outcome.
        The slot is bumped either way, so a reservation taken after its read conflicts."""
        attempt, unit = self.attempt, self.unit
        slot = unit.slot()
        if e.provenance is Provenance.ADOPTED or slot.holder != attempt.id:
            slot.note_adoption(attempt.id, e.workspace_id)  # no Freed to save: bump it so
        for workspace_id in e.inferred:  # on record as inferred: never emptied of projects
            attempt.note_inferred(workspace_id, recovery.evidence(attempt, self.svc))
        try:
            claim = unit.open_claim(e.workspace_id)
            claim.claim(attempt.brand_id, attempt.id)
        except AlreadyClaimed as exc:
            raise IntegrityError(str(exc)) from None  # decide again from fresh state
        attempt.accept_candidate(e.workspace_id, e.provenance, self.hop)
        slot.free(attempt.id)
        unit.touch(claim, slot)
        for shell in e.shells:
            attempt.record_created(shell, self.hop)  # the rest: surplus, owed a release

    def request_create(self, _e: decide.RequestCreate, seen: decide.Seen) -> None:
        """Record the create first (its title reserved), then call it: a create is never
        made that the log does not know of."""
        attempt, slot = self.attempt, self.unit.slot()
        attempt.request_create(self.hop, list(seen.known), self.svc.clock.now())
        slot.reserve(attempt.id, self.svc.clock.now(), self.svc.settings.create_grace_s)
        self.unit.touch(slot)
        try:
            self.unit.save()
        except IntegrityError:
            again = self.svc.attempt(attempt.id)
            conflict = (again.create_requested_hop, again.candidate_id)
            seen.creating, seen.create_conflict = True, conflict
            return
        answer: str | GatewayFault
        try:
            answer = self.svc.gateway.create_child(attempt.parent_workspace_id, attempt.title)
        except GatewayError as exc:
            answer = fault_of(exc)
        seen.creating, seen.created = True, answer

    def record_refusal(self, e: decide.RecordRefusal, seen: decide.Seen) -> None:
        """Saved on its own, before the create is made again: the create that got the
        429 is then never taken for an unconfirmed one, and a conflict on the next
        create's save means another delivery's create (`lost_create_race`)."""
        self.attempt.record_create_refused(self.hop, e.message)
        self.unit.save()
        seen.creating, seen.created, seen.created_again = False, None, True

    def record_created(self, e: decide.RecordCreated, seen: decide.Seen) -> None:
        self.created = e.workspace_id
        seen.record_failed = self._record_created()

    def note_unconfirmed(self, e: decide.NoteUnconfirmed, seen: decide.Seen) -> None:
        log.warning("create unconfirmed attempt=%s hop=%d", self.attempt.id, self.hop)
        self.attempt.record_create_unconfirmed(self.hop, e.message, e.answered)
        self.unit.family_read = None  # read before our create: read it again
        seen.creating, seen.made, seen.family_answered = False, None, False

    def poll(self, e: decide.Poll, seen: decide.Seen) -> None:
        answer: str | GatewayFault
        try:
            answer = self.svc.gateway.status(e.workspace_id)
        except GatewayError as exc:
            answer = fault_of(exc)
        seen.status = answer

    def _adoptable(self, member: FamilyMember) -> bool:
        """Ownership's verdict (`domain.ownership.judge`); its projects are read only of
        a ready workspace nobody else holds."""
        attempt = self.attempt
        if classify_status(member.status) is not StatusClass.READY:
            return False
        if recovery.claimed_by_other(self.svc, member.id, attempt.brand_id):
            return False
        facts = ownership.Facts(
            member.id,
            (attempt.parent_workspace_id, *self.svc.parents),
            same_title=True,
            status=member.status,
            projects=recovery.project_count(self.svc, member.id),
        )
        return ownership.judge(facts).owner is ownership.Owner.ADOPTABLE

    def _record_created(self) -> Fail | None:
        """Put what this run created on record: as the candidate, else as a surplus.

        Saved with the attempt's next save (with the first wait on the fresh path).
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

    # Endings: each returns the hop's outcome.

    def stand(self, step: Stand) -> HopOutcome:
        return self._outcome(step.outcome, step.detail, stand_down=step.why)

    def race(self, _step: decide.Race) -> HopOutcome:
        raise IntegrityError("a save lost a race: decide again")

    def refused(self, step: Refused) -> HopOutcome:
        self.attempt.record_create_refused(self.hop, step.detail)
        return self.wait(step.then)

    def wait(self, step: Wait | DeferStep | Fail) -> HopOutcome:
        """Wait (the next hop, or failed when the settle budget is spent), defer (the
        next hop, or failed at the deadline), or fail."""
        attempt, settings, now = self.attempt, self.svc.settings, self.svc.clock.now()
        ending: Schedule | Fail
        if isinstance(step, Wait):
            ending = waits.schedule_or_exhaust(
                self.hop,
                attempt.max_hop,
                settings.backoff,
                now,
                step.status,
                settled=attempt.settle_hops,
                spends=step.spends,
            )
        elif isinstance(step, DeferStep):
            ending = waits.defer_or_expire(
                self.hop,
                step,
                in_row=attempt.unanswered_in_row,
                unavailable_since=attempt.unavailable_since,
                deadline_at=attempt.created_on + timedelta(seconds=settings.deferral.deadline_s),
                now=now,
                deferral=settings.deferral,
                jitter=self.svc.jitter(),
            )
        else:
            ending = step
        if isinstance(ending, Fail):
            return self.fail(ending)
        self.observed = f"{'deferred' if ending.deferred else 'waiting'}: {ending.status}"
        attempt.schedule_hop(
            ending.hop,
            ending.not_before,
            ending.status,
            deferred=ending.deferred,
            spends=ending.spends,
            paced=ending.paced,
        )
        self._save()
        outcome, detail = decide.ended(ending)
        return self._outcome(outcome, detail, next_hop=ending.hop, delay_s=ending.delay_s)

    def fail(self, fail: Fail) -> HopOutcome:
        """Fail the attempt, then perform the release it owes.

        `Failed` is saved first (version-checked, with the candidate's claim
        marked `Releasing`): a concurrent delivery that promoted meanwhile makes
        this save conflict, so a promoted workspace is never emptied.
        """
        unit, attempt = self.unit, self.attempt
        self.observed = f"failing {fail.reason.value}: {fail.message}"
        attempt.fail(fail.reason, fail.message, self.hop)
        for workspace_id in attempt.owed_releases:
            claim = unit.claim(workspace_id)
            if claim is not None and claim.attempt_id == attempt.id:
                claim.begin_release(attempt.brand_id, attempt.id)
                unit.touch(claim)
        unit.touch(releases.adopted_claim_to_release(self.svc, attempt, unit.claim))
        slot = unit.slot()
        if rules.frees_slot(slot.holder, attempt.id, attempt.create_unresolved):
            slot.free(attempt.id)
            unit.touch(slot)
        self._save()
        releases.release_owed(self.svc, attempt, self.released)
        outcome, detail = decide.ended(fail)
        failure = fail.reason if outcome is Outcome.FAILED else None
        return self._outcome(outcome, detail, failure=failure)

    def promote(self, _step: Promote) -> HopOutcome:
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
        lifecycle.info(
            "brand promoted brand=%s attempt=%s workspace=%s hop=%d (%s)",
            attempt.brand_id,
            attempt.id,
            workspace_id,
            self.hop,
            attempt.provenance.value if attempt.provenance else "bound",
        )
        return self._outcome(Outcome.PROMOTED, "ready")

    def drop_existing(self, step: DropExisting) -> HopOutcome:
        """The bound workspace went terminal: unbind it; the next hop creates or adopts."""
        attempt, brand = self.attempt, self.unit.brand()
        brand.unbind(f"status {step.raw!r}")
        self.unit.touch(brand)
        claim = self.unit.claim(attempt.candidate_id or "")
        if claim is not None and claim.brand_id == attempt.brand_id:
            claim.release("bound workspace went terminal")
            self.unit.touch(claim)
        attempt.drop_candidate(step.raw, self.hop)
        return self.wait(step.then)

    def drop_candidate(self, step: DropCandidate) -> HopOutcome:
        """The candidate's creation failed: drop it; the next hop creates again. A
        created one is then owed a release; an adopted one's claim goes back."""
        self.unit.touch(releases.adopted_claim_to_release(self.svc, self.attempt, self.unit.claim))
        self.attempt.drop_candidate(step.raw, self.hop)
        return self.wait(step.then)

    def _save(self) -> None:
        self.unit.save()
        if self.created in self.attempt.created_ids:
            self.created = None  # on record at last

    def _outcome(
        self,
        outcome: Outcome,
        detail: str,
        *,
        next_hop: int | None = None,
        delay_s: float | None = None,
        stand_down: StandDown | None = None,
        failure: FailureReason | None = None,
    ) -> HopOutcome:
        attempt = self.attempt
        return HopOutcome(
            outcome=outcome,
            attempt_id=attempt.id,
            brand_id=attempt.brand_id,
            hop=self.hop,
            detail=detail,
            workspace_id=attempt.candidate_id,
            next_hop=next_hop,
            delay_s=delay_s,
            stand_down=stand_down,
            failure=failure,
            released=tuple(self.released),
        )
