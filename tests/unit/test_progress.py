"""`domain.progress`: why an attempt is where it is and what comes next, by table."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from domain.hop import CREATED_WAIT
from domain.policies import AttemptState, FailureReason
from domain.progress import AttemptFacts, BrandStanding, Fleet, clock, exhausted_at, progress
from domain.waits import Backoff

NOW = datetime(2026, 12, 1, 10, 2, 0, tzinfo=UTC)
BACKOFF = Backoff(base_s=5.0, max_requeues=5)  # waits 5, 10, 20, 40, 80 s
PENDING = AttemptFacts(
    state=AttemptState.PENDING,
    hop=3,
    settle_hops=3,
    max_hop=5,
    parent_id="org-parent",
    next_hop_at=NOW + timedelta(seconds=5),
    deadline_at=NOW + timedelta(days=1),
)


def failed(reason: FailureReason | None, **more: object) -> AttemptFacts:
    return replace(PENDING, state=AttemptState.FAILED, failure_reason=reason,
                   next_hop_at=None, **more)  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize(
    ("facts", "reason", "advice"),
    [
        (failed(FailureReason.UNAUTHORIZED), "unauthorized",
         "rotate the token (PROVISIONER_GATEWAY_TOKEN), then `provisioner retry --failed`"),
        (failed(FailureReason.DEADLINE, unavailable_since=NOW - timedelta(hours=3)),
         "deadline",
         "the gateway is down since 07:02:00; retry with `provisioner retry --failed` "
         "once it answers"),
        (failed(FailureReason.DEADLINE), "deadline", "`provisioner dead-letters list`"),
        (failed(FailureReason.DEADLINE, unavailable_since=NOW - timedelta(hours=11, minutes=2)),
         "deadline", "down since 2026-11-30 23:00:00"),
        (failed(FailureReason.EXHAUSTED), "exhausted", "starts a fresh attempt"),
        (failed(FailureReason.TERMINAL_STATUS), "terminal_status", "failed for good"),
        (failed(FailureReason.AMBIGUOUS), "ambiguous", "keep the right one"),
        (failed(FailureReason.REJECTED), "rejected", "check the brand's title and parent"),
        (failed(FailureReason.GATEWAY_BUG), "gateway_bug", "gateway's owners"),
        (failed(FailureReason.INTERNAL_ERROR), "internal_error", "traceback"),
        (failed(None), None, "no reason on record"),
        (replace(PENDING, state=AttemptState.PROMOTED, next_hop_at=None), None, "nothing to do"),
        (replace(PENDING, state=AttemptState.CANCELLED), None, "deactivated"),
        (replace(PENDING, state=AttemptState.SUPERSEDED), None, "newer attempt"),
        (failed(FailureReason.REJECTED, parent_allowed=False), "rejected",
         "its parent org-parent is not one of PROVISIONER_PARENT_IDS"),
        (replace(PENDING, parent_allowed=False), "foreign_parent", "PROVISIONER_PARENT_IDS"),
        (replace(PENDING, parent_allowed=True), None, "waiting for the workspace"),
        # Just created (decision 049): its first poll waits, and the advice says why.
        (replace(PENDING, hop=1, settle_hops=0, last_status=CREATED_WAIT), None,
         "created: the workspace is given time to settle before its first poll"),
    ],
)  # fmt: skip
def test_each_reason_comes_with_its_advice(
    facts: AttemptFacts, reason: str | None, advice: str
) -> None:
    said = progress(facts, NOW, BACKOFF)

    assert said.reason == reason
    assert said.advice is not None
    assert advice in said.advice
    if facts.state is not AttemptState.PENDING:
        assert (said.step, said.deferral, said.budget_left) == (None, None, None)


@pytest.mark.parametrize(
    ("facts", "step", "budget_left"),
    [
        # 3 settle hops used of 5: the next is the 4th answered hop of 6; if it and the
        # one after find the workspace settling, waits of 40 and 80 s remain.
        (PENDING, "hop 4 of 6, next at 10:02:05, fails after 10:04:05 unless confirmed", 2),
        (replace(PENDING, hop=0, settle_hops=0, next_hop_at=NOW),
         "hop 1 of 6, next at 10:02:00, fails after 10:04:35 unless confirmed", 5),
        (replace(PENDING, hop=5, settle_hops=5),
         "hop 6 of 6, next at 10:02:05, fails after 10:02:05 unless confirmed", 0),
        # The deadline comes first.
        (replace(PENDING, deadline_at=NOW + timedelta(seconds=60)),
         "hop 4 of 6, next at 10:02:05, fails after 10:03:00 unless confirmed", 2),
        # Deferrals and graces are hops too, but spend none of the budget.
        (replace(PENDING, hop=9),
         "hop 4 of 6 (hop #9 in all), next at 10:02:05, fails after 10:04:05 unless confirmed",
         2),
        (replace(PENDING, next_hop_at=NOW - timedelta(seconds=30)),  # late, not overdue
         "hop 4 of 6, next at 10:01:30, fails after 10:03:30 unless confirmed", 2),
        (replace(PENDING, next_hop_at=NOW - timedelta(seconds=70)),
         "hop 4 of 6, next at 10:00:50 (overdue), fails after 10:02:50 unless confirmed", 2),
        (replace(PENDING, next_hop_at=NOW + timedelta(days=1), deadline_at=None),
         "hop 4 of 6, next at 2026-12-02 10:02:00, fails after 2026-12-02 10:04:00 "
         "unless confirmed", 2),
    ],
)  # fmt: skip
def test_a_pending_attempt_says_its_hop_budget_and_times(
    facts: AttemptFacts, step: str, budget_left: int
) -> None:
    said = progress(facts, NOW, BACKOFF)

    assert said.step == step
    assert said.budget_left == budget_left
    assert said.next_hop_at == facts.next_hop_at
    assert said.overdue == ("overdue" in step)


def test_an_overdue_hop_says_who_would_run_it() -> None:
    said = progress(replace(PENDING, next_hop_at=NOW - timedelta(seconds=70)), NOW, BACKOFF)

    assert said.advice is not None
    assert "overdue" in said.advice
    assert "provisioner reconcile" in said.advice


def test_deferrals_in_a_row_say_since_when_the_gateway_is_silent() -> None:
    silent = replace(
        PENDING,
        hop=10,
        deferred_in_row=7,
        last_status="gateway unavailable: family: HTTP 503",
        unavailable_since=datetime(2026, 12, 1, 10, 2, 0, tzinfo=UTC),
        next_hop_at=NOW + timedelta(seconds=30),
    )
    said = progress(silent, NOW + timedelta(seconds=5), BACKOFF)
    unknown_since = progress(replace(silent, unavailable_since=None, last_status=""), NOW, BACKOFF)

    assert said.reason == "deferred"
    assert said.deferral == "deferred ×7: gateway unavailable: family: HTTP 503 since 10:02:00"
    assert said.advice is not None
    assert "settle budget untouched" in said.advice
    assert unknown_since.deferral == "deferred ×7: gateway unavailable"
    assert progress(PENDING, NOW, BACKOFF).deferral is None


def test_the_fail_time_follows_the_backoff_and_the_budget() -> None:
    assert exhausted_at(replace(PENDING, next_hop_at=None), BACKOFF) is None
    # A budget recorded larger than the backoff allows ends at the backoff's.
    wide = replace(PENDING, max_hop=9)
    assert exhausted_at(wide, BACKOFF) == exhausted_at(PENDING, BACKOFF)
    assert exhausted_at(PENDING, Backoff(base_s=1.0, max_requeues=5)) == (
        NOW + timedelta(seconds=5 + 8 + 16)
    )


def test_times_carry_their_date_only_on_another_day() -> None:
    assert clock(NOW, NOW) == "10:02:00"
    assert clock(NOW - timedelta(hours=11), NOW) == "2026-11-30 23:02:00"
    assert progress(PENDING, NOW, BACKOFF).as_dict()["budget_left"] == 2


# Every state a brand and its current attempt can be in together, and what a person
# is told: the brand's own state first, then the deployment's, then the attempt's.
ACTIVE_BOUND = BrandStanding(active=True, bound=True)
ACTIVE_UNBOUND = BrandStanding(active=True, bound=False)
KEPT = BrandStanding(active=False, bound=True, to_be_emptied_at=NOW + timedelta(days=2))
EMPTYING = BrandStanding(active=False, bound=True, to_be_emptied_at=NOW - timedelta(minutes=1))
REFUSED = BrandStanding(active=False, bound=True, emptying_refused="HTTP 423 locked")
GONE = BrandStanding(active=False, bound=False)
RELAY_DEAD = Fleet(relay_silent_since=NOW - timedelta(minutes=3))
PROMOTED = replace(PENDING, state=AttemptState.PROMOTED, next_hop_at=None)
CANCELLED = replace(PENDING, state=AttemptState.CANCELLED, next_hop_at=None)
SUPERSEDED = replace(PENDING, state=AttemptState.SUPERSEDED, next_hop_at=None)
OVERDUE = replace(PENDING, next_hop_at=NOW - timedelta(minutes=5))
DEFERRED = replace(PENDING, deferred_in_row=3, last_status="HTTP 503")
RECREATING = replace(PENDING, last_status="creation_failed")
THROTTLED = replace(PENDING, deferred_in_row=2, last_status="status: throttled (HTTP 429)")

ADVICE_TABLE = [
    ("active, unbound, pending", ACTIVE_UNBOUND, PENDING, None, "waiting for the workspace"),
    ("active, unbound, overdue", ACTIVE_UNBOUND, OVERDUE, None, "is a worker running?"),
    ("active, unbound, deferred", ACTIVE_UNBOUND, DEFERRED, None, "does not answer"),
    ("active, unbound, throttled", ACTIVE_UNBOUND, THROTTLED, None,
     "throttled by the gateway (429)"),
    ("active, unbound, creation failed", ACTIVE_UNBOUND, RECREATING, None,
     "creation failed: a new one is created"),
    ("active, unbound, relay dead", ACTIVE_UNBOUND, PENDING, RELAY_DEAD,
     "the relay is silent since 09:59:00"),
    ("active, bound, re-confirming", ACTIVE_BOUND, PENDING, None, "waiting for the workspace"),
    ("active, bound, promoted", ACTIVE_BOUND, PROMOTED, None, "bound; nothing to do"),
    ("active, unbound since, promoted", ACTIVE_UNBOUND, PROMOTED, None, "was unbound since"),
    ("active, unbound, failed", ACTIVE_UNBOUND, failed(FailureReason.EXHAUSTED), None,
     "provisioner retry --failed"),
    ("active, bound, failed", ACTIVE_BOUND, failed(FailureReason.TERMINAL_STATUS), None,
     "failed for good"),
    ("active, unbound, superseded", ACTIVE_UNBOUND, SUPERSEDED, None, "newer attempt"),
    ("deactivated, kept, promoted", KEPT, PROMOTED, None,
     "kept until 2026-12-03 10:02:00, then emptied"),
    ("deactivated, emptying, promoted", EMPTYING, PROMOTED, None, "is being emptied"),
    ("deactivated, refused, promoted", REFUSED, PROMOTED, None, "--purge-now"),
    ("deactivated, emptied, promoted", GONE, PROMOTED, None, "holds no workspace"),
    ("deactivated, never bound, cancelled", GONE, CANCELLED, None, "holds no workspace"),
    ("deactivated, kept, cancelled", KEPT, CANCELLED, None, "kept until"),
    ("deactivated, failed", GONE, failed(FailureReason.EXHAUSTED), None, "holds no workspace"),
    ("deactivated, relay dead", GONE, CANCELLED, RELAY_DEAD, "holds no workspace"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("brand", "facts", "deployment", "advice"),
    [pytest.param(*row[1:], id=row[0]) for row in ADVICE_TABLE],
)
def test_the_advice_in_every_state_of_brand_and_attempt(
    brand: BrandStanding, facts: AttemptFacts, deployment: Fleet | None, advice: str
) -> None:
    said = progress(facts, NOW, BACKOFF, brand, deployment)

    assert said.advice is not None
    assert advice in said.advice, said.advice
    if not brand.active or facts.state is not AttemptState.PROMOTED or not brand.bound:
        assert "nothing to do" not in said.advice or "holds no workspace" in said.advice
    assert "PROVISIONER_MAX_REQUEUES" not in said.advice
