"""Giving up on a pending attempt from outside its hops, as the reconciler and the
consumer do: its deadline passed (`expire`), or its hop raised a bug on every retry
(`fail_internal`). Saved like any failure, version checked; what the attempt owes
is released by the release message the relay publishes for every `Failed`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from uuid import UUID

from domain.attempt import ProvisioningAttempt
from domain.policies import FailureReason
from infrastructure.usecases.reads import ServiceReads
from infrastructure.usecases.retry import retry_on_conflict

log = logging.getLogger("provisioner.engine")


def expire(svc: ServiceReads, attempt_id: UUID, started_before: datetime) -> bool:
    """Fail a pending attempt that started before `started_before`: its deadline.

    The reconciler's backstop, for an attempt whose hops cannot run (its message
    dead-lettered again and again); a hop deferred that long fails itself. A hop
    that commits first wins; one that commits later finds the attempt failed and
    stands down. Returns whether it failed it.
    """

    def why(attempt: ProvisioningAttempt) -> str | None:
        if attempt.created_on >= started_before:
            return None
        age_s = (svc.clock.now() - attempt.created_on).total_seconds()
        return f"still pending {age_s:.0f} s after it started (hop {attempt.expected_hop})"

    return _give_up(svc, attempt_id, FailureReason.DEADLINE, why)


def fail_internal(svc: ServiceReads, attempt_id: UUID, hop: int, error: str) -> bool:
    """Fail an attempt whose hop raised an unexpected exception on every retry (a
    bug, not the gateway and not the database), naming it, instead of leaving it
    pending until its deadline. Only while the attempt still expects that hop."""

    def why(attempt: ProvisioningAttempt) -> str | None:
        if attempt.expected_hop != hop:
            return None  # another delivery moved it on: this one is stale
        return f"hop {hop} raised {error} on every retry"

    return _give_up(svc, attempt_id, FailureReason.INTERNAL_ERROR, why)


def _give_up(
    svc: ServiceReads,
    attempt_id: UUID,
    reason: FailureReason,
    why: Callable[[ProvisioningAttempt], str | None],
) -> bool:
    def step() -> bool:
        attempt = svc.attempt(attempt_id)
        message = None if attempt.is_terminal else why(attempt)
        if message is None:
            return False
        attempt.fail(reason, message, attempt.expected_hop)
        svc.app.save(attempt)
        fields = {"attempt": str(attempt_id), "outcome": "failed", "reason": reason.value}
        log.error(
            "attempt failed attempt=%s reason=%s: %s",
            attempt_id,
            reason.value,
            message,
            extra=fields,
        )
        return True

    return retry_on_conflict(svc.settings.max_rounds, step, _attempt_contended(attempt_id))


def _attempt_contended(attempt_id: UUID) -> str:
    return f"attempt {attempt_id} is being changed concurrently; retry"
