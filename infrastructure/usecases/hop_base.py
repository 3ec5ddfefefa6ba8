"""What every run of a hop needs, whatever it does: what it keeps across rounds, its
round's `HopUnit`, and how it ends (the next hop, deferred or not, or failed).

`HopRun` (`infrastructure.usecases.hop`) builds on it; the decisions are `domain.hop`'s.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

from domain import hop as decide
from domain.attempt import ProvisioningAttempt
from domain.outcomes import HopOutcome, Outcome, StandDown
from domain.policies import FailureReason
from infrastructure.usecases import releases
from infrastructure.usecases.reads import ServiceReads
from infrastructure.usecases.unit import HopUnit


class HopBase:
    """One run of one hop of one attempt: what outlives a round, and its endings."""

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

    @property
    def attempt(self) -> ProvisioningAttempt:
        return self.unit.attempt

    @property
    def now(self) -> datetime:
        return self.svc.clock.now()

    @property
    def grace_s(self) -> float:
        return self.svc.settings.create_grace_s

    def _save(self) -> None:
        self.unit.save()
        if self.created in self.attempt.created_ids:
            self.created = None  # on record at last

    def _end(self, step: decide.Wait | decide.Defer | decide.Fail) -> HopOutcome:
        """Wait (the next hop, or failed when the settle budget is spent), defer (the
        next hop, or failed at the deadline), or fail."""
        attempt, settings = self.attempt, self.svc.settings
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
                # The family answered in this round: the gateway is up, only this call
                # went unanswered (a create throttled): the backoff starts again.
                in_row=0 if self.unit.family_read is not None else attempt.deferred_in_row,
                unavailable_since=attempt.unavailable_since,
                deadline_at=attempt.created_on + timedelta(seconds=settings.deferral.deadline_s),
                now=self.now,
                deferral=settings.deferral,
                jitter=self.svc.jitter(),
            )
        else:
            ending = step
        if isinstance(ending, decide.Fail):
            return self._fail(ending)
        self.observed = f"{'deferred' if ending.deferred else 'waiting'}: {ending.status}"
        attempt.schedule_hop(ending.hop, ending.not_before, ending.status,
                             deferred=ending.deferred, spends=ending.spends)  # fmt: skip
        self._save()
        outcome, detail = decide.ended(ending)
        return self._outcome(outcome, detail, next_hop=ending.hop, delay_s=ending.delay_s)

    def _fail(self, fail: decide.Fail) -> HopOutcome:
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
        if slot.holder == attempt.id and not attempt.create_unresolved:
            slot.free(attempt.id)
            unit.touch(slot)
        self._save()
        releases.release_owed(self.svc, attempt, self.released)
        outcome, detail = decide.ended(fail)
        failure = fail.reason if outcome is Outcome.FAILED else None
        return self._outcome(outcome, detail, failure=failure)

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
