"""What every run of a hop needs, whatever it does: its memory of what it changed,
its reads, and how it ends (the next hop, deferred or not, or failed).

`HopRun` (`infrastructure.usecases.hop`) builds on it; the decisions are `domain.hop`'s.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

from eventsourcing.domain import Aggregate

from domain import hop as decide
from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.claim import WorkspaceClaim
from domain.outcomes import HopOutcome, Outcome, StandDown
from domain.policies import FailureReason
from domain.ports import FamilyMember
from domain.slot import TitleSlot
from infrastructure.usecases import releases
from infrastructure.usecases.reads import ServiceReads


class HopBase:
    """One run of one hop of one attempt: its per-run memory, reads and endings."""

    def __init__(self, service: ServiceReads, attempt_id: UUID, hop: int) -> None:
        self.svc = service
        self.attempt_id = attempt_id
        self.hop = hop
        # A workspace this run created and has not yet seen recorded: it must
        # end up the attempt's candidate or a recorded surplus, never forgotten.
        self.created: str | None = None
        self._family: list[FamilyMember] | None = None
        self._claim_read_needed = False
        self.released: list[str] = []
        # Aggregates changed alongside a just-accepted candidate (its claim, the
        # title slot): saved with the attempt's next save, which records the
        # candidate and the first poll's outcome in one transaction.
        self.pending: list[Aggregate] = []
        # The title slot as this run last saved it: no need to read it back.
        self._saved_slot: TitleSlot | None = None
        # The brand as read together with the title slot (one query instead of
        # two); a promotion saves it version-checked, so a brand that changed
        # meanwhile makes that save conflict and the next round reads afresh.
        self._brand: Brand | None = None
        # The title slot and the brand, read with the attempt (when its facts
        # were known): versions as of the start of this round.
        self._context: tuple[TitleSlot, Brand] | None = None

    @property
    def now(self) -> datetime:
        return self.svc.clock.now()

    @property
    def grace_s(self) -> float:
        return self.svc.settings.create_grace_s

    def _save(self, attempt: ProvisioningAttempt, *others: Aggregate) -> None:
        self.svc.app.save(attempt, *self.pending, *others)
        self.pending = []
        if self.created in attempt.created_ids:
            self.created = None  # on record at last

    def _claim(self, workspace_id: str) -> WorkspaceClaim | None:
        """The workspace's claim: the copy already changed in this run, else a read."""
        for aggregate in self.pending:
            if isinstance(aggregate, WorkspaceClaim) and aggregate.workspace_id == workspace_id:
                return aggregate
        return self.svc.claim(workspace_id)

    def _slot(self, attempt: ProvisioningAttempt) -> TitleSlot:
        """The title slot: the copy already changed in this run, else the one read
        with the attempt at the start of this round, else a fresh read."""
        for aggregate in self.pending:
            if isinstance(aggregate, TitleSlot):
                return aggregate
        if self._saved_slot is not None:
            return self._saved_slot
        if self._context is not None:
            return self._context[0]
        return self.svc.slot(attempt.parent_workspace_id, attempt.title)

    def _family_of(self, attempt: ProvisioningAttempt) -> list[FamilyMember]:
        if self._family is None:
            self._family = self.svc.family(attempt.parent_workspace_id, attempt.title)
        return self._family

    # Endings.

    def _end(
        self,
        attempt: ProvisioningAttempt,
        step: decide.Wait | decide.Defer | decide.Fail,
        touched: list[Aggregate] | None = None,
    ) -> HopOutcome:
        """Wait (the next hop, or failed when the settle budget is spent), defer (the
        next hop, or failed at the deadline), or fail."""
        settings = self.svc.settings
        ending: decide.Schedule | decide.Fail
        if isinstance(step, decide.Wait):
            ending = decide.schedule_or_exhaust(
                self.hop, attempt.max_hop, settings.backoff, self.now, step.status,
                settled=attempt.settle_hops, spends=step.spends,
            )  # fmt: skip
        elif isinstance(step, decide.Defer):
            ending = decide.defer_or_expire(
                self.hop,
                step,
                # The family answered in this run: the gateway is up, only this call
                # went unanswered (a create throttled): the backoff starts again.
                in_row=0 if self._family is not None else attempt.deferred_in_row,
                unavailable_since=attempt.unavailable_since,
                deadline_at=attempt.created_on + timedelta(seconds=settings.deferral.deadline_s),
                now=self.now,
                deferral=settings.deferral,
                jitter=self.svc.jitter(),
            )
        else:
            ending = step
        if isinstance(ending, decide.Fail):
            return self._fail(attempt, ending, touched)
        attempt.schedule_hop(ending.hop, ending.not_before, ending.status,
                             deferred=ending.deferred, spends=ending.spends)  # fmt: skip
        self._save(attempt, *(touched or []))
        outcome, detail = decide.ended(ending)
        return self._outcome(attempt, outcome, detail, next_hop=ending.hop, delay_s=ending.delay_s)

    def _fail(
        self,
        attempt: ProvisioningAttempt,
        fail: decide.Fail,
        touched: list[Aggregate] | None = None,
    ) -> HopOutcome:
        """Fail the attempt, then perform the release it owes.

        `Failed` is saved first (version-checked, with the candidate's claim
        marked `Releasing`): a concurrent delivery that promoted meanwhile makes
        this save conflict, so a promoted workspace is never emptied.
        """
        touched = list(touched or [])
        attempt.fail(fail.reason, fail.message, self.hop)
        for workspace_id in attempt.owed_releases:
            claim = self._claim(workspace_id)
            if claim is not None and claim.attempt_id == attempt.id:
                claim.begin_release(attempt.brand_id, attempt.id)
                touched.append(claim)
        claim = releases.adopted_claim_to_release(self.svc, attempt, self._claim)
        if claim is not None:
            touched.append(claim)
        touched = [t for t in touched if t not in self.pending]
        slot = self._slot(attempt)
        if slot.holder == attempt.id and not attempt.create_unresolved:
            slot.free(attempt.id)
            if slot not in self.pending:
                touched.append(slot)
        self._save(attempt, *touched)
        releases.release_owed(self.svc, attempt, self.released)
        outcome, detail = decide.ended(fail)
        failure = fail.reason if outcome is Outcome.FAILED else None
        return self._outcome(attempt, outcome, detail, failure=failure)

    def _outcome(
        self,
        attempt: ProvisioningAttempt,
        outcome: Outcome,
        detail: str,
        *,
        workspace_id: str | None = None,
        next_hop: int | None = None,
        delay_s: float | None = None,
        stand_down: StandDown | None = None,
        failure: FailureReason | None = None,
    ) -> HopOutcome:
        return HopOutcome(
            outcome=outcome,
            attempt_id=attempt.id,
            brand_id=attempt.brand_id,
            hop=self.hop,
            detail=detail,
            workspace_id=workspace_id or attempt.candidate_id,
            next_hop=next_hop,
            delay_s=delay_s,
            stand_down=stand_down,
            failure=failure,
            released=tuple(self.released),
        )
