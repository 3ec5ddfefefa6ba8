"""The provisioning service: the use cases, over the event store and the gateway.

Request path (fast, no gateway calls; `infrastructure.usecases.commands`):
    request_provisioning(brand_id, title, parent, requested_at=None) -> attempt id
    deactivate(brand_id, requested_at=None)

Off the request path (what the worker runs, one short step at a time):
    run_hop(attempt_id, hop) -> HopOutcome     `infrastructure.usecases.hop`,
                                               deciding with `domain.hop`
    release(attempt_id)        the owed release of an attempt that ended unpromoted
    decommission(brand_id)     empty, unbind and unclaim a deactivated brand's workspace
        -> Decommissioned      (those two: `infrastructure.usecases.releases`,
                               deciding with `domain.releases`)
    expire(attempt_id, t)      fail an attempt still pending past its deadline
    fail_internal(id, hop, e)  fail an attempt whose hop raised a bug on every retry
                               (those two: `infrastructure.usecases.endings`)

Every use case loads, observes through the ports, decides, and saves: every
state change is ONE `Application.save` of all the aggregates it touches. A
writer that loses a race gets `IntegrityError`, reloads and decides again
(`retry_on_conflict`, at most `max_rounds` times per call). Gateway calls never
happen while a database transaction is open. A database failure propagates
unchanged: the attempt is untouched and the caller retries the whole step later.
"""

from __future__ import annotations

import logging
from datetime import datetime
from uuid import UUID

from domain.outcomes import HopOutcome, Outcome
from domain.policies import FailureReason
from domain.releases import Decommissioned
from infrastructure.usecases import commands, endings, releases
from infrastructure.usecases.commands import Deactivation
from infrastructure.usecases.hop import HopRun
from infrastructure.usecases.reads import ServiceReads

log = logging.getLogger("provisioner.engine")


class ProvisioningService(ServiceReads):
    """The use cases; the reads (`load`, `brand`, `attempt`, `slot`, `claim`, ...)
    are `ServiceReads`'."""

    def request_provisioning(
        self,
        brand_id: str,
        title: str,
        parent_workspace_id: str,
        requested_at: datetime | None = None,
    ) -> UUID:
        """Begin an attempt for the brand (see `commands.request_provisioning`)."""
        return commands.request_provisioning(
            self, brand_id, title, parent_workspace_id, requested_at
        )

    def deactivate(
        self, brand_id: str, requested_at: datetime | None = None, *, purge_now: bool = False
    ) -> Deactivation:
        """Record the deactivation and cancel a pending attempt (see `commands.deactivate`)."""
        return commands.deactivate(self, brand_id, requested_at, purge_now=purge_now)

    def run_hop(self, attempt_id: UUID, hop: int) -> HopOutcome:
        outcome = HopRun(self, attempt_id, hop).run()
        level, reason, advice = hop_line(outcome)
        log.log(
            level,
            "hop done brand=%s attempt=%s hop=%d outcome=%s%s workspace=%s detail=%s%s",
            outcome.brand_id,
            outcome.attempt_id,
            outcome.hop,
            outcome.outcome.value,
            f"({outcome.stand_down.value})" if outcome.stand_down else "",
            outcome.workspace_id,
            outcome.detail,
            advice,
            extra={
                "brand": outcome.brand_id,
                "attempt": str(outcome.attempt_id),
                "hop": outcome.hop,
                "outcome": outcome.outcome.value,
                "reason": reason,
            },
        )
        return outcome

    def release(self, attempt_id: UUID) -> tuple[str, ...]:
        """Perform what an attempt that ended unpromoted still owes; safe to repeat."""
        return releases.release(self, attempt_id)

    def expire(self, attempt_id: UUID, started_before: datetime) -> bool:
        """Fail a pending attempt that started before `started_before` (its deadline)."""
        return endings.expire(self, attempt_id, started_before)

    def fail_internal(self, attempt_id: UUID, hop: int, error: str) -> bool:
        """Fail an attempt whose hop raised an unexpected `error` on every retry."""
        return endings.fail_internal(self, attempt_id, hop, error)

    def decommission(self, brand_id: str) -> Decommissioned:
        """Empty a deactivated brand's workspace, then unbind it and release its claim;
        what it did, typed (emptied, nothing bound, not due, refused, unbound)."""
        return releases.decommission(self, brand_id)


__all__ = [
    "ProvisioningService",
]


def hop_line(outcome: HopOutcome) -> tuple[int, str | None, str]:
    """A hop decision's log level, reason and advice, from its kind alone (never its
    detail's text): ERROR for a failed attempt (`unauthorized`: the token needs
    rotating), INFO for every other decision. A deferral is INFO too: the gateway's
    outage or throttle is logged once by the pace (open/close), or an outage would
    flood the log with the hops it holds back."""
    if outcome.outcome is Outcome.FAILED:
        if outcome.failure is FailureReason.UNAUTHORIZED:
            return logging.ERROR, outcome.reason, "; the gateway refused the token: rotate it"
        return logging.ERROR, outcome.reason, ""
    return logging.INFO, outcome.reason, ""
