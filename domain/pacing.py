"""The fleet's pace of calls to the gateway, as pure functions of plain values.

Every worker process of a deployment shares one `PaceState` (a row in
PostgreSQL, or memory in a lone process). Each call asks `admit` before it is
sent and reports a 429 or an unreachable answer to `observe`; other answers are
counted and published with the process's next write (`count_answered`), which
a cut reads. Times are seconds on one clock (the database's, when shared).
While no limit is in force (`free`: no rate configured or learned, the circuit
closed, nothing failing, no hold current), a process admits its calls on its
own copy of the state, refreshed every ~100 ms
(infrastructure/gateway/pacing.py). This docstring states the rules;
docs/operations.md ("Pacing the gateway") says what an operator sets and
sees, and decisions 007 and 039 to 048 (docs/decisions/) say why each rule
is as it is.

What `admit` asks, in order:

- **A circuit.** `open_after` unreachable answers in a row (refused, timeout,
  dropped, 502, 503, 504) open it. Calls are then held unsent, one probe goes
  every `probe_every_s` whatever the rate or a hold (again that long after one
  unanswered), and any answer closes it.
- **A shared hold.** While one holds (below), no other call goes.
- **A rate.** A GCRA: `tat`, the next call's turn, moves on by 1/rate a call,
  and a call may go `burst - 1` intervals ahead of it. The rate is the
  configured one, or the learned one (`rate_now`), which is cut under a
  configured one by the same rules and grows back to it (decision 046).
- **Patience.** A call waits in its thread at most `max_wait_s`
  (`create_wait_s` for a create: its hop has listed the family). A longer
  wait is a `Hold`, and its hop is deferred (domain/hop.py). A call whose wait
  a cut, a new hold or an opened circuit outlived asks again rather than go
  (`still_admitted`), and is not counted again as sent.

What a 429 does (`observe`, then `_throttled`):

- **Its own call waits.** With a Retry-After within its patience, and while
  the pace limits the fleet, the call's thread waits it and the call asks its
  turn again, once (`waits_told`; a create once a round); otherwise its hop is
  deferred until then (domain/waits.py).
- **The fleet acts only on evidence** (`rate_signal`). Dense 429s
  (`_dense`): at least `evidence_min`, and `evidence_share` of the calls, of
  `evidence_calls_min` at the least (`evidence_calls_learned` once a rate was
  learned), both decayed over `evidence_tau_s`. Or, the rate grown past the
  limit the last cut read, a few (`_past_limit`: `evidence_above_min` and
  `evidence_above_share`). Stray 429s stay under both. A cut spends the
  evidence, and comes at most once every `cut_every_s`.
- **Dense 429s hold and cut.** The 429's Retry-After (1 s if none, at most
  `retry_after_max_s`) holds every call of the fleet unless a longer hold is
  in force (`_hold`), and the rate is cut (within `cut_every_s` of the last
  cut, only held).
- **A few past the limit read hold no call, and cut only when the gateway
  held calls back** (`_held_back`: it answered under `cut_under` of what was
  sent, and at least `cut_short_min` calls less; `cut_short_strict` while
  under one stray 429 is counted: `strays`, those that came while the rate
  was under `strays_under` of a read that is no floor, decayed over
  `strays_tau_s`). If it answered more than the read, the read is raised
  instead (a floor's, only while nothing was held back).

What a cut sets (`_cut`):

- **The first**, no rate in force (none configured, none learned or grown
  past `unlimited_above`): `backoff_factor` of what the fleet was sending,
  grown by `growth_searching_per_s` a second, compounded. It reads no limit,
  so only dense 429s cut again.
- **A later one** reads the limit (`ceiling`): the calls answered a second
  over the last window, in the time no hold held (`answered_rate`,
  `_unheld`), and at least `backoff_factor` of what was sent (at most the rate
  in force). A clean window (`_rolled`: 429s at most `CLEAN_SHARE`, no hold)
  since the last cut, within `clean_within_s`, reads it instead when the read
  is under `clean_trust` of it (a limiter with no burst). A cut on a few 429s
  reads no less than `few_keep` of the last dense one's read. The rate is set
  to `below_ceiling` of the read, never above the rate in force, and grows by
  `growth_per_s` to `knee` of it, by `growth_near_limit_per_s` to
  `stale_above` of it, then by `growth_per_s`. The turns taken at the old rate
  are given back, and the burst's credit (`_given_back`): calls go at the new
  rate from now.
- **A floor.** A read made while the fleet sent under `spaced_share` of the
  rate (its calls went in bursts), or answers under `backoff_factor` of what
  was sent with no clean window, is only a floor (`ceiling_low`): the rate
  grows by `growth_per_s` from it, and the cut sets no less than
  `backoff_factor` of what the last cut set.
- A learned rate never grows while a shared hold holds, and grown past
  `unlimited_above` it is no limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

from domain.waits import hold_s

# The least rate that can be configured: one call in 1,000 s. Under it a turn's interval
# is no longer a number a clock can add (1e-320 calls/s: an interval of infinity).
MIN_RATE = 0.001

# A whole window (a second or two) is clean when its 429s are at most this share of
# its calls: the gateway answered what the fleet sent, a stray 429 or so aside, so the
# calls it answered a second are about its limit at the most (a bucket's burst, drained
# within the window, answers more: `PaceRules.clean_trust`).
CLEAN_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class PaceRules:
    rate: float | None = None  # calls/s for the whole fleet; None: learned from 429s
    # Settings, with no defaults here (`Settings.pace()`): PROVISIONER_GATEWAY_BURST,
    # PROVISIONER_GATEWAY_PROBE_S and PROVISIONER_RETRY_AFTER_MAX_S.
    burst: int = field(kw_only=True)
    max_wait_s: float = 2.0
    create_wait_s: float = 10.0
    open_after: int = 5
    probe_every_s: float = field(kw_only=True)
    # The longest one call may take: while a probe may still be in flight no other goes.
    probe_lease_s: float = 0.0
    backoff_factor: float = 0.7  # the first cut, of what was being sent: no limit known yet
    below_ceiling: float = 0.85  # a later cut, of the estimated limit
    knee: float = 0.9  # of the estimated limit: fast growth up to it, slow beyond
    stale_above: float = 1.1  # of the estimated limit: past it the estimate is stale, fast again
    # One cut per throttling episode: calls admitted before a cut (up to max_wait_s
    # ahead) still meet the limit after it, and cutting again for them would
    # compound the cut.
    cut_every_s: float = 3.0
    growth_searching_per_s: float = 0.10
    growth_per_s: float = 0.05
    growth_near_limit_per_s: float = 0.01
    min_rate: float = 0.2
    unlimited_above: float = 10_000.0  # a learned rate grown past this is no limit
    retry_after_max_s: float = field(kw_only=True)  # the longest a 429's Retry-After holds
    # 429s are a rate signal once, decayed over evidence_tau_s, there are at least
    # evidence_min of them and they are at least evidence_share of the calls.
    evidence_min: float = 5.0
    evidence_share: float = 0.10
    evidence_tau_s: float = 5.0
    evidence_calls_min: float = 100.0  # the share is of at least this many calls
    evidence_calls_learned: float = 50.0  # ... once a rate was learned
    # Past the limit read at a cut, 429s at this share of the calls suffice, and at
    # least this many (decayed over evidence_tau_s: three within a second or so).
    evidence_above_share: float = 0.05
    evidence_above_min: float = 2.5
    few_keep: float = 0.9  # such a cut's estimate: not under this of the last dense one's
    cut_under: float = 0.95  # no cut while the gateway answers this much of what was sent
    cut_short_min: float = 3.0  # ... or while it answered fewer than this many calls less
    # ... or fewer than this, while under one stray 429 is counted (`strays_seen`: two
    # within a minute or so make one): with none, a call short past the limit read is
    # the limit's, and 3 let a rate run 30 % over it
    cut_short_strict: float = 1.0
    strays_tau_s: float = 60.0  # stray 429s under the limit read: decayed over this
    # ... counted under this share of the read, since reads run a few per cent high
    # (10.3 to 10.8 for a limit of 10) and the limit's own 429s are no stray ones
    strays_under: float = 0.95
    # A cut reads the limit from the answers only when the fleet sent at least this share
    # of the rate in force: its calls spaced by it. Under it they went as the hops asked,
    # in bursts, and a bucket answers bursts less than its rate: the read is a floor.
    spaced_share: float = 0.8
    # A cut reads the last clean window (`CLEAN_SHARE`) since the previous cut, and
    # within `clean_within_s`, when the answers read under `clean_trust` of it: a
    # limiter with no burst refuses every call that comes a little early, and its
    # answers past the limit read far under it (14 to 16 calls/s for 20); a bucket's,
    # its burst drained, read within a tenth of a clean window.
    clean_within_s: float = 10.0
    clean_trust: float = 0.9

    def __post_init__(self) -> None:
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate >= MIN_RATE):
            raise ValueError(f"the gateway rate must be a number of calls/s, at least {MIN_RATE:g}")
        if self.burst < 1:
            raise ValueError("the gateway burst must be at least 1")
        if self.open_after < 1 or self.probe_every_s <= 0 or self.max_wait_s < 0:
            raise ValueError("the circuit needs open_after >= 1 and a probe interval > 0")
        if self.retry_after_max_s < 1:
            raise ValueError("the longest Retry-After hold must be at least 1 s")
        growths = (self.growth_searching_per_s, self.growth_per_s, self.growth_near_limit_per_s)
        if min(growths) <= 0 or not 0 < self.below_ceiling <= self.knee <= 1 < self.stale_above:
            raise ValueError(
                "a learned rate needs growths > 0 and 0 < below_ceiling <= knee <= 1 < stale_above"
            )


@dataclass(frozen=True, slots=True)
class PaceState:
    tat: float = 0.0  # GCRA: when the next call is due at the rate
    learned: float | None = None  # the rate the last cut set (under a configured one, if any)
    learned_at: float = 0.0
    ceiling: float | None = None  # the limit as estimated at the last cut (calls/s)
    ceiling_dense: float | None = None  # ... at the last cut on dense 429s (or raised since)
    ceiling_low: bool = False  # ... read from calls the rate did not space: a floor
    cut_by: str = ""  # the rule that made the last cut: `DENSE` or `PAST_LIMIT`
    paused_until: float = 0.0  # the shared Retry-After
    held_from: float = 0.0  # ... since when it holds (0: not known)
    held_s: float = 0.0  # seconds the holds before it held since the last cut
    asked_s: float = 0.0  # what the 429 that set it asked (or a hold cut), if over the cap
    unreachable: int = 0  # unreachable answers in a row
    unreachable_since: float | None = None
    open_since: float | None = None  # the circuit; None: closed
    probe_at: float = 0.0  # while open: when the next probe may go
    last_error: str = ""
    window_at: float = 0.0  # calls counted since then (what a first 429 learns from)
    window_calls: int = 0
    window_rate: float = 0.0  # calls/s in the last whole window
    window_answered: int = 0  # calls answered (not 429) since `window_at`, as published
    last_s: float = 0.0  # the last whole window: how long, and how many it answered
    last_answered: int = 0
    window_throttled: int = 0  # calls answered 429 since `window_at`
    # The last whole window the gateway answered with hardly a 429 (`_rolled`): the
    # calls/s it answered, about the limit at most, and when it ended.
    clean_rate: float = 0.0
    clean_at: float = 0.0
    # Calls and 429s, decayed over `evidence_tau_s` since `scored_at`: the evidence.
    calls_score: float = 0.0
    throttled_score: float = 0.0
    scored_at: float = 0.0
    # 429s while the rate a cut set was under `strays_under` of the limit read (a
    # read, not a floor), more than `max_wait_s` after the last cut: stray ones, decayed
    # over strays_tau_s.
    strays: float = 0.0
    strays_at: float = 0.0
    # Every write of a shared state counts one (the store's writer does, not the rules):
    # which of two copies of it a process holds is the newer.
    version: int = 0


# The rules a rate is cut by (`PaceState.cut_by`, said in the worker's log).
DENSE = "dense"  # 429s dense enough to be the rate limit: the fleet holds too
PAST_LIMIT = "past the limit"  # a few 429s past the limit read: the rate alone is cut


class Result(StrEnum):
    ANSWERED = "answered"  # any HTTP answer but 429, 502, 503 and 504 (a 500 too)
    THROTTLED = "throttled"  # 429
    UNREACHABLE = "unreachable"  # refused, timed out, dropped, 502, 503, 504


@dataclass(frozen=True, slots=True)
class Go:
    wait_s: float  # sleep this long, then send
    probe: bool = False  # the one call let through an open circuit


@dataclass(frozen=True, slots=True)
class Hold:
    wait_s: float  # do not send; try again after this long
    why: str
    # The fleet's own turn (its rate, a shared Retry-After): the call may go then, so
    # the hop waits that long, not an outage's growing backoff.
    paced: bool = False


@dataclass(frozen=True, slots=True)
class Change:
    """The circuit opened or closed: logged once, by the process that changed it."""

    opened: bool
    since: float
    error: str


def rate_now(rules: PaceRules, state: PaceState, now: float) -> float | None:
    """Calls/s allowed now; None: no limit. A configured rate is a ceiling: dense 429s
    at it (a limiter stricter than its word, or a quota shared with other clients) cut
    a rate under it as they cut a learned one, and that rate grows back to it."""
    learned = _learned_now(rules, state, now)
    if rules.rate is None:
        return learned
    return rules.rate if learned is None else min(rules.rate, learned)


def _learned_now(rules: PaceRules, state: PaceState, now: float) -> float | None:
    """The rate the last cut set, grown since; None: no cut, or grown past any limit.
    It does not grow while a shared hold holds the fleet: nothing sent then says the
    limit is higher, and a rate grown through a hold met the limit far past it when
    the hold ended, in 429s dense enough for a cut that read a window of the hops the
    hold had deferred (4.6 calls/s for a limit of 20)."""
    if state.learned is None:
        return None
    held = state.held_s + _held_within(state, state.learned_at, now)
    elapsed = max(0.0, now - state.learned_at - held)
    # In logarithms, so that it never overflows, however long ago the cut was.
    start, fast = math.log(state.learned), math.log1p(rules.growth_searching_per_s)
    if state.ceiling is None:
        grown = start + elapsed * fast
    elif state.ceiling_low:  # the limit is above the floor read: no slow band under it
        grown = start + elapsed * math.log1p(rules.growth_per_s)
    else:  # fast to the knee, slowly past it, fast again past `stale_above` of the limit
        fast = math.log1p(rules.growth_per_s)
        slow = math.log1p(rules.growth_near_limit_per_s)
        knee = max(start, math.log(state.ceiling * rules.knee))
        stale = max(knee, math.log(state.ceiling * rules.stale_above))
        to_knee = (knee - start) / fast
        to_stale = to_knee + (stale - knee) / slow
        if elapsed <= to_knee:
            grown = start + elapsed * fast
        elif elapsed <= to_stale:
            grown = knee + (elapsed - to_knee) * slow
        else:
            grown = stale + (elapsed - to_stale) * fast
    if grown > math.log(rules.unlimited_above):
        return None  # grown past any limit
    return math.exp(grown)


def shown(rate: float) -> str:
    """A rate for a person: 0.25, 7.5, 19, 6,580 calls/s (never 6.58e+03)."""
    if rate >= 100:
        return f"{rate:,.0f}"
    return f"{rate:.2g}" if rate < 1 else f"{rate:.3g}"


def free(rules: PaceRules, state: PaceState, now: float) -> bool:
    """No limit in force: no rate configured or learned, the circuit closed, nothing
    failing, no hold current. A call then needs nothing from the shared state."""
    return (
        rules.rate is None
        and state.open_since is None
        and state.unreachable == 0
        and state.paused_until <= now
        and rate_now(rules, state, now) is None
    )


def count_calls(rules: PaceRules, state: PaceState, now: float, calls: int) -> PaceState:
    """`calls` more calls sent (admitted here, or published by a process that
    admitted them on its own copy of a free state)."""
    if calls <= 0:
        return state
    state = _rolled(state, now)
    return _scored(rules, replace(state, window_calls=state.window_calls + calls), now, calls=calls)


def count_answered(state: PaceState, now: float, answered: int) -> PaceState:
    """`answered` more calls answered, not 429 (published by the processes that
    sent them, with their next write): what the gateway admits, which a cut reads."""
    if answered <= 0:
        return state
    state = _rolled(state, now)
    return replace(state, window_answered=state.window_answered + answered)


def _rolled(state: PaceState, now: float) -> PaceState:
    """The window of counts moved on, once it is a second long."""
    elapsed = now - state.window_at
    if elapsed < 1.0:
        return state
    recent = elapsed < 10.0  # an older window says nothing of now
    answered, throttled = state.window_answered, state.window_throttled
    # Not a window a shared hold held in, or ended less than a second before: the
    # gateway's bucket, refilled during the hold, answers a burst over its rate.
    after_hold = 0.0 < state.paused_until > state.window_at - 1.0
    clean = (
        recent
        and not after_hold
        and answered >= 2
        and throttled <= CLEAN_SHARE * (answered + throttled)
    )
    return replace(
        state,
        window_at=now,
        window_calls=0,
        window_answered=0,
        window_throttled=0,
        clean_rate=min(answered, state.window_calls) / elapsed if clean else state.clean_rate,
        clean_at=now if clean else state.clean_at,
        window_rate=state.window_calls / elapsed if recent else 0.0,
        last_s=elapsed if recent else 0.0,
        last_answered=state.window_answered if recent else 0,
    )


def _held_within(state: PaceState, start: float, end: float) -> float:
    """Seconds of the time from `start` to `end` the fleet's last shared hold held."""
    if state.held_from <= 0.0:  # not known (a hold written by an older version)
        return 0.0
    return max(0.0, min(end, state.paused_until) - max(start, state.held_from))


def _unheld(state: PaceState, now: float) -> float:
    """The seconds since the last whole window began (a second or two while calls
    flow) that no shared hold held: the time the fleet could send in. A rate read over
    a window a hold took half of would read half the limit. But at least a second of
    the window: a gateway's bucket refilled during the hold answers a burst at its end,
    which over a fraction of a second reads as several times its rate."""
    seconds = _window_s(state, now)
    return max(seconds - _held_within(state, now - seconds, now), min(seconds, 1.0))


def _window_s(state: PaceState, now: float) -> float:
    """The seconds since the last whole window began."""
    return state.last_s + max(0.0, now - state.window_at)


def answered_rate(state: PaceState, now: float) -> float | None:
    """Calls/s the gateway answered (not 429) since the last whole window began, over
    the time no shared hold held (`_unheld`); None: too short a time, nothing counted
    for long, or no answer published (a process of an older version)."""
    seconds = _unheld(state, now)
    answered = state.last_answered + state.window_answered
    if seconds < 0.5 or now - state.window_at >= 10.0 or answered == 0:
        return None
    return answered / seconds


def _scored(
    rules: PaceRules, state: PaceState, now: float, *, calls: int = 0, throttled: int = 0
) -> PaceState:
    decay = math.exp(-max(0.0, now - state.scored_at) / rules.evidence_tau_s)
    return replace(
        state,
        # Never back: a process's `now` may be older than another's write (decayed twice).
        scored_at=max(now, state.scored_at),
        calls_score=state.calls_score * decay + calls,
        throttled_score=state.throttled_score * decay + throttled,
    )


def rate_signal(rules: PaceRules, state: PaceState, now: float) -> bool:
    """Whether the 429s counted are dense enough to be the gateway's rate limit; or,
    a rate a cut set grown past the limit it read, a few are: they follow our rate."""
    return _dense(rules, state) or _past_limit(rules, state, now)


def _past_limit(rules: PaceRules, state: PaceState, now: float) -> bool:
    """The rate a cut set, grown above the limit the cut read, and 429s (decayed)
    at least `evidence_above_min` and `evidence_above_share` of the calls: more than
    a stray share, which grows with the rate."""
    if state.ceiling is None:
        return False
    rate = rate_now(rules, state, now)
    if rate is None or rate <= state.ceiling:
        return False
    bar = max(rules.evidence_above_min, rules.evidence_above_share * state.calls_score)
    return state.throttled_score >= bar


def _dense(rules: PaceRules, state: PaceState) -> bool:
    if state.throttled_score < rules.evidence_min:
        return False
    # A share of a few calls is noise; fewer calls make a share once a limit was found.
    floor = rules.evidence_calls_min if state.learned is None else rules.evidence_calls_learned
    calls = max(state.calls_score, floor)
    return state.throttled_score >= rules.evidence_share * calls


def patience(rules: PaceRules, *, create: bool) -> float:
    """The longest a call waits in its thread: a create longer, since its hop has
    listed the family already and a deferral would list it again."""
    return rules.create_wait_s if create else rules.max_wait_s


def waits_told(
    rules: PaceRules, state: PaceState, now: float, told_s: float, *, create: bool
) -> bool:
    """A call answered 429 with a Retry-After of `told_s`: whether its thread waits
    it and the call asks its turn again (it keeps its hop's place, and a create its
    family read), rather than its hop being deferred to the back of the queue.

    Only while the fleet's pace limits it (a rate in force, configured or learned, or
    a shared hold), when the threads wait for their turns anyway; with no limit the
    threads are the fleet's capacity, and a deferral frees this one for other hops
    (3 % stray 429s waited in the threads took a third longer to a rollout). Only
    within the call's patience; a 429 that gave no wait defers its hop."""
    if not 0.0 < told_s <= patience(rules, create=create):
        return False
    return state.paused_until > now or rate_now(rules, state, now) is not None


def admit(
    rules: PaceRules,
    state: PaceState,
    now: float,
    *,
    create: bool = False,
    again: bool = False,
) -> tuple[PaceState, Go | Hold]:
    """May a call go now, after a short wait, or must it be held back? A call admitted
    is counted as sent. One asking again (its wait outlived by a cut, a hold or an
    opened circuit: `still_admitted`) was counted at its first admission and is not
    counted again, even after a cut that spent the evidence it was counted in: the
    calls a cut finds waiting are the ones its 429s came for, and counting them among
    the calls after it hid the next 429s (5.0 % of calls 429 at 10 calls/s against
    4.5 %, medians of five rollouts each). One held back keeps its count."""
    state, decision = _admitted(rules, state, now, create=create)
    if isinstance(decision, Go) and not again:
        state = count_calls(rules, state, now, 1)
    return state, decision


def _admitted(
    rules: PaceRules, state: PaceState, now: float, *, create: bool
) -> tuple[PaceState, Go | Hold]:
    longest = patience(rules, create=create)
    longer = state.paused_until - now
    # Stored by a process with a longer cap: cut it (a second's slack, since a `now`
    # older than the 429's that set the hold would read a hold at the cap as longer).
    if longer > rules.retry_after_max_s + 1.0:
        cut = now + rules.retry_after_max_s
        state = replace(state, paused_until=cut, asked_s=max(state.asked_s, longer))
    if state.open_since is not None:
        if now < state.probe_at:
            return state, Hold(state.probe_at - now, f"circuit open: {state.last_error}")
        lease = max(rules.probe_every_s, rules.probe_lease_s)
        return replace(state, probe_at=now + lease), Go(0.0, probe=True)
    if state.paused_until - now > longest:
        wait = state.paused_until - now
        return state, Hold(wait, "throttled: the gateway's Retry-After", paced=True)
    start = max(now, state.paused_until)
    rate = rate_now(rules, state, now)
    if rate is None:
        return state, Go(start - now)
    interval = 1.0 / rate
    due = max(state.tat, start)
    wait = max(start, due - (rules.burst - 1) * interval) - now
    if wait > longest:
        return state, Hold(wait, f"paced at {shown(rate)} calls/s", paced=True)
    return replace(state, tat=due + interval), Go(wait)


def still_admitted(admitted: PaceState, latest: PaceState, now: float) -> bool:
    """Whether a call admitted on `admitted`, its wait over, may go on what the fleet
    knows now (`latest`): not if since then a learned rate was cut (its turn was
    taken at the old rate), a shared hold began that is still in force, or the
    circuit opened. Otherwise it would meet the limit the cut read, or the hold,
    for nothing. (A hold known at its admission, its wait has waited out.)"""
    return (
        latest.learned_at <= admitted.learned_at
        and latest.paused_until <= max(now, admitted.paused_until)
        and (latest.open_since is None or admitted.open_since is not None)
    )


def observe(
    rules: PaceRules,
    state: PaceState,
    now: float,
    result: Result,
    *,
    retry_after_s: float = 0.0,
    error: str = "",
    probe: bool = False,
) -> tuple[PaceState, Change | None]:
    """What a call's answer changes; the same state back when nothing changed. A
    probe that got no answer starts the interval to the next one from now."""
    if result is Result.UNREACHABLE and probe and state.open_since is not None:
        return replace(state, probe_at=now + rules.probe_every_s, last_error=error), None
    if result is Result.UNREACHABLE:
        since = state.unreachable_since if state.unreachable_since is not None else now
        failing = replace(
            state, unreachable=state.unreachable + 1, unreachable_since=since, last_error=error
        )
        if state.open_since is None and failing.unreachable >= rules.open_after:
            opened = replace(failing, open_since=now, probe_at=now + rules.probe_every_s)
            return opened, Change(True, since, error)
        return failing, None
    answered = state
    change = None
    if state.open_since is not None:
        change = Change(False, state.open_since, state.last_error)
    if state.unreachable or state.open_since is not None:
        answered = replace(state, unreachable=0, unreachable_since=None, open_since=None)
    if result is Result.ANSWERED:
        return answered, change
    return _throttled(rules, answered, now, retry_after_s), change


def _throttled(rules: PaceRules, state: PaceState, now: float, retry_after_s: float) -> PaceState:
    """A 429: evidence. Dense, the fleet holds and the rate is cut. Past the limit
    read, the rate a cut set is cut again when the gateway held calls back, or the limit
    read again higher when more was answered than read (a floor read: only while the
    gateway holds no calls back, since past a floor the answers say as much of the
    bursts as of the limit)."""
    counted = replace(state, window_throttled=state.window_throttled + 1)
    answered = _scored(rules, _stray(rules, counted, now), now, throttled=1)
    dense = _dense(rules, answered)
    if not dense and not _past_limit(rules, answered, now):
        return answered  # a stray 429: its own call waits, not the fleet
    if now - state.learned_at < rules.cut_every_s:
        return _hold(rules, answered, now, retry_after_s) if dense else answered
    limited = rate_now(rules, state, now)
    if dense:  # a hold with no cut sends the fleet back into the limit at the same rate
        cut = _cut(rules, answered, limited, now, dense=True)  # read before the new hold
        return _hold(rules, cut, now, retry_after_s)
    admitted = answered_rate(answered, now)
    read = answered.ceiling
    held_back = _held_back(rules, answered, now, limited)
    higher = admitted is not None and read is not None and admitted > read
    if higher and not (held_back and answered.ceiling_low):
        return replace(answered, ceiling=admitted, ceiling_dense=admitted)
    if held_back:
        return _cut(rules, answered, limited, now, dense=False)
    return answered


def _hold(rules: PaceRules, state: PaceState, now: float, retry_after_s: float) -> PaceState:
    """Dense 429s: the latest Retry-After holds the fleet (none given: 1 s), unless a
    longer hold is in force; a hold that follows one in force holds since it began.
    One that begins after the last ended keeps the time that one held since the last
    cut (`held_s`), which the rate did not grow in either."""
    until = now + hold_s(max(retry_after_s, 1.0), rules.retry_after_max_s)
    if until <= state.paused_until:
        return state
    asked = retry_after_s if retry_after_s > rules.retry_after_max_s else 0.0
    if state.paused_until > now:
        return replace(state, paused_until=until, asked_s=asked)
    held = state.held_s + _held_within(state, state.learned_at, state.paused_until)
    return replace(state, paused_until=until, asked_s=asked, held_from=now, held_s=held)


def _stray(rules: PaceRules, state: PaceState, now: float) -> PaceState:
    """A 429 counted as stray: one that came while the rate a cut set (grown since) was
    under `strays_under` of the limit read, once the calls admitted before the last cut had
    their turns."""
    limited = rate_now(rules, state, now)
    under = (
        state.ceiling is not None
        and not state.ceiling_low
        and limited is not None
        and limited <= rules.strays_under * state.ceiling
        and now - state.learned_at > rules.max_wait_s
    )
    if not under:
        return state
    return replace(
        state, strays=strays_seen(rules, state, now) + 1.0, strays_at=max(now, state.strays_at)
    )


def strays_seen(rules: PaceRules, state: PaceState, now: float) -> float:
    """Stray 429s counted, decayed over `strays_tau_s`."""
    return state.strays * math.exp(-max(0.0, now - state.strays_at) / rules.strays_tau_s)


def _held_back(rules: PaceRules, state: PaceState, now: float, limited: float | None) -> bool:
    """Whether the gateway answered less than `cut_under` of what the fleet sent since
    the last whole window began, and at least `cut_short_min` calls less while a stray
    429 or more is counted (`cut_short_strict` while less is). If it answered nearly all, its
    429s say nothing of a limit under our rate: they are stray ones, or answers to
    calls sent before the last cut. What was sent is counted when admitted, at most the
    rate in force; nothing known, no."""
    admitted = answered_rate(state, now)
    if admitted is None or state.learned is None:
        return False
    seconds = _unheld(state, now)
    sent = (state.window_rate * state.last_s + state.window_calls) / seconds
    if limited is not None:
        sent = min(sent, limited)
    short = (sent - admitted) * seconds
    strays = strays_seen(rules, state, now) >= 1.0
    least = rules.cut_short_min if strays else rules.cut_short_strict
    return admitted < rules.cut_under * sent and short >= least


def _cut(
    rules: PaceRules, state: PaceState, limited: float | None, now: float, *, dense: bool
) -> PaceState:
    """A cut, from `limited`, the rate in force (None: none), on dense 429s or
    (`dense` False) on a few past the limit read."""
    # The evidence is spent by a cut: what the calls sent before it still meet must
    # not cut again, and the next cut reads a time above the limit, not this one's.
    cut_by = DENSE if dense else PAST_LIMIT
    spent = replace(
        state, calls_score=0.0, throttled_score=0.0, learned_at=now, cut_by=cut_by, held_s=0.0
    )
    if dense:  # the 429s under the limit read were the limit's (it fell), not stray ones
        spent = replace(spent, strays=0.0)
    if limited is None:  # the first: only what was being sent is known
        learned = max(rules.min_rate, sent_rate(state, now) * rules.backoff_factor)
        return replace(
            spent,
            learned=learned,
            ceiling=None,
            ceiling_low=False,
            tat=_given_back(rules, state, now, learned),
        )
    # What the gateway answered a second (without a count of it: what was sent, at
    # most the rate in force, less the share answered 429); never below what the
    # first cut would give, so that a burst of 429s alone cannot take the rate to its
    # floor.
    sent = sent_rate(state, now)
    sending = min(limited, sent) if sent > 0 else limited
    admitted = answered_rate(state, now)
    if admitted is None:
        share = min(1.0, state.throttled_score / max(state.calls_score, 1.0))
        admitted = sending * (1.0 - share)
    least = max(rules.min_rate, sending * rules.backoff_factor)
    ceiling = max(admitted, least)
    # A floor if the fleet sent under `spaced_share` of the rate in force in the time
    # it could send: a shared hold in the window sent nothing, and its time would make
    # a fleet that sent at the rate look idle.
    unheld = _unheld(state, now)
    sending_unheld = sent * _window_s(state, now) / unheld if unheld > 0 else sent
    low = sent > 0 and sending_unheld < rules.spaced_share * limited
    # A clean window since the last cut reads the limit better than answers far under
    # it: a limiter with no burst refuses the calls that come a little early, so its
    # answers past the limit read far under it. It read the limit, not a floor.
    clean = _clean_rate(rules, state, now)
    if clean * rules.clean_trust > ceiling:
        ceiling, low = clean, False
    read_dense = state.ceiling_dense
    if dense or read_dense is None:
        read_dense = ceiling
    else:
        # A few 429s past the limit read: they may be stray ones, and what those take
        # from the answered would ratchet the estimate down cut by cut; so not under
        # `few_keep` of what dense 429s last read.
        ceiling = max(ceiling, read_dense * rules.few_keep)
    if admitted < least and ceiling == least:
        # Answers under the least a cut reads, and nothing better: a limiter with no
        # burst, whose answers past its limit say little of it, or a limit that fell.
        # Either way the limit is known only to be at least that: a floor.
        low = True
    # A cut never raises the rate (a gateway's burst can make it answer more than the
    # rate in force for a moment).
    learned = max(rules.min_rate, ceiling * rules.below_ceiling)
    if low:
        # A floor says only that the limit is at least that: the rate goes no lower than
        # `backoff_factor` of what the last cut set (of the rate in force, if none: a
        # configured one), as the first cut cuts what was sent. Not of the rate grown
        # since, which is no evidence of the limit. The hops the last hold deferred
        # come back together, and a window of them read a tenth of the limit, from
        # which a floor's growth took a minute.
        last = state.learned if state.learned is not None else limited
        learned = max(learned, rules.backoff_factor * last)
    learned = min(limited, learned)
    return replace(
        spent,
        learned=learned,
        ceiling=ceiling,
        ceiling_dense=read_dense,
        ceiling_low=low,
        tat=_given_back(rules, state, now, learned),
    )


def _clean_rate(rules: PaceRules, state: PaceState, now: float) -> float:
    """Calls/s the last clean window answered, if it ended since the last cut and
    within `clean_within_s`; else 0. Since the last cut: after a cut on a limit that
    fell, the window clean before it says nothing of the next cut."""
    if state.clean_at <= state.learned_at or now - state.clean_at > rules.clean_within_s:
        return 0.0
    return state.clean_rate


def _given_back(rules: PaceRules, state: PaceState, now: float, learned: float) -> float:
    """The GCRA's next turn after a cut: the turns taken at the old rate given back, so
    that the calls waiting for them ask again (`still_admitted`) and go at the new rate
    from now; but not the burst's credit, which would let `burst` calls go at once
    into a gateway that is answering 429. (A turn long past is kept: the burst's
    credit of an idle fleet is the tolerance `burst` allows. A turn set from now at
    the cut's rate would be read at the rate grown since, and hold the first call
    after a long Retry-After for (burst - 1) intervals of the cut's rate.)"""
    return min(state.tat, now + (rules.burst - 1) / learned)


def sent_rate(state: PaceState, now: float) -> float:
    """What the fleet was sending when no rate held it: the busier of the last
    whole window and the current one."""
    elapsed = max(now - state.window_at, 1e-3)
    return max(state.window_rate, state.window_calls / max(elapsed, 1.0))
