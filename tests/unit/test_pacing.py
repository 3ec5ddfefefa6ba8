"""The fleet's pace (domain/pacing.py) as pure rules, and through the gateway adapter
with an in-memory store: a rate, a shared Retry-After, a learned rate, a circuit."""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import httpx
import pytest

from domain.pacing import (
    DENSE,
    PAST_LIMIT,
    Go,
    Hold,
    PaceRules,
    PaceState,
    Result,
    admit,
    count_answered,
    count_calls,
    observe,
    rate_now,
    sent_rate,
    still_admitted,
    waits_told,
)
from domain.ports import TransientGatewayError
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.gateway.pacing import ASK_AGAIN_MAX, MemoryPaceStore, Pace
from tests.support import ManualClock, pace_rules

# Every 429 a rate signal: for the tests of what a fleet-wide hold does (the evidence
# rule itself: tests/unit/test_pace_evidence.py).
EVERY_429: dict[str, float] = {"evidence_min": 1.0, "evidence_share": 0.0}


def calls(rules: PaceRules, state: PaceState, times: list[float]) -> list[Go | Hold]:
    out = []
    for now in times:
        state, decision = admit(rules, state, now)
        out.append(decision)
    return out


def test_a_configured_rate_spaces_calls_after_the_burst() -> None:
    rules = pace_rules(rate=10.0, burst=3, max_wait_s=0.25)
    decisions = calls(rules, PaceState(), [100.0] * 6)

    waits = [d.wait_s for d in decisions if isinstance(d, Go)]
    assert waits == pytest.approx([0.0, 0.0, 0.0, 0.1, 0.2])  # 3 at once, then 1/rate apart
    assert isinstance(decisions[5], Hold)  # 0.3 s away: the hop is deferred, no thread held
    assert decisions[5].wait_s == pytest.approx(0.3)
    assert "paced at 10 calls/s" in decisions[5].why


def test_a_configured_rate_is_a_ceiling_that_dense_429s_cut_under() -> None:
    """A limiter stricter than its word (no burst: a call a few ms early is refused),
    or a quota shared with other clients, answers dense 429s at the configured rate.
    Held alone, the fleet came back at the same rate into the same 429s: 36 % of the
    calls, and a rollout 6.1 times the floor at a strict 20 calls/s configured as 20.
    Dense 429s cut the rate under it as they cut a learned one, and the rate grows
    back to it, never past it."""
    rules = pace_rules(rate=20.0)
    assert rate_now(rules, PaceState(), 10.0) == 20.0
    state = PaceState(
        scored_at=10.0, calls_score=100.0, throttled_score=9.0,
        window_at=9.0, window_rate=20.0, window_calls=10, last_s=1.0, last_answered=13,
    )  # fmt: skip
    state = count_answered(state, 9.9, 6)
    cut, _ = observe(rules, state, 10.0, Result.THROTTLED, retry_after_s=1.0)
    assert cut.paused_until == 11.0  # the fleet holds
    assert cut.learned_at == 10.0
    assert cut.cut_by == DENSE
    # 19 answered in 2 s, but never under 70 % of the 20 sent a second; answers under
    # that say only that the limit is at least that much: a floor (decision 047)
    assert cut.ceiling == pytest.approx(14.0)
    assert cut.ceiling_low
    # A floor says no more than that: the rate in force is cut by 30 % at the most
    # (85 % of the floor read would be 11.9).
    assert rate_now(rules, cut, 10.0) == pytest.approx(0.7 * 20.0)
    assert rate_now(rules, cut, 100.0) == 20.0
    assert rate_now(rules, cut, 1e6) == 20.0
    # A 429 soon after a cut that read the limit (not a floor), with the rate under
    # 95 % of it, is a stray one under a configured rate as under a learned one.
    read = replace(cut, paused_until=0.0, ceiling_low=False, learned=0.85 * 14.0)
    stray, _ = observe(rules, read, 12.1, Result.THROTTLED)
    assert stray.strays == 1.0
    assert stray.learned_at == cut.learned_at
    # A few 429s past the limit read cut again, under the configured rate; grown back
    # to it as well, since a limiter with no burst throws them at its own limit (a
    # cut forgotten there, tried: 1.55 times the floor against 1.39 at a strict 20).
    later = replace(
        read, scored_at=60.0, calls_score=100.0, throttled_score=4.0,
        window_at=59.5, window_rate=20.0, window_calls=10, last_s=1.0, last_answered=12,
        window_answered=6,
    )  # fmt: skip
    again, _ = observe(rules, later, 60.0, Result.THROTTLED, retry_after_s=1.0)
    assert again.learned_at == 60.0
    assert again.cut_by == PAST_LIMIT
    assert again.paused_until == read.paused_until  # no hold: only the rate is cut
    limited = rate_now(rules, again, 60.0)
    assert limited is not None
    assert limited < 20.0


@pytest.mark.parametrize("rate", [0.0, -1.0, 1e-320, math.nan, math.inf])
def test_a_rate_no_clock_can_space_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="gateway rate"):
        pace_rules(rate=rate)


def test_the_evidence_decays_once_when_a_process_writes_with_an_older_now() -> None:
    """Each process reads the shared clock in its own transaction: one may write with a
    `now` a moment older than the last write's. The decay must not count that moment
    twice (back, then forth)."""
    rules = pace_rules(rate=None)
    state = PaceState(calls_score=4.0, throttled_score=4.0, scored_at=1000.0)
    behind, _ = observe(rules, state, 999.0, Result.THROTTLED)
    later = count_calls(rules, behind, 1001.0, 1)
    decayed = math.exp(-1.0 / rules.evidence_tau_s)
    assert later.throttled_score == pytest.approx(5.0 * decayed)
    assert later.calls_score == pytest.approx(4.0 * decayed + 1.0)


def test_idle_time_refills_the_burst_but_never_banks_more() -> None:
    rules = pace_rules(rate=10.0, burst=2)
    state, _ = admit(rules, PaceState(), 0.0)
    state, _ = admit(rules, state, 0.0)
    later = [admit(rules, state, 60.0)[1], admit(rules, admit(rules, state, 60.0)[0], 60.0)[1]]
    assert [d.wait_s for d in later if isinstance(d, Go)] == [0.0, 0.0]


def test_a_retry_after_pauses_every_call_of_the_fleet() -> None:
    rules = pace_rules(rate=None, max_wait_s=2.0, **EVERY_429)
    state, change = observe(rules, PaceState(), 10.0, Result.THROTTLED, retry_after_s=30.0)
    assert change is None
    _, held = admit(rules, state, 11.0)
    assert isinstance(held, Hold)
    assert held.wait_s == pytest.approx(29.0)
    _, soon = admit(rules, state, 38.5)
    assert soon == Go(pytest.approx(1.5))  # a short rest is waited out in the thread
    _, free = admit(rules, state, 40.0)
    assert isinstance(free, Go)
    assert free.wait_s == 0.0


def test_without_a_rate_the_first_429_learns_one_and_success_grows_it() -> None:
    rules = pace_rules(rate=None, growth_searching_per_s=0.1, backoff_factor=0.7, **EVERY_429)
    state = PaceState()
    for n in range(60):  # 60 calls in 2 s: 30 calls/s, unlimited
        state, decision = admit(rules, state, 100.0 + n / 30)
        assert decision == Go(0.0)
    assert rate_now(rules, state, 102.0) is None
    state, _ = observe(rules, state, 102.0, Result.THROTTLED, retry_after_s=1.0)
    learned = rate_now(rules, state, 102.0)
    assert learned == pytest.approx(0.7 * 30, rel=0.1)
    # Throttled again at once (the same burst of 429s): cut once, not once per call.
    again, _ = observe(rules, state, 102.2, Result.THROTTLED, retry_after_s=1.0)
    assert again.learned == state.learned
    grown = rate_now(rules, state, 112.0)
    # No limit known yet: searching, from when the hold of 1 s ended.
    assert grown == pytest.approx(learned * 1.10**9)
    assert rate_now(rules, state, 102.0 + 10_000) is None  # grown past any limit: no limit


def test_a_later_cut_reads_the_limit_as_what_the_gateway_answered() -> None:
    """Throttled at a learned rate: the limit is the calls answered (not 429) a second
    over the last second or two; the rate goes under it, grows fast to the knee, then
    slowly."""
    rules = pace_rules(rate=None, below_ceiling=0.85, knee=0.9, **EVERY_429)
    state = PaceState(learned=10.0, learned_at=0.0, ceiling=None, scored_at=10.0)
    assert rate_now(rules, state, 10.0) == pytest.approx(10.0 * 1.10**10)  # 25.9
    # The last whole second sent 22 calls, 16 answered; 11 and 8 in the half since.
    state = replace(
        state, window_at=9.5, window_rate=22.0, window_calls=11, last_s=1.0, last_answered=16
    )
    state = count_answered(state, 9.9, 8)
    cut, _ = observe(rules, state, 10.0, Result.THROTTLED, retry_after_s=1.0)
    assert cut.ceiling == pytest.approx(24 / 1.5)  # 16 calls/s answered
    assert not cut.ceiling_low  # 22 sent of 25.9 allowed: spaced by the rate
    assert rate_now(rules, cut, 10.0) == pytest.approx(0.85 * cut.ceiling)
    assert cut.paused_until == 11.0  # it grows once the fleet's hold is over
    assert rate_now(rules, cut, 11.0) == pytest.approx(0.85 * cut.ceiling)
    to_knee = math.log(0.9 / 0.85) / math.log1p(rules.growth_per_s)
    assert rate_now(rules, cut, 11.0 + to_knee) == pytest.approx(0.9 * cut.ceiling)
    assert rate_now(rules, cut, 21.0 + to_knee) == pytest.approx(
        0.9 * cut.ceiling * (1 + rules.growth_near_limit_per_s) ** 10
    )


def test_answers_to_calls_the_rate_did_not_space_read_only_a_floor_of_the_limit() -> None:
    """Sending far under the rate in force, the hops' bursts met the gateway's bucket,
    which answers bursts less than its rate: the answered rate is a floor. The rate
    grows from it with no slow band, and the next cut, on spaced calls, reads the
    limit."""
    rules = pace_rules(rate=None)
    state = PaceState(
        learned=10.0, learned_at=0.0, ceiling=None, scored_at=10.0,
        calls_score=100.0, throttled_score=20.0,
    )  # fmt: skip
    # 25.9 allowed, 18 sent a second (27 in the last 1.5 s), 14 answered a second.
    state = replace(
        state, window_at=9.5, window_rate=18.0, window_calls=9, last_s=1.0, last_answered=14
    )
    state = count_answered(state, 9.9, 7)
    cut, _ = observe(rules, state, 10.0, Result.THROTTLED, retry_after_s=1.0)
    assert cut.ceiling == pytest.approx(14.0)
    assert cut.ceiling_low
    start = 0.85 * 14.0  # not under 70 % of the 10 the last cut set (decision 048)
    assert rate_now(rules, cut, 10.0) == pytest.approx(start)
    # 5 % a second all along once the hold is over: no slow band at the knee
    grown = rate_now(rules, cut, 21.0)
    assert grown == pytest.approx(start * (1 + rules.growth_per_s) ** 10)
    # Past the floor read, the fleet sending what it allows (its calls spaced), 429s
    # past it cut again (not raise it, though more was answered), and read the limit.
    limited = rate_now(rules, cut, 25.0)
    assert limited is not None
    assert limited > 20.0
    later = replace(
        cut, calls_score=100.0, throttled_score=5.0, scored_at=25.0,
        window_at=24.5, window_rate=limited, window_calls=int(limited / 2),
        last_s=1.0, last_answered=20, window_answered=10,
    )  # fmt: skip
    again, _ = observe(rules, later, 25.0, Result.THROTTLED, retry_after_s=1.0)
    assert again.learned_at == 25.0
    assert again.cut_by == PAST_LIMIT
    assert again.ceiling == pytest.approx(20.0)  # 30 answered in 1.5 s
    assert not again.ceiling_low
    assert rate_now(rules, again, 25.0) == pytest.approx(0.85 * 20.0)


def test_a_cut_reads_the_limit_over_the_time_no_shared_hold_held() -> None:
    """A hold inside the window a cut reads sent nothing for its length. Read over the
    whole window, a rollout with answers 200 ms late read 7 to 8 calls/s for a gateway
    allowing 20 (a hold took 1 s of the 1.6), and its rate crawled back up for 20 s.
    The answers are read over the time not held; but over a second at the least,
    since the gateway's bucket, refilled during the hold, answers a burst at its end."""
    rules = pace_rules(rate=None)
    # The last whole window ran from 1.0 to 2.5 s, the current one since; a hold held
    # from 1.2 to 2.0 s, so 1.2 s of the 2 were not held. 24 calls answered.
    state = PaceState(
        learned=27.0, learned_at=0.0, scored_at=3.0, calls_score=40.0, throttled_score=12.0,
        paused_until=2.0, held_from=1.2,
        window_at=2.5, window_rate=8.0, window_calls=4, last_s=1.5, last_answered=14,
    )  # fmt: skip
    state = count_answered(state, 2.9, 10)
    cut, _ = observe(rules, state, 3.0, Result.THROTTLED, retry_after_s=1.0)
    assert cut.learned_at == 3.0
    assert cut.ceiling == pytest.approx(24 / 1.2)
    # The fleet sent far under the rate in force: a floor, and the rate goes no lower
    # than 70 % of the 27 the last cut set (decision 048).
    assert cut.ceiling_low
    assert rate_now(rules, cut, 3.0) == pytest.approx(max(0.85 * 24 / 1.2, 0.7 * 27.0))
    assert cut.paused_until == 4.0  # and the fleet holds again, from now
    unheld = replace(state, paused_until=0.0, held_from=0.0)
    cut, _ = observe(rules, unheld, 3.0, Result.THROTTLED, retry_after_s=1.0)
    assert cut.ceiling == pytest.approx(24 / 2.0)
    held_most = replace(state, paused_until=2.8, held_from=0.5)  # 1.8 s of the 2
    cut, _ = observe(rules, held_most, 3.0, Result.THROTTLED, retry_after_s=1.0)
    assert cut.ceiling == pytest.approx(24 / 1.0)
    # A hold a process of an older version wrote does not say since when: the
    # window is read whole, as before.
    unknown = replace(state, held_from=0.0)
    cut, _ = observe(rules, unknown, 3.0, Result.THROTTLED, retry_after_s=1.0)
    assert cut.ceiling == pytest.approx(24 / 2.0)


def test_a_window_answered_with_hardly_a_429_is_clean() -> None:
    """A whole window whose 429s are at most 5 % of its calls is clean: the calls/s
    it answered are kept, with when it ended; a window with more is not."""
    rules = pace_rules(rate=None)
    state = count_calls(rules, PaceState(window_at=10.0), 10.4, 20)
    state = count_answered(state, 10.5, 19)
    state, _ = observe(rules, state, 10.6, Result.THROTTLED, retry_after_s=1.0)
    assert state.window_throttled == 1
    rolled = count_calls(rules, state, 11.25, 1)
    assert (rolled.clean_rate, rolled.clean_at) == (pytest.approx(19 / 1.25), 11.25)
    assert rolled.window_throttled == 0
    # Never more than was sent (answers published late land in the next window)...
    rolled = count_calls(rules, count_answered(state, 10.9, 5), 11.25, 1)
    assert rolled.clean_rate == pytest.approx(20 / 1.25)
    # ... and not a window a hold held in, or that began within a second of one's end:
    # the bucket refilled during it answers a burst over its rate.
    for held_until in (10.5, 9.5):
        held = count_calls(rules, replace(state, paused_until=held_until), 11.25, 1)
        assert held.clean_at == 0.0, held_until
    rolled = count_calls(rules, replace(state, paused_until=8.5), 11.25, 1)
    assert rolled.clean_at == 11.25
    state, _ = observe(rules, state, 10.7, Result.THROTTLED, retry_after_s=1.0)
    rolled = count_calls(rules, state, 11.25, 1)  # 2 of 21: not clean
    assert (rolled.clean_rate, rolled.clean_at) == (0.0, 0.0)


def cut_after(
    clean_rate: float, clean_at: float, answered: int, *, learned_at: float = 0.0
) -> PaceState:
    """Dense 429s at 30 s: the fleet sent 20 calls/s over the last 2 s, and the gateway
    answered `answered` of them; its last clean window read `clean_rate` at `clean_at`."""
    state = PaceState(
        learned=20.0, learned_at=learned_at, ceiling=22.0, ceiling_dense=22.0,
        scored_at=30.0, calls_score=100.0, throttled_score=30.0,
        window_at=29.0, window_rate=20.0, window_calls=20, last_s=1.0,
        last_answered=answered - answered // 2, window_answered=answered // 2,
        clean_rate=clean_rate, clean_at=clean_at,
    )  # fmt: skip
    cut, _ = observe(pace_rules(rate=None), state, 30.0, Result.THROTTLED, retry_after_s=1.0)
    assert cut.learned_at == 30.0
    return cut


def test_a_cut_reads_a_limiter_with_no_burst_from_its_last_clean_window() -> None:
    """A limiter with no burst refuses every call that comes a little early, so past
    its limit it answers far less than it allows: 28 calls in 2 s for 20 calls/s,
    where the last clean window answered 18.5 a second. The cut reads that window, a
    limit and not a floor; learned, such limiters cost 1.28 to 1.59 times the floor."""
    cut = cut_after(18.5, 27.0, 28)
    assert cut.ceiling == pytest.approx(18.5)
    assert not cut.ceiling_low
    assert rate_now(pace_rules(rate=None), cut, 30.0) == pytest.approx(0.85 * 18.5)
    # No clean window: the answers, 14 a second.
    assert cut_after(0.0, 0.0, 28).ceiling == pytest.approx(14.0)
    # A bucket's answers past its limit read within a tenth of its last clean window,
    # which read its burst draining: the answers stand.
    assert cut_after(18.5, 27.0, 34).ceiling == pytest.approx(17.0)
    # A clean window before the last cut says nothing of this one (a limit that fell
    # is read from the answers at the next cut), nor one older than 10 s.
    assert cut_after(18.5, 24.0, 28, learned_at=25.0).ceiling == pytest.approx(14.0)
    assert cut_after(18.5, 19.5, 28).ceiling == pytest.approx(14.0)


def test_a_fleet_that_sent_at_the_rate_when_not_held_reads_a_limit_not_a_floor() -> None:
    """A read is a floor when the fleet sent under 80 % of the rate in force: its hops'
    bursts, not the rate, met the gateway. What it sent is judged over the time it
    could send: a hold in the window sent nothing, and counted whole it made a fleet
    sending at the rate look idle, so the rate grew from a right read with no slow band
    and ran into the limit again."""
    rules = pace_rules(rate=None)
    # Learned at 20 calls/s 3 s ago: 26.6 in force. A hold held from 1.2 to 2.0 s of
    # the last whole window (1.0 to 2.5 s); 19 calls went in its 0.7 s not held, and
    # 14 in the 0.5 s since: about the rate in force.
    state = PaceState(
        learned=20.0, learned_at=0.0, scored_at=3.0, calls_score=40.0, throttled_score=12.0,
        paused_until=2.0, held_from=1.2,
        window_at=2.5, window_rate=19 / 1.5, window_calls=14, last_s=1.5, last_answered=14,
    )  # fmt: skip
    state = count_answered(state, 2.9, 10)
    in_force = rate_now(rules, state, 3.0)
    assert in_force is not None
    assert sent_rate(state, 3.0) < 0.8 * in_force
    cut, _ = observe(rules, state, 3.0, Result.THROTTLED, retry_after_s=1.0)
    assert cut.cut_by == DENSE
    assert cut.ceiling_low is False
    # The same calls with no hold in the window: the fleet did send under the rate.
    idle, _ = observe(
        rules, replace(state, paused_until=0.0, held_from=0.0), 3.0, Result.THROTTLED,
        retry_after_s=1.0,
    )  # fmt: skip
    assert idle.ceiling_low is True
    # A window of no time yet (nothing recent, rolled this instant): judged on what
    # was sent, 25 calls against 20 in force, not as an idle fleet.
    at_once = PaceState(
        window_at=10.0, window_calls=25, scored_at=10.0, calls_score=100.0, throttled_score=9.0
    )
    cut, _ = observe(pace_rules(rate=20.0), at_once, 10.0, Result.THROTTLED, retry_after_s=1.0)
    assert cut.cut_by == DENSE
    assert cut.ceiling_low is False


def test_a_hold_knows_since_when_it_holds_and_a_longer_one_keeps_it() -> None:
    rules = pace_rules(rate=None, **EVERY_429)
    state, _ = observe(rules, PaceState(), 10.0, Result.THROTTLED, retry_after_s=1.0)
    assert (state.held_from, state.paused_until) == (10.0, 11.0)
    longer, _ = observe(rules, state, 10.5, Result.THROTTLED, retry_after_s=2.0)
    assert (longer.held_from, longer.paused_until) == (10.0, 12.5)
    later, _ = observe(rules, longer, 13.0, Result.THROTTLED, retry_after_s=1.0)
    assert (later.held_from, later.paused_until) == (13.0, 14.0)


def test_a_cut_without_answers_counted_reads_the_share_answered_429() -> None:
    rules = pace_rules(rate=None, **EVERY_429)
    state = PaceState(learned=20.0, learned_at=0.0, scored_at=10.0)
    sending = rate_now(rules, state, 10.0)
    state = replace(state, calls_score=100.0, throttled_score=24.0)  # 25 % answered 429
    cut, _ = observe(rules, state, 10.0, Result.THROTTLED, retry_after_s=1.0)
    assert cut.ceiling == pytest.approx(sending * (1 - 0.25))  # the 429 just seen counts


def test_never_under_most_of_what_was_sent_however_few_were_answered() -> None:
    rules = pace_rules(rate=None, **EVERY_429)
    state = PaceState(learned=10.0, learned_at=0.0, window_at=9.0, window_rate=30.0, last_s=1.0)
    cut, _ = observe(rules, state, 10.0, Result.THROTTLED, retry_after_s=1.0)
    assert cut.ceiling == pytest.approx(0.7 * 25.937, rel=1e-3)  # the rate in force, 0.7 of it


def test_a_few_429s_past_the_limit_read_cut_the_rate_but_hold_no_one() -> None:
    """Past the limit a cut read, 429s follow our rate: three suffice to cut, where a
    share of 10 % would cost that share; they say the limit is no higher than read,
    not that it is lower, and the fleet is not held (the cut rate spaces the calls)."""
    rules = pace_rules(rate=None)
    past = PaceState(learned=9.0, learned_at=10.0, ceiling=10.0, ceiling_dense=10.0, scored_at=30.0)
    assert rate_now(rules, past, 30.0) == pytest.approx(11.0, rel=0.01)  # past the limit read
    # Sending what it allows (its calls spaced), 8 answered in the last whole second.
    state = replace(past, window_at=29.5, window_rate=11.0, last_s=1.0, last_answered=8)
    for n in range(2):
        state, _ = observe(rules, state, 30.0 + n * 0.1, Result.THROTTLED, retry_after_s=1.0)
        assert state.learned_at == 10.0  # one, two: not yet
    cut, _ = observe(rules, state, 30.3, Result.THROTTLED, retry_after_s=1.0)
    assert cut.learned_at == 30.3
    assert cut.ceiling == 9.0  # fewer answered (8 in 1.8 s): not under 0.9 of 10
    assert cut.ceiling_dense == 10.0
    assert cut.paused_until == 0.0
    assert cut.cut_by == PAST_LIMIT
    assert rate_now(rules, cut, 30.3) == pytest.approx(0.85 * 9.0)
    more = replace(
        cut, learned_at=20.0, scored_at=40.0, window_at=39.5, window_rate=30.0, last_answered=20
    )
    assert rate_now(rules, more, 40.0) > 9.0
    for n in range(3):
        more, _ = observe(rules, more, 40.0 + n * 0.1, Result.THROTTLED, retry_after_s=1.0)
    assert more.ceiling == pytest.approx(20 / 1.7)  # more answered than read: read higher

    under = PaceState(learned=8.5, learned_at=0.0, ceiling=10.0, scored_at=1.0)
    assert rate_now(rules, under, 1.0) < 10.0
    for n in range(5):  # the same three, and more, under the limit read: stray
        under, _ = observe(rules, under, 1.0 + n * 0.1, Result.THROTTLED, retry_after_s=1.0)
    assert under.learned_at == 0.0


def read_10_at_30(*, learned_at: float, sent_last_second: float) -> PaceState:
    """A learned rate of 9 calls/s from `learned_at`, the limit read as 10; at 30 s,
    the last whole second sent `sent_last_second` calls and the half second since 5,
    and the gateway answered 9 and 5 of them."""
    return PaceState(
        learned=9.0, learned_at=learned_at, ceiling=10.0, ceiling_dense=10.0, scored_at=30.0,
        window_at=29.5, window_rate=sent_last_second, last_s=1.0, window_calls=5,
        last_answered=9, window_answered=5,
    )  # fmt: skip


def test_with_no_stray_429_seen_a_call_or_two_short_past_the_limit_read_cuts() -> None:
    """Past the limit read, a cut needs the gateway to have answered fewer calls than
    the fleet sent. Three calls short let a rate run 30 % over a limit of 10 calls/s;
    while no 429 came under the limit read (no stray ones to tell apart), one or two
    short are the limit's. Once stray ones were seen, three are needed again."""
    rules = pace_rules(rate=None)
    past = read_10_at_30(learned_at=10.0, sent_last_second=11.0)  # 16 sent, 14 answered
    assert rate_now(rules, past, 30.0) == pytest.approx(11.0, rel=0.01)

    def three_429s(state: PaceState) -> PaceState:
        for n in range(3):
            state, _ = observe(rules, state, 30.0 + n * 0.1, Result.THROTTLED, retry_after_s=1.0)
        return state

    assert three_429s(past).learned_at == 30.2  # cut
    assert three_429s(past).cut_by == PAST_LIMIT
    seen = replace(past, strays=2.0, strays_at=29.0)
    assert three_429s(seen).learned_at == 10.0  # two short, and stray 429s seen: not cut
    long_ago = replace(seen, strays_at=-100.0)  # decayed over a minute: forgotten
    assert three_429s(long_ago).learned_at == 30.2


def test_a_429_under_the_read_is_stray_once_the_calls_before_the_cut_went() -> None:
    rules = pace_rules(rate=None)
    cut_at = PaceState(learned=8.5, learned_at=10.0, ceiling=10.0, ceiling_dense=10.0)
    assert rate_now(rules, cut_at, 11.0) < 10.0
    soon, _ = observe(rules, cut_at, 11.0, Result.THROTTLED, retry_after_s=1.0)
    assert soon.strays == 0.0  # within max_wait_s of the cut: a call admitted before it
    later, _ = observe(rules, cut_at, 13.0, Result.THROTTLED, retry_after_s=1.0)
    assert later.strays == 1.0
    near = replace(cut_at, learned=9.7)  # within 5 % of the read, which may run high
    assert 9.5 < rate_now(rules, near, 13.0) <= 10.0
    close, _ = observe(rules, near, 13.0, Result.THROTTLED, retry_after_s=1.0)
    assert close.strays == 0.0
    past = replace(cut_at, learned=9.0, learned_at=0.0, ceiling=8.0, ceiling_dense=8.0)
    assert rate_now(rules, past, 13.0) > 8.0
    above, _ = observe(rules, past, 13.0, Result.THROTTLED, retry_after_s=1.0)
    assert above.strays == 0.0  # past the limit read: the rate's, perhaps
    floor = replace(cut_at, ceiling_low=True)
    low, _ = observe(rules, floor, 13.0, Result.THROTTLED, retry_after_s=1.0)
    assert low.strays == 0.0  # a floor says nothing of where the limit is


def test_a_dense_cut_forgets_the_stray_429s_they_were_the_limits() -> None:
    rules = pace_rules(rate=None, evidence_min=3.0, evidence_share=0.0)
    state = PaceState(
        learned=17.0, learned_at=0.0, ceiling=20.0, scored_at=5.0, strays=0.5, strays_at=5.0,
        window_at=4.5, window_rate=17.0, last_s=1.0, last_answered=10,
    )  # fmt: skip
    for n in range(4):
        state, _ = observe(rules, state, 5.0 + n * 0.01, Result.THROTTLED, retry_after_s=1.0)
    assert state.cut_by == DENSE
    assert state.strays == 0.0


def test_dense_429s_cut_a_learned_rate_even_when_the_last_second_was_answered() -> None:
    """Dense 429s hold the fleet; a hold without a cut sent the fleet back at the same
    rate into the same limit, and the bucket it let refill answered a burst that the
    next cut read as the limit (a limit of 10 calls/s read as 11 to 14). So they
    cut, whatever the answers of the last second or so say."""
    rules = pace_rules(rate=None)
    state = read_10_at_30(learned_at=25.0, sent_last_second=9.0)  # 14 sent, 14 answered
    assert rate_now(rules, state, 30.0) < 10.0  # under the limit read: no "past" rule
    for n in range(6):  # 5 decayed, a tenth of 50 calls: dense
        state, _ = observe(rules, state, 30.0 + n * 0.01, Result.THROTTLED, retry_after_s=1.0)
    assert state.paused_until > 30.0  # the fleet holds
    assert state.learned_at == 30.05  # and the rate is cut, though all was answered
    assert state.cut_by == DENSE


PAST_A_READ = PaceState(learned=9.0, learned_at=0.0, ceiling=10.0, ceiling_dense=10.0)


def cut_lines(
    state: PaceState, caplog: pytest.LogCaptureFixture, rate: float | None = None
) -> tuple[list[str], MemoryPaceStore]:
    """Three 429s at 30.3 s through the adapter on `state`: the pace lines logged that
    say a cut (or a rate learned)."""
    store = MemoryPaceStore(lambda: 30.3)
    store.update(lambda _, now: (state, None))
    pace = Pace(store, pace_rules(rate=rate), sleep=lambda s: None)
    caplog.set_level(logging.INFO, "provisioner.gateway")
    for _ in range(3):
        pace.after(Result.THROTTLED, retry_after_s=1.0)
    pace.close()
    said = ("gateway pace cut", "gateway pace learned")
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(said)], store


def test_the_log_says_a_configured_rate_was_cut_not_learned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A configured rate's first cut: nothing was learned before it, but the rate in
    force was the configured one, and the line says so (docs/operations.md)."""
    dense = PaceState(
        scored_at=30.0, calls_score=100.0, throttled_score=9.0,
        window_at=29.5, window_rate=20.0, window_calls=10, last_s=1.0, last_answered=14,
    )  # fmt: skip
    cuts, _ = cut_lines(dense, caplog, rate=20.0)
    assert len(cuts) == 1
    assert cuts[0].startswith("gateway pace cut: ")
    assert "20 in force" in cuts[0]


def test_the_log_names_the_rule_that_cut_even_inside_an_earlier_hold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cut past the limit read while an earlier Retry-After still holds the fleet
    is said as what it is: the rate alone was cut, its 429s hold no one else."""
    cuts, store = cut_lines(replace(
        PAST_A_READ, scored_at=30.0, window_at=29.5, window_rate=11.0, last_s=1.0,
        last_answered=8, paused_until=31.0,
    ), caplog)  # fmt: skip
    assert len(cuts) == 1
    assert "past the limit it had read; they hold no call but their own" in cuts[0]
    assert "the fleet holds" not in cuts[0]
    assert store.read()[0].cut_by == PAST_LIMIT


def test_the_log_says_a_limit_read_from_unspaced_calls_is_a_floor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cut while the fleet sent far under the rate in force says its read is only
    a floor of the limit, so that an operator does not take it for the limit."""
    state = replace(
        PAST_A_READ, scored_at=30.0, window_at=29.5, window_rate=10.0, last_s=1.0,
        last_answered=4,
    )  # fmt: skip
    rules = pace_rules(rate=None)
    limited = rate_now(rules, state, 30.3)
    assert limited is not None
    assert rules.spaced_share * limited > 10.0 / 1.8  # 5.6 calls/s sent of 13.5
    cuts, store = cut_lines(state, caplog)
    assert len(cuts) == 1
    assert "its limit read as at least 9;" in cuts[0]
    assert store.read()[0].ceiling_low


def test_429s_dense_under_the_limit_read_show_it_fell() -> None:
    rules = pace_rules(rate=None, evidence_min=3.0, evidence_share=0.0)
    state = PaceState(
        learned=17.0, learned_at=0.0, ceiling=20.0, scored_at=5.0,
        window_at=4.5, window_rate=17.0, last_s=1.0, last_answered=10,
    )  # fmt: skip
    assert rate_now(rules, state, 5.0) < 20.0
    for n in range(4):
        state, _ = observe(rules, state, 5.0 + n * 0.01, Result.THROTTLED, retry_after_s=1.0)
    assert state.ceiling == pytest.approx(0.7 * 17.0)  # 10 / 1.5 answered: the floor
    assert state.paused_until > 5.0  # dense: the fleet holds
    assert state.cut_by == DENSE


def test_a_cut_spends_the_evidence_so_the_calls_sent_before_it_cannot_cut_again() -> None:
    rules = pace_rules(rate=None, cut_every_s=0.5)
    state = PaceState(window_at=1.0)
    state = count_calls(rules, state, 1.0, 100)
    for _ in range(11):
        state, _ = observe(rules, state, 1.1, Result.THROTTLED, retry_after_s=1.0)
    first = state.learned_at
    assert state.learned is not None
    for n in range(4):  # the calls admitted before the cut meet the limit too
        state, _ = observe(rules, state, 2.0 + n * 0.01, Result.THROTTLED, retry_after_s=1.0)
    assert state.learned_at == first


def test_a_call_asking_again_is_counted_once_even_after_a_cut() -> None:
    rules = pace_rules(rate=None, burst=1, max_wait_s=2.0, **EVERY_429)
    state, first = admit(rules, PaceState(), 10.0)
    assert isinstance(first, Go)
    assert (state.window_calls, state.calls_score) == (1, 1.0)
    held = replace(state, paused_until=10.4)  # a short hold came while it waited
    again, go = admit(rules, held, 10.5, again=True)
    assert isinstance(go, Go)
    assert (again.window_calls, again.calls_score) == (1, 1.0)
    cut = replace(state, learned=5.0, learned_at=10.2, calls_score=0.0)  # a cut spent it
    after, go = admit(rules, cut, 10.5, again=True)
    assert isinstance(go, Go)
    assert (after.window_calls, after.calls_score) == (1, 0.0)  # not among the cut's calls
    paused = replace(state, paused_until=30.0)  # a long hold: held back, its count kept
    held_back, hold = admit(rules, paused, 10.5, again=True)
    assert isinstance(hold, Hold)
    assert (held_back.window_calls, held_back.calls_score) == (1, 1.0)


def test_a_call_held_back_is_not_counted_as_sent() -> None:
    rules = pace_rules(rate=1.0, burst=1, max_wait_s=0.5)
    state, go = admit(rules, PaceState(), 10.0)
    assert isinstance(go, Go)
    held_state, held = admit(rules, state, 10.0)
    assert isinstance(held, Hold)
    assert held_state.window_calls == state.window_calls == 1
    assert held_state.calls_score == state.calls_score


def test_answers_reported_after_calls_reach_the_shared_state_with_the_next_write() -> None:
    store = MemoryPaceStore(clock=ManualClock(100.0))
    pace = Pace(store, pace_rules(rate=None), sleep=lambda s: None)
    for _ in range(3):
        assert pace.before() is None
        pace.after(Result.ANSWERED)
    assert store.read()[0].window_answered == 2  # the third is published with the next
    assert pace.before() is None
    assert store.read()[0].window_answered == 3


def test_repeated_failures_open_the_circuit_and_one_probe_goes_per_interval() -> None:
    rules = pace_rules(open_after=3, probe_every_s=10.0)
    state = PaceState()
    changes = []
    for n in range(3):
        state, change = observe(rules, state, 50.0 + n, Result.UNREACHABLE, error="HTTP 503")
        changes.append(change)
    assert changes[:2] == [None, None]
    assert changes[2] is not None
    assert changes[2].opened
    assert changes[2].since == 50.0

    decisions = calls(rules, state, [52.5, 55.0, 61.9])
    assert all(isinstance(d, Hold) and "circuit open: HTTP 503" in d.why for d in decisions)
    state, probe = admit(rules, state, 62.0)
    assert probe == Go(0.0, probe=True)
    _, after_probe = admit(rules, state, 62.1)
    assert isinstance(after_probe, Hold)  # one probe at a time, one per interval
    assert after_probe.wait_s == pytest.approx(9.9)

    closed, change = observe(rules, state, 62.3, Result.ANSWERED)
    assert change is not None
    assert not change.opened
    assert closed.open_since is None
    assert isinstance(admit(rules, closed, 62.4)[1], Go)


def test_no_second_probe_goes_while_one_may_still_be_in_flight() -> None:
    """A probe that hangs for its whole timeout holds the next one back; its failure
    starts the interval to the next probe from its end."""
    rules = pace_rules(open_after=1, probe_every_s=10.0, probe_lease_s=14.0)
    state, _ = observe(rules, PaceState(), 0.0, Result.UNREACHABLE, error="timed out")
    state, probe = admit(rules, state, 10.0)
    assert probe == Go(0.0, probe=True)
    _, during = admit(rules, state, 23.9)  # past the interval, the probe still out
    assert isinstance(during, Hold)
    assert during.wait_s == pytest.approx(0.1)

    state, change = observe(rules, state, 23.0, Result.UNREACHABLE, error="timed out",
                            probe=True)  # fmt: skip
    assert change is None  # still open: no second WARNING
    assert state.probe_at == 33.0
    assert isinstance(admit(rules, state, 32.9)[1], Hold)
    assert admit(rules, state, 33.0)[1] == Go(0.0, probe=True)

    # A call sent before the circuit opened failing late moves no probe.
    late, _ = observe(rules, state, 24.0, Result.UNREACHABLE, error="timed out")
    assert late.probe_at == state.probe_at


def test_an_answer_between_failures_keeps_the_circuit_closed() -> None:
    rules = pace_rules(open_after=3)
    state = PaceState()
    for result in [Result.UNREACHABLE, Result.UNREACHABLE, Result.ANSWERED, Result.UNREACHABLE,
                   Result.THROTTLED, Result.UNREACHABLE, Result.UNREACHABLE]:  # fmt: skip
        state, change = observe(rules, state, 1.0, result)
        assert change is None
    assert state.open_since is None
    unchanged, _ = observe(rules, PaceState(), 1.0, Result.ANSWERED)
    assert unchanged == PaceState()  # nothing to write


# Through the adapter.


class Upstream:
    """A scripted gateway: answers from `script`, then 200s; counts what reached it."""

    def __init__(self, *script: httpx.Response) -> None:
        self.script = list(script)
        self.count = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.count += 1
        if self.script:
            return self.script.pop(0)
        return httpx.Response(200, json={"status": "created"})


def adapter(upstream: Upstream, rules: PaceRules, clock: ManualClock) -> tuple[HttpGateway, Pace]:
    events: list[tuple[str, float]] = []
    pace = Pace(MemoryPaceStore(clock), rules, sleep=lambda s: None,
                on_event=lambda k, v: events.append((k, v)))  # fmt: skip
    gateway = HttpGateway("https://gw.test", "token-123456", retries=0,
                          transport=httpx.MockTransport(upstream), pace=pace)  # fmt: skip
    return gateway, pace


def test_an_outage_opens_the_circuit_once_and_calls_stop_reaching_the_gateway(
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream = Upstream(*[httpx.Response(503) for _ in range(5)])
    clock = ManualClock(seconds=1000.0)
    gateway, _pace = adapter(upstream, pace_rules(open_after=5, probe_every_s=10.0), clock)
    caplog.set_level(logging.INFO, "provisioner.gateway")

    for _ in range(20):
        with pytest.raises(TransientGatewayError):
            gateway.status("ws-1")
    assert upstream.count == 5  # after the fifth failure nothing was sent
    with pytest.raises(TransientGatewayError, match="circuit open") as held:
        gateway.status("ws-1")
    assert held.value.retry_after_s == pytest.approx(10.0)

    clock.advance(10.0)
    assert gateway.status("ws-1") == "created"  # the probe: the gateway is back
    assert gateway.status("ws-1") == "created"
    assert upstream.count == 7
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "INFO"]
    assert "gateway circuit open: 5 calls in a row got no answer" in lines[0][1]
    assert "gateway circuit closed" in lines[1][1]
    gateway.close()


def test_a_429_pauses_the_next_calls_without_sending_them() -> None:
    upstream = Upstream(httpx.Response(429, headers={"Retry-After": "20"}))
    clock = ManualClock(seconds=1000.0)
    gateway, _ = adapter(upstream, pace_rules(**EVERY_429), clock)

    with pytest.raises(TransientGatewayError, match="429") as first:
        gateway.family("parent")
    with pytest.raises(TransientGatewayError, match="Retry-After") as second:
        gateway.create_child("parent", "Acme")  # never sent: nothing can have been made
    assert first.value.retry_after_s == 20.0
    assert second.value.retry_after_s == pytest.approx(20.0)
    assert upstream.count == 1
    clock.advance(20.0)
    assert gateway.status("ws-1") == "created"
    gateway.close()


def test_a_learned_rate_grows_into_no_limit_and_never_overflows() -> None:
    rules = pace_rules()
    state = PaceState(learned=10.0, learned_at=0.0)
    assert rate_now(rules, state, 60.0) == pytest.approx(10.0 * 1.10**60)
    near = PaceState(learned=10.0, learned_at=0.0, ceiling=11.0)  # slow past the knee
    assert rate_now(rules, near, 1e12) is None
    for later in (200.0, 4 * 3600.0, 10 * 86400.0, 1e12):  # hours, days after the last 429
        assert rate_now(rules, state, later) is None
        assert admit(rules, state, later)[1] == Go(0.0)


def test_a_500_is_one_request_broken_and_a_502_503_504_the_gateway_down() -> None:
    upstream = Upstream(*[httpx.Response(500) for _ in range(10)])
    gateway, pace = adapter(upstream, pace_rules(open_after=2), ManualClock(seconds=1000.0))
    for _ in range(10):
        with pytest.raises(TransientGatewayError):
            gateway.status("ws-1")
    assert upstream.count == 10  # a broken workspace never opens the fleet's circuit
    for code in (502, 504):
        upstream.script = [httpx.Response(code)]
        with pytest.raises(TransientGatewayError):
            gateway.status("ws-1")
    assert pace.state()[0].open_since is not None
    gateway.close()


class BrokenStore(MemoryPaceStore):
    def update(self, fn: object) -> object:  # type: ignore[override]
        raise ConnectionError("the database is down")


def test_a_pace_it_cannot_read_holds_the_call_unsent_and_a_lost_report_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream = Upstream()
    pace = Pace(BrokenStore(), pace_rules(), sleep=lambda s: None)
    gateway = HttpGateway("https://gw.test", "token-123456", retries=0,
                          transport=httpx.MockTransport(upstream), pace=pace)  # fmt: skip
    caplog.set_level(logging.INFO, "provisioner.gateway")

    for _ in range(3):
        with pytest.raises(TransientGatewayError, match="database is unavailable"):
            gateway.create_child("parent", "Acme")  # never sent: nothing made
    pace.after(Result.UNREACHABLE, error="HTTP 503")  # a report it cannot take: no raise

    assert upstream.count == 0
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1  # once for the outage, not once a call
    gateway.close()


def told_adapter(
    upstream: Upstream, rules: PaceRules, clock: ManualClock
) -> tuple[HttpGateway, list[float]]:
    """An adapter whose pace sleeps on `clock`, and what it slept."""
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)

    pace = Pace(MemoryPaceStore(clock), rules, sleep=sleep)
    gateway = HttpGateway("https://gw.test", "token-123456", retries=0,
                          transport=httpx.MockTransport(upstream), pace=pace)  # fmt: skip
    return gateway, slept


def throttled(retry_after: str | None) -> httpx.Response:
    return httpx.Response(429, headers={} if retry_after is None else {"Retry-After": retry_after})


def test_a_429_within_the_calls_patience_is_waited_in_its_thread() -> None:
    """A rate in force: a read answered 429 is sent once more after its Retry-After,
    and its hop keeps its place in the queue. A create is not sent again here: it is
    raised `waited`, and the hop records the refusal and creates again, so that every
    create sent is on record (tests/unit/test_service_hop.py)."""
    upstream = Upstream(throttled("1"))
    clock = ManualClock(seconds=1000.0)
    gateway, slept = told_adapter(upstream, pace_rules(rate=100.0, max_wait_s=2.0), clock)

    assert gateway.status("ws-9") == "created"
    assert (upstream.count, slept) == (2, [1.0])

    upstream.script = [throttled("3")]  # past a read's 2 s, within a create's 10 s
    with pytest.raises(TransientGatewayError, match="nothing created") as refused:
        gateway.create_child("parent", "Acme")
    assert refused.value.waited
    assert (upstream.count, slept) == (3, [1.0, 3.0])

    upstream.script = [throttled("1"), throttled("1")]
    with pytest.raises(TransientGatewayError, match="429") as again:
        gateway.status("ws-9")  # a second 429 is the hop's: it is deferred
    assert again.value.retry_after_s == 1.0
    assert upstream.count == 5
    gateway.close()


@pytest.mark.parametrize(
    ("retry_after", "create"),
    [("3", False), ("11", True), (None, False), ("0", True)],
    ids=["read-past-2s", "create-past-10s", "no-retry-after", "zero"],
)
def test_a_429_past_the_calls_patience_or_with_no_wait_defers_its_hop(
    retry_after: str | None, create: bool
) -> None:
    upstream = Upstream(throttled(retry_after))
    clock = ManualClock(seconds=1000.0)
    rules = pace_rules(rate=100.0, max_wait_s=2.0, create_wait_s=10.0)
    gateway, slept = told_adapter(upstream, rules, clock)

    def call() -> object:
        return gateway.create_child("parent", "Acme") if create else gateway.family("parent")

    with pytest.raises(TransientGatewayError, match="429") as throttled_once:
        call()
    assert not getattr(throttled_once.value, "waited", False)
    assert upstream.count == 1
    assert slept == []
    assert not waits_told(rules, PaceState(), 0.0, float(retry_after or 0), create=create)
    gateway.close()


def test_with_no_limit_in_force_a_429_defers_its_hop_and_frees_its_thread() -> None:
    """No rate and no hold: the threads are the fleet's capacity, so a stray 429's
    wait is not slept in one; once a rate is learned, or a hold is shared, it is."""
    rules = pace_rules(max_wait_s=2.0, **EVERY_429)
    upstream = Upstream(throttled("1"))
    clock = ManualClock(seconds=1000.0)
    gateway, slept = told_adapter(upstream, pace_rules(max_wait_s=2.0), clock)
    with pytest.raises(TransientGatewayError, match="429"):
        gateway.status("ws-1")
    assert (upstream.count, slept) == (1, [])

    assert not waits_told(rules, PaceState(), 1000.0, 1.0, create=False)
    held, _ = observe(rules, PaceState(), 1000.0, Result.THROTTLED, retry_after_s=1.0)
    assert held.paused_until == 1001.0
    assert held.learned is not None
    assert waits_told(rules, held, 1000.0, 1.0, create=False)
    hold_only, rate_only = replace(held, learned=None), replace(held, paused_until=0.0)
    assert waits_told(rules, hold_only, 1000.0, 1.0, create=False)
    assert waits_told(rules, rate_only, 1000.0, 1.0, create=False)
    gateway.close()


def test_a_create_waits_longer_for_its_turn_than_a_read() -> None:
    """Its hop listed the family already: deferring it would list the family again."""
    rules = pace_rules(rate=1.0, burst=1, max_wait_s=2.0, create_wait_s=10.0)
    state = PaceState()
    for _ in range(3):
        state, _ = admit(rules, state, 0.0)  # three calls at 1/s: the next is due at 3 s

    _, read = admit(rules, state, 0.0)
    _, create = admit(rules, state, 0.0, create=True)

    assert isinstance(read, Hold)
    assert create == Go(pytest.approx(3.0))


def test_a_failed_probe_through_the_adapter_restarts_the_interval_from_its_answer() -> None:
    upstream = Upstream(*[httpx.Response(503) for _ in range(6)])
    clock = ManualClock(seconds=1000.0)
    rules = pace_rules(open_after=5, probe_every_s=10.0, probe_lease_s=14.0)
    gateway, pace = adapter(upstream, rules, clock)
    for _ in range(5):
        with pytest.raises(TransientGatewayError):
            gateway.status("ws-1")
    clock.advance(10.0)
    with pytest.raises(TransientGatewayError, match="HTTP 503"):
        gateway.status("ws-1")  # the probe, answered 503 at once
    assert upstream.count == 6
    state, now = pace.state()
    assert state.probe_at == pytest.approx(now + 10.0)  # not the lease's 14 s


def test_holds_for_the_fleets_turn_are_paced_and_an_open_circuit_is_not() -> None:
    rules = pace_rules(rate=1.0, burst=1, max_wait_s=2.0, open_after=1, **EVERY_429)
    state = PaceState()
    for now in (0.0, 0.0, 0.0):
        state, decision = admit(rules, state, now)
    assert isinstance(decision, Go)  # the third waits 2 s: within patience
    _, held = admit(rules, state, 0.0)
    assert isinstance(held, Hold)
    assert held.paced  # its turn comes in 3 s
    paused, _ = observe(rules, PaceState(), 0.0, Result.THROTTLED, retry_after_s=9.0)
    _, held = admit(rules, paused, 0.0)
    assert isinstance(held, Hold)
    assert held.paced  # the shared Retry-After
    opened, _ = observe(rules, PaceState(), 0.0, Result.UNREACHABLE, error="refused")
    _, held = admit(rules, opened, 1.0)
    assert isinstance(held, Hold)
    assert not held.paced  # an outage: the deferral backoff grows


def test_a_call_held_for_its_turn_raises_a_paced_transient_error() -> None:
    clock = ManualClock(seconds=1000.0)
    gateway, _ = adapter(Upstream(), pace_rules(rate=1.0, burst=1, max_wait_s=0.5), clock)
    assert gateway.status("ws-1") == "created"
    with pytest.raises(TransientGatewayError, match="paced at 1 calls/s") as held:
        gateway.status("ws-1")
    assert held.value.paced
    assert held.value.retry_after_s == pytest.approx(1.0)


def test_a_burst_of_429s_cannot_cut_a_learned_rate_to_its_floor() -> None:
    rules = pace_rules(rate=None, **EVERY_429)
    state = PaceState(learned=20.0, learned_at=0.0, ceiling=25.0, scored_at=10.0)
    limited = rate_now(rules, state, 10.0)
    assert limited is not None
    state = replace(state, calls_score=100.0, throttled_score=99.0)  # nearly every call 429
    cut, _ = observe(rules, state, 10.0, Result.THROTTLED, retry_after_s=0.0)
    assert cut.ceiling == pytest.approx(limited * rules.backoff_factor)  # as a first cut would
    # Answers under that are a floor (decision 047), and a floor never takes the rate
    # under `backoff_factor` of what the last cut set (decision 048).
    assert cut.ceiling_low
    floor = rules.backoff_factor * 20.0  # of the rate the last cut set
    assert rate_now(rules, cut, 10.0) == pytest.approx(
        max(cut.ceiling * rules.below_ceiling, floor)
    )


def test_a_rate_does_not_grow_while_the_fleet_is_held() -> None:
    """Nothing sent during a shared hold says the limit is higher: a rate grown
    through it met the limit far past it when the hold ended (31 calls/s for a limit
    of 20, a second after a cut to 23). And a long Retry-After (a minute, for a quota
    by the minute) would grow a searching rate past any limit."""
    rules = pace_rules(rate=None, **EVERY_429)
    state = PaceState(learned=10.0, learned_at=0.0, scored_at=5.0, calls_score=50.0)
    cut, _ = observe(rules, state, 5.0, Result.THROTTLED, retry_after_s=60.0)
    assert cut.learned_at == 5.0
    assert cut.paused_until == 65.0
    set_to = rate_now(rules, cut, 5.0)
    assert rate_now(rules, cut, 65.0) == set_to  # the hold over: as the cut set it
    assert rate_now(rules, cut, 66.0) > set_to  # then it grows


def test_no_hold_since_the_cut_counts_as_growth() -> None:
    """Dense 429s within `cut_every_s` of a cut hold the fleet again without a cut. A
    hold that begins after the last one ended must not make that one's time count as
    growth again: a second of growth at once, met as 429s when the hold ends."""
    rules = pace_rules(rate=None, **EVERY_429)
    state = PaceState(learned=10.0, learned_at=0.0, scored_at=5.0, calls_score=50.0)
    cut, _ = observe(rules, state, 5.0, Result.THROTTLED, retry_after_s=1.0)
    assert (cut.learned_at, cut.paused_until) == (5.0, 6.0)
    again, _ = observe(rules, cut, 7.0, Result.THROTTLED, retry_after_s=1.0)
    assert again.learned_at == 5.0  # within cut_every_s: held again, not cut
    assert (again.held_from, again.paused_until) == (7.0, 8.0)
    # Two holds of a second each: grown as for 3 s, not 4 (or 5) since the cut.
    never_held = replace(cut, paused_until=0.0, held_from=0.0)
    assert rate_now(rules, again, 10.0) == pytest.approx(rate_now(rules, never_held, 8.0))
    assert rate_now(rules, again, 10.0) < rate_now(rules, never_held, 9.0)
    # A cut starts the count again: the holds before it are before its rate.
    later, _ = observe(rules, replace(again, calls_score=50.0, scored_at=20.0), 20.0,
                       Result.THROTTLED, retry_after_s=1.0)  # fmt: skip
    assert (later.learned_at, later.held_s) == (20.0, 0.0)


def test_a_floor_never_takes_the_rate_under_most_of_what_the_last_cut_set() -> None:
    """The hops a hold deferred come back together: dense 429s, in a window that sent
    and answered two calls a second. Read alone, that floor cut a rate of 25 calls/s to
    1.7, and a floor's growth took a minute back to a limit of 20."""
    rules = pace_rules(rate=None, **EVERY_429)
    state = PaceState(
        learned=17.5, learned_at=0.0, ceiling=None, scored_at=4.0, calls_score=30.0,
        throttled_score=10.0, window_at=3.5, window_rate=2.0, window_calls=1, last_s=1.0,
        last_answered=2,
    )  # fmt: skip
    state = count_answered(state, 3.9, 1)
    limited = rate_now(rules, state, 4.0)
    assert limited is not None
    cut, _ = observe(rules, state, 4.0, Result.THROTTLED, retry_after_s=1.0)
    assert cut.learned_at == 4.0
    assert cut.ceiling_low
    assert cut.ceiling is not None
    assert cut.ceiling == pytest.approx(2.0)  # 3 answered in 1.5 s
    assert rate_now(rules, cut, 4.0) == pytest.approx(rules.backoff_factor * 17.5)


def test_past_its_estimate_of_the_limit_a_rate_grows_fast_again() -> None:
    """An estimate the rate outgrew without a 429 is stale (a limit that rose): slow
    growth lasts from the knee to `stale_above` of it, no longer."""
    rules = pace_rules(rate=None)
    state = PaceState(learned=9.0, learned_at=0.0, ceiling=10.0)  # at the knee already
    slow_s = math.log(rules.stale_above / rules.knee) / math.log1p(rules.growth_near_limit_per_s)
    assert rate_now(rules, state, slow_s) == pytest.approx(10.0 * rules.stale_above)
    assert rate_now(rules, state, slow_s + 10.0) == pytest.approx(
        10.0 * rules.stale_above * (1 + rules.growth_per_s) ** 10
    )
    assert slow_s < 25.0  # a risen limit is found within tens of seconds, not minutes


def test_a_learned_rate_refuses_rules_it_cannot_follow() -> None:
    for bad in (
        {"growth_per_s": 0.0},
        {"knee": 1.2},
        {"below_ceiling": 0.95},
        {"stale_above": 1.0},
    ):
        with pytest.raises(ValueError, match="learned rate"):
            pace_rules(**bad)


def test_a_waiting_call_still_goes_unless_a_cut_a_new_hold_or_the_circuit_came() -> None:
    admitted = PaceState(learned=10.0, learned_at=50.0, paused_until=60.0)
    assert still_admitted(admitted, admitted, 60.5)
    assert still_admitted(admitted, replace(admitted, window_calls=9), 60.5)  # counts moved
    assert still_admitted(admitted, admitted, 59.9)  # the hold it was admitted past
    assert not still_admitted(admitted, replace(admitted, learned=7.0, learned_at=60.2), 60.5)
    assert not still_admitted(admitted, replace(admitted, paused_until=61.0), 60.5)
    assert still_admitted(admitted, replace(admitted, paused_until=61.0), 61.0)  # over
    assert not still_admitted(admitted, replace(admitted, open_since=60.1), 60.5)
    probe = replace(admitted, open_since=40.0)
    assert still_admitted(probe, probe, 60.5)  # let through an open circuit: it goes


def test_a_cut_gives_back_the_turns_taken_at_the_old_rate() -> None:
    rules = pace_rules(rate=None, burst=1, **EVERY_429)
    state = replace(PaceState(), learned=20.0, learned_at=0.0, ceiling=25.0)
    now = 10.0
    for _ in range(30):  # 30 calls admitted at once: turns up to 1.5 s ahead
        state, _ = admit(rules, state, now)
    assert state.tat > now + 1.0
    cut, _ = observe(rules, state, now + 0.1, Result.THROTTLED, retry_after_s=1.0)
    assert cut.learned_at == now + 0.1
    assert cut.learned is not None
    assert cut.learned < 20.0
    assert cut.tat == now + 0.1  # the calls queued ask again, at the new rate from now


def test_a_call_whose_wait_a_cut_outlived_asks_again_and_waits_at_the_new_rate() -> None:
    clock = ManualClock(100.0)
    store = MemoryPaceStore(clock=clock)
    rules = pace_rules(rate=None, burst=1, **EVERY_429)
    store.update(lambda s, now: (replace(s, learned=4.0, learned_at=now - 10, tat=now + 0.5), 0))
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # meanwhile another process's 429s cut the rate
        slept.append(seconds)
        clock.advance(seconds)
        if len(slept) == 1:
            store.update(lambda s, now: observe(rules, s, now, Result.THROTTLED))

    pace = Pace(store, rules, sleep=sleep)
    before = rate_now(rules, *store.read())
    assert before is not None
    assert pace.before() is None
    state, _ = store.read()
    assert state.learned is not None
    assert state.learned < before  # cut while the call waited its turn
    assert slept[0] == pytest.approx(0.5)
    assert len(slept) == 2  # asked again, and waited for a turn at the new rate
    assert slept[1] == pytest.approx(1.0)  # the hold the 429 asked for (1 s by default)
    assert state.window_calls == 1  # counted once, though admitted twice


def test_a_cut_gives_back_the_turns_but_not_the_bursts_credit() -> None:
    rules = pace_rules(rate=None, burst=5, **EVERY_429)
    state = replace(PaceState(), learned=20.0, learned_at=0.0, ceiling=25.0)
    for _ in range(40):
        state, _ = admit(rules, state, 10.0)
    cut, _ = observe(rules, state, 10.1, Result.THROTTLED, retry_after_s=1.0)
    assert cut.learned is not None
    assert cut.tat == pytest.approx(10.1 + 4 / cut.learned)
    unheld = replace(cut, paused_until=0.0)  # as after a cut past the limit, which holds none
    waits = [d.wait_s for d in calls(rules, unheld, [10.1] * 3) if isinstance(d, Go)]
    assert waits[0] == 0.0
    assert waits[1] == pytest.approx(1 / cut.learned)  # spaced at once: no burst of 5


def test_a_call_that_keeps_meeting_new_holds_is_held_not_sent() -> None:
    clock = ManualClock(100.0)
    store = MemoryPaceStore(clock=clock)
    rules = pace_rules(rate=None, burst=1, max_wait_s=2.0, **EVERY_429)
    store.update(lambda s, now: (replace(s, paused_until=now + 0.9), 0))
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # each wait ends in a new hold of another process
        slept.append(seconds)
        clock.advance(seconds)
        store.update(lambda s, now: (replace(s, paused_until=now + 0.9), 0))

    held = Pace(store, rules, sleep=sleep).before()
    assert isinstance(held, Hold)  # never sent through a hold: its hop waits
    assert held.paced
    assert len(slept) == 1 + ASK_AGAIN_MAX  # each wait within its patience
    assert max(slept) <= rules.max_wait_s


class _RacedStore:
    """A shared store whose read began before another thread's admission and ends
    after it: its answer is older than the copy that admission left."""

    shared = True

    def __init__(self, pace_of: list[Pace]) -> None:
        self.state, self.now, self.pace_of = PaceState(learned=5.0, learned_at=1.0), 50.0, pace_of

    def update(self, fn):  # type: ignore[no-untyped-def]
        self.state, out = fn(self.state, self.now)
        return out

    def read(self) -> tuple[PaceState, float]:
        older = self.state
        self.state = replace(self.state, learned=4.0, learned_at=49.0)  # a cut meanwhile
        assert self.pace_of[0].before() is None  # an admission on the newer state
        return older, self.now

    def close(self) -> None:
        pass


def test_a_refresh_older_than_an_admission_never_replaces_its_copy() -> None:
    pace_of: list[Pace] = []
    store = _RacedStore(pace_of)
    pace = Pace(store, pace_rules(rate=None, burst=1), sleep=lambda s: None, refresh_s=3600.0)
    pace_of.append(pace)
    pace.refresh()
    latest = pace._latest()  # what a waiting call compares against
    assert latest is not None
    assert latest[0].learned_at == 49.0  # the admission's, not the older read's
    pace.close()
