"""One run of one hop of one attempt (docs/architecture.md): a loop around a decider.

Each round loads a fresh `HopUnit`, then asks `domain.hop.decide` what comes
next, performs it (`HopEffects`: a read, a gateway call, a change recorded on the
aggregates), notes what came back and asks again, until the answer is an ending,
which is recorded, saved and reported. The order of a hop lives in `decide`
alone. A round whose save loses a race starts afresh (`retry_on_conflict`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from domain import hop as decide
from domain import steps
from domain.outcomes import HopOutcome
from domain.ports import GatewayError, fault_of
from infrastructure.usecases.hop_effects import HopEffects
from infrastructure.usecases.retry import retry_on_conflict
from infrastructure.usecases.unit import HopUnit

log = logging.getLogger("provisioner.engine")

MAX_EFFECTS = 32  # a round that asks for more is a bug in the decider, not a slow gateway


# What each effect is performed by, and each ending recorded by.
PERFORM: dict[type, Callable[[Any, Any, decide.Seen], None]] = {
    decide.RecordLate: HopEffects.record_late,
    decide.ReleaseOwed: HopEffects.release_owed,
    decide.ReadSlot: HopEffects.read_slot,
    decide.CreditLostCreates: HopEffects.credit_lost_creates,
    decide.FindAdoptable: HopEffects.find_adoptable,
    decide.TakeCandidate: HopEffects.take_candidate,
    decide.RequestCreate: HopEffects.request_create,
    decide.RecordRefusal: HopEffects.record_refusal,
    decide.RecordCreated: HopEffects.record_created,
    decide.NoteUnconfirmed: HopEffects.note_unconfirmed,
    decide.Poll: HopEffects.poll,
}
END: dict[type, Callable[[Any, Any], HopOutcome]] = {
    steps.Stand: HopEffects.stand,
    decide.Race: HopEffects.race,
    steps.Wait: HopEffects.wait,
    steps.Defer: HopEffects.wait,
    steps.Fail: HopEffects.fail,
    steps.Refused: HopEffects.refused,
    steps.Promote: HopEffects.promote,
    steps.DropExisting: HopEffects.drop_existing,
    steps.DropCandidate: HopEffects.drop_candidate,
}


class HopRun(HopEffects):
    """One run of one hop of one attempt: decide, perform, note, until it ends."""

    def run(self) -> HopOutcome:
        contended = f"attempt {self.attempt_id} is contended; retry the hop later"
        outcome = retry_on_conflict(
            self.svc.settings.max_rounds, self._round, contended, self._raced
        )
        if outcome.stand_down is not None and self.observed is not None:
            why = outcome.stand_down.value
            log.info(
                "hop stood down after a race attempt=%s hop=%d: %s; it had observed: %s",
                self.attempt_id,
                self.hop,
                why,
                self.observed,
            )
        return outcome

    def _round(self) -> HopOutcome:
        self.unit = HopUnit(self.svc, self.attempt_id)
        self._view = None  # a fresh unit: a fresh view
        seen = decide.Seen()
        for _ in range(MAX_EFFECTS):
            step = decide.decide(self.view(), seen)
            perform = PERFORM.get(type(step))
            if perform is None:
                return END[type(step)](self, step)
            try:
                perform(self, step, seen)
            except GatewayError as exc:  # a read while acquiring: its fault decides
                seen.fault = fault_of(exc)
        raise RuntimeError(f"hop {self.hop} of attempt {self.attempt_id} did not end")

    def _raced(self) -> None:
        seen = f" (it had observed: {self.observed})" if self.observed else ""
        log.info(
            "hop raced another writer; deciding again attempt=%s hop=%d%s",
            self.attempt_id,
            self.hop,
            seen,
        )
