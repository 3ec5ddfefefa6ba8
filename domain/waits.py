"""Every wait, backoff and hold, and why it is taken: pure functions of plain values.

To change how a throttle (or any wait) is retried, this is the module. The
layers around it only apply what it says: the hop's use case schedules the next
hop, the gateway adapter sleeps between a read's tries, the worker republishes
a message, the fleet's pace holds a call.

One vocabulary (`Why`), the same in every layer:

- **throttled**: the gateway answered 429. Nothing was done. Its Retry-After
  (believed up to `RETRY_AFTER_CAP_S`, `believed_retry_after`) holds the call
  that got it: while the pace limits the fleet and within the call's patience,
  its thread waits it and the call is made once more (`domain.pacing.waits_told`;
  a create by the hop, on record);
  else, or at a second 429, the
  hop is deferred until then (`Deferral`), a refused-for-now message waits that
  long (`release_wait_s`), and the fleet's pace holds every call for it, at most
  `retry_after_max_s` (`hold_s`), once 429s are dense enough to be a rate signal
  (domain/pacing.py's evidence rule).
- **unanswered**: no answer at all (refused, timed out, dropped, a 5xx, the
  circuit open). A read or a delete is tried again inside its call, after a
  doubling pause (`doubled`); a create never is. Then the hop is deferred on a
  jittered, doubling backoff (`Deferral`), without spending the settle budget,
  until the attempt's deadline (`defer_or_expire`).
- **refused for now**: a command or a release refused only for now
  (`REFUSED_FOR_NOW`: a decommission in progress, a release the gateway did not
  answer). The worker republishes it on its own schedule (`WAIT_DELAYS_S`, about
  an hour in all), or after the Retry-After it was told (`TOLD_DELAYS_S`).
- **paced**: a call the fleet's own pace held back for its turn (its rate, a
  shared Retry-After). The gateway is answering: the call waits for that turn,
  up to a quarter more (so held hops spread out), not an outage's backoff.

And one that is no hold: the gateway answered **not yet** (a workspace still
settling). That spends the settle budget, `Backoff`: 5, 10, 20, 40, 80 s by
default (`schedule_or_exhaust`). The two budgets are decision 006.

The worker's own failures (the database down, contention, a bug that may pass)
retry on `RETRY_DELAYS_S` (about 200 s); a process reconnecting to the database
or the broker pauses `doubled` and `jittered` too (infrastructure/failures.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import ClassVar

from domain.errors import RetryLater
from domain.policies import FailureReason
from domain.ports import TransientGatewayError
from domain.steps import Defer, Fail, Schedule


class Why(StrEnum):
    """Why a call, a hop or a message waits (see the module's text)."""

    THROTTLED = "throttled"  # a 429, with or without a Retry-After
    UNANSWERED = "unanswered"  # no answer: refused, timed out, dropped, 5xx, circuit open
    REFUSED_FOR_NOW = "refused for now"  # a command or a release to try again later
    PACED = "paced"  # held for the fleet's own turn


def told(retry_after_s: float, paced: bool) -> Why | None:
    """What a wait a call was told of is: the fleet's own turn (`paced`), a
    Retry-After (`throttled`), or None when it was told nothing."""
    if retry_after_s <= 0:
        return None
    return Why.PACED if paced else Why.THROTTLED


# -- the arithmetic every backoff shares -----------------------------------------


def doubled(base_s: float, n: int) -> float:
    """The n-th (0-based) step of a doubling backoff: base * 2**n."""
    return base_s * 2.0**n


def jittered(nominal_s: float, jitter: float) -> float:
    """`jitter` in [0, 1): between half and all of `nominal_s`, so that many waiters
    do not come back in step."""
    return nominal_s * (0.5 + 0.5 * jitter)


def hold_s(retry_after_s: float, longest_s: float) -> float:
    """A Retry-After as a hold: at most `longest_s` (PROVISIONER_RETRY_AFTER_MAX_S):
    one answer may not hold a hop, or the whole fleet, for an hour."""
    return min(retry_after_s, longest_s)


# -- throttled: the gateway's Retry-After -----------------------------------------

RETRY_AFTER_CAP_S = 3600.0  # a Retry-After beyond an hour is not believed


def believed_retry_after(seconds: float) -> float:
    """A Retry-After the gateway gave, in seconds: 0 when it is past or not a number,
    at most `RETRY_AFTER_CAP_S`."""
    if not math.isfinite(seconds) or seconds <= 0:
        return 0.0
    return min(seconds, RETRY_AFTER_CAP_S)


# -- not yet: the settle budget ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Backoff:
    """The settle budget: after the n-th "not yet" (n from 0) the next hop waits
    base * 2**n; at most `max_requeues` such waits. A wait that spends none (the
    first after a create) waits base. No defaults: PROVISIONER_BACKOFF_BASE_S and
    PROVISIONER_MAX_REQUEUES give them."""

    base_s: float
    max_requeues: int

    def __post_init__(self) -> None:
        if self.base_s < 0:
            raise ValueError("backoff base must be >= 0 seconds")
        if not 0 <= self.max_requeues <= 30:
            raise ValueError("max requeues must be between 0 and 30")

    def delay_after(self, hop: int) -> float:
        return doubled(self.base_s, hop)

    def can_requeue(self, hop: int) -> bool:
        return hop < self.max_requeues

    def total_s(self) -> float:
        return sum(self.delay_after(h) for h in range(self.max_requeues))


def schedule_or_exhaust(
    hop: int,
    max_hop: int,
    backoff: Backoff,
    now: datetime,
    status: str,
    *,
    settled: int,
    spends: bool = True,
) -> Schedule | Fail:
    """Not yet: the next hop after the backoff, or failed when the settle budget is
    spent. `settled`: the settle waits used so far (deferred hops are not counted).
    A wait that does not spend the budget (`spends=False`: an unconfirmed create's
    grace, or the first wait after a create) comes after the first step of the
    backoff, whatever is left of it."""
    if not spends:
        delay = backoff.delay_after(0)
        return Schedule(hop + 1, now + timedelta(seconds=delay), delay, status, spends=False)
    if settled < max_hop and backoff.can_requeue(settled):
        delay = backoff.delay_after(settled)
        return Schedule(hop + 1, now + timedelta(seconds=delay), delay, status)
    return Fail(
        FailureReason.EXHAUSTED, f"not confirmed after {settled + 1} answered hops; last: {status}"
    )


# -- unanswered, throttled or paced: a hop deferred -----------------------------------


@dataclass(frozen=True, slots=True)
class Deferral:
    """How long a hop that got no answer waits before it runs again.

    The n-th unanswered deferral in a row (the fleet's own turns not counted) waits
    `min(cap, base_s * 2**n)`, jittered down to
    half of that at random, or until the gateway's shared `Retry-After` (at most
    `retry_after_max_s`, as the fleet's pace holds it), whichever is later. The
    cap is `max_s` in the first hour of silence and doubles with each further
    hour, up to `LONGEST_S`: brands resume within
    `max_s` of a short outage, and a day-long one records a few hundred
    deferrals per attempt, not thousands. Deferred hops never use up the settle
    budget (`Backoff`); they go on until the attempt's deadline, `deadline_s`
    after it started.
    """

    LONGEST_S: ClassVar[float] = 600.0
    # A Retry-After is waited as given (spread by up to a quarter, a second at most, and
    # no more than it exceeds 1 s) this many deferrals in a row; a call told to wait more
    # often backs off as an unanswered one.
    RETRY_AFTER_TRUSTED: ClassVar[int] = 2

    base_s: float = 2.0
    # Settings, with no defaults here: PROVISIONER_DEFER_MAX_S,
    # PROVISIONER_ATTEMPT_DEADLINE_S and PROVISIONER_RETRY_AFTER_MAX_S.
    max_s: float = field(kw_only=True)
    deadline_s: float = field(kw_only=True)
    retry_after_max_s: float = field(kw_only=True)

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.max_s:
            raise ValueError("deferral base must be > 0 and at most the maximum")
        if self.deadline_s <= 0:
            raise ValueError("the attempt deadline must be > 0 seconds")

    def delay(
        self,
        in_row: int,
        retry_after_s: float,
        jitter: float,
        silent_s: float = 0.0,
        *,
        paced: bool = False,
        restart: bool = False,
    ) -> float:
        """`jitter` in [0, 1): where between half and all of the backoff this one waits;
        `silent_s`: how long the gateway has not answered this attempt; `restart`: the
        gateway answered another call of the hop, so the backoff starts from its first
        step. A call held for the fleet's own turn (`paced`) waits for that turn, up to
        a quarter more (the held hops spread out), not the backoff: the gateway is
        answering. A call told when to come back (a 429's `Retry-After`, or the fleet's
        circuit holding it until its next probe) waits just that, at least half the
        backoff's first step, the first `RETRY_AFTER_TRUSTED` times in a row: a stray
        429 costs its own retry, not a backoff meant for a gateway that does not
        answer. What is told is spread by up to a quarter of it (at most a second),
        so that the hops an open circuit holds do not all meet its one probe, but
        never by more than it exceeds one second: a stray 429's `Retry-After: 1` costs
        that second, where a spread would cost the broker's next wait-queue rung
        (1.25 s)."""
        retry_after_s = hold_s(retry_after_s, self.retry_after_max_s)
        if paced:
            return max(retry_after_s, 0.1) * (1.0 + 0.25 * jitter)
        if retry_after_s > 0 and in_row < self.RETRY_AFTER_TRUSTED:
            spread = max(0.0, min(retry_after_s / 4, 1.0, retry_after_s - 1.0))
            return max(retry_after_s, self.base_s / 2) + jitter * spread
        hours = min(int(max(silent_s, 0.0) // 3600), 10)
        cap = max(self.max_s, min(self.LONGEST_S, doubled(self.max_s, hours)))
        backoff = min(cap, doubled(self.base_s, 0 if restart else min(in_row, 30)))
        return max(retry_after_s, jittered(backoff, jitter))


def defer_or_expire(
    hop: int,
    step: Defer,
    *,
    in_row: int,
    unavailable_since: datetime | None,
    deadline_at: datetime,
    now: datetime,
    deferral: Deferral,
    jitter: float,
) -> Schedule | Fail:
    """No answer: the same question again later, without using the settle budget.

    Later means after the shared Retry-After and the jittered backoff of the
    `in_row`-th deferral in a row that the gateway left unanswered (a deferral for
    the fleet's own turn, `Defer.paced`, is not counted: the gateway was not asked;
    the first again when the gateway answered another call of the hop:
    `Defer.gateway_up`), and no later than the deadline; at the deadline the
    attempt fails (`deadline`), naming since when nothing answered.
    """
    since = unavailable_since or now
    if now >= deadline_at:
        return Fail(
            FailureReason.DEADLINE,
            f"no answer from the gateway since {since.isoformat(timespec='seconds')}; "
            f"last: {step.status}",
        )
    silent_s = (now - since).total_seconds()
    delay = deferral.delay(
        in_row, step.retry_after_s, jitter, silent_s, paced=step.paced, restart=step.gateway_up
    )
    not_before = min(now + timedelta(seconds=delay), deadline_at)
    delay_s = (not_before - now).total_seconds()
    return Schedule(
        hop + 1, not_before, delay_s, step.status, deferred=True, spends=False, paced=step.paced
    )


# -- the audit: a read asked again ------------------------------------------------------

# A read the upstream audit made that the gateway did not answer (429, 5xx, the pace
# holding it) is asked again after its Retry-After or a doubling pause, this often:
# an audit is never urgent.
AUDIT_READ_TRIES = 8
AUDIT_LONGEST_PAUSE_S = 30.0


def audit_pause_s(n: int, retry_after_s: float) -> float:
    """Before the audit asks a read again for the (n+1)-th time (0-based `n`)."""
    return min(AUDIT_LONGEST_PAUSE_S, max(retry_after_s, doubled(0.5, n)))


# -- refused for now: a message republished -----------------------------------------------

# The worker's own failures (`x-retries`): about 200 s in all.
RETRY_DELAYS_S = (1.0, 5.0, 15.0, 60.0, 120.0)
# Refusals for now (`x-waits`): 5, 15, 60 s, then every 120 s; 3,560 s (about an
# hour) in all. Delays the worker's own schedule uses too: no new wait queues.
WAIT_DELAYS_S = (5.0, 15.0, 60.0) + (120.0,) * 29
# A gateway refusal that says when (Retry-After, an open circuit's next probe): that
# long, at least this (a growing schedule here held the reliability run's drain for
# minutes: the gateway's own Retry-After already says how long to wait).
TOLD_DELAYS_S = (5.0,)
# What a handler raises for a refusal for now: waits on WAIT_DELAYS_S.
REFUSED_FOR_NOW: tuple[type[BaseException], ...] = (RetryLater, TransientGatewayError)


def retry_delay_s(tries: int, schedule: tuple[float, ...] = RETRY_DELAYS_S) -> float | None:
    """Before the worker's (tries+1)-th retry of its own failure; None: spent."""
    return schedule[tries] if tries < len(schedule) else None


def waited_s(waits: int, waited_ms: int, schedule: tuple[float, ...] = WAIT_DELAYS_S) -> float:
    """How long a message refused for now has waited: as recorded, or (a message
    from before the record) as the schedule would have it."""
    return waited_ms / 1000 or sum(schedule[:waits])


def waits_spent(waited: float, schedule: tuple[float, ...] = WAIT_DELAYS_S) -> bool:
    """A message refused for now gives up once its waits add up to the whole schedule."""
    return waited >= sum(schedule)


def release_wait_s(
    waits: int,
    retry_after_s: float,
    paced: bool,
    schedule: tuple[float, ...] = WAIT_DELAYS_S,
    told_delays: tuple[float, ...] = TOLD_DELAYS_S,
) -> float:
    """How long the (waits+1)-th wait of a message refused for now lasts: its step of
    the schedule; paced, the fleet's turn (as a hop waits); throttled, the Retry-After
    it was told, not sooner, and at least a short step. Never past the longest step."""
    why = told(retry_after_s, paced)
    if why is Why.PACED:
        return min(retry_after_s, max(schedule))
    if why is Why.THROTTLED:
        step = told_delays[min(waits, len(told_delays) - 1)]
        return min(max(step, retry_after_s), max(schedule))
    return schedule[min(waits, len(schedule) - 1)]
