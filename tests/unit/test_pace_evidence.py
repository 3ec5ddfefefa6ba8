"""The fleet's pace takes evidence, not one data point: a stray 429 costs its own
call's retry, 429s dense enough to be a rate limit hold and cut the fleet; and a
call costs nothing of the shared state while no limit is in force."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from domain.pacing import (
    Go,
    Hold,
    PaceRules,
    PaceState,
    Result,
    admit,
    count_answered,
    count_calls,
    free,
    observe,
    rate_now,
    rate_signal,
)
from infrastructure.gateway.pacing import Pace
from tests.support import pace_rules

RULES = pace_rules()  # no rate configured: learned


def run(calls_per_s: float, share_429: float, seconds: float, seed: int = 7) -> PaceState:
    """`calls_per_s` calls a second, each answered 429 with probability `share_429`."""
    draw = random.Random(seed)
    state, now, step = PaceState(), 1000.0, 1.0 / calls_per_s
    end = now + seconds
    while now < end:
        state, decision = admit(RULES, state, now)
        assert isinstance(decision, Go) or state.paused_until > now or state.learned
        result = Result.THROTTLED if draw.random() < share_429 else Result.ANSWERED
        state, _ = observe(RULES, state, now, result, retry_after_s=5.0)
        now += step
    return state


def test_stray_429s_at_3_percent_never_hold_nor_cut_the_fleet() -> None:
    for rate in (5.0, 20.0, 100.0):
        for seed in range(10):
            state = run(rate, 0.03, 60.0, seed)
            assert state.paused_until == 0.0, (rate, seed)
            assert state.learned is None, (rate, seed)


def test_429s_dense_as_a_rate_limit_hold_and_cut_the_fleet() -> None:
    state = run(20.0, 0.5, 2.0)
    assert state.paused_until > 1000.0
    assert state.learned is not None


def test_one_429_alone_is_no_signal_however_few_the_calls() -> None:
    state, _ = observe(RULES, PaceState(), 10.0, Result.THROTTLED, retry_after_s=60.0)
    assert not rate_signal(RULES, state, 10.0)
    assert state.paused_until == 0.0
    assert state.throttled_score == 1.0


def test_the_evidence_fades_after_a_few_seconds() -> None:
    state = PaceState()
    for n in range(9):  # nine 429s in a row: not yet a tenth of 100 calls
        state, _ = observe(RULES, state, 10.0 + n * 0.01, Result.THROTTLED, retry_after_s=1.0)
    assert not rate_signal(RULES, state, 10.0)  # decayed a little: just under the share
    later, _ = observe(RULES, state, 40.0, Result.THROTTLED, retry_after_s=1.0)
    assert not rate_signal(RULES, later, 40.0)  # the first nine have faded
    state, _ = observe(RULES, state, 10.1, Result.THROTTLED, retry_after_s=1.0)
    assert not rate_signal(RULES, state, 10.1)  # ten, decayed a little: just under
    assert state.learned is None
    state, _ = observe(RULES, state, 10.11, Result.THROTTLED, retry_after_s=1.0)
    assert state.learned is not None  # eleven within the moment, all of the calls: cut
    assert state.paused_until > 10.11
    assert state.throttled_score == state.calls_score == 0.0  # the cut spent the evidence


def test_free_only_while_no_limit_is_in_force() -> None:
    assert free(RULES, PaceState(), 0.0)
    assert not free(pace_rules(rate=10.0), PaceState(), 0.0)
    assert not free(RULES, PaceState(learned=5.0, learned_at=0.0), 1.0)
    assert not free(RULES, PaceState(paused_until=5.0), 1.0)
    assert free(RULES, PaceState(paused_until=5.0), 6.0)
    assert not free(RULES, PaceState(unreachable=1), 0.0)
    assert not free(RULES, PaceState(open_since=0.0), 1.0)


def test_calls_published_later_count_as_the_calls_admitted_one_by_one() -> None:
    one_by_one = PaceState()
    for _ in range(30):
        one_by_one = count_calls(RULES, one_by_one, 5.0, 1)
    at_once = count_calls(RULES, PaceState(), 5.0, 30)
    assert at_once.window_calls == one_by_one.window_calls == 30
    assert at_once.calls_score == one_by_one.calls_score


# The local copy (infrastructure/gateway/pacing.py): what a call costs of the shared store.


class SharedStore:
    """A store shared by processes, counting its round trips."""

    shared = True

    def __init__(self) -> None:
        self.state, self.now = PaceState(), 1000.0
        self.updates = self.reads = 0

    def update(self, fn: Any) -> Any:
        self.updates += 1
        self.state, out = fn(self.state, self.now)
        return out

    def read(self) -> tuple[PaceState, float]:
        self.reads += 1
        return self.state, self.now

    def close(self) -> None:
        pass


class Monotonic:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def local_pace(store: SharedStore, rules: PaceRules = RULES) -> tuple[Pace, Monotonic]:
    clock = Monotonic()
    pace = Pace(store, rules, sleep=lambda s: None, refresh_s=3600.0, monotonic=clock)
    return pace, clock


def test_no_limit_in_force_a_call_costs_no_round_trip() -> None:
    store = SharedStore()
    pace, _ = local_pace(store)
    assert pace.before() is None  # the first: no copy yet, admitted by the store
    first = store.updates

    for _ in range(100):
        assert pace.before() is None
        pace.after(Result.ANSWERED)
    pace.refresh()  # the background read, publishing what was sent
    pace.close()

    assert store.updates == first + 1  # the one publication, not one per call
    assert store.state.window_calls == 101


def test_a_429_is_written_with_the_calls_sent_on_the_copy_before_it() -> None:
    """A first cut reads what the fleet was sending: the calls a process sent on its
    copy since its last refresh count, or a burst's 429s cut to a share of a few."""
    store = SharedStore()
    pace, _ = local_pace(store)
    pace.before()  # the first, through the store: a copy from now on
    for _ in range(40):
        assert pace.before() is None
    for _ in range(10):
        pace.after(Result.ANSWERED)
    pace.after(Result.THROTTLED, retry_after_s=1.0)
    assert store.state.window_calls == 41
    assert store.state.window_answered == 10
    pace.refresh()  # nothing left to publish twice
    pace.close()
    assert store.state.window_calls == 41


def test_a_configured_rate_admits_each_call_in_the_store() -> None:
    store = SharedStore()
    pace, _ = local_pace(store, pace_rules(rate=1000.0, burst=1000))
    for _ in range(10):
        pace.before()
    pace.close()
    assert store.updates == 10


def test_a_hold_another_process_wrote_reaches_this_one_at_the_next_refresh() -> None:
    store = SharedStore()
    pace, clock = local_pace(store)
    pace.before()
    for n in range(12):  # another process's 429s, dense: a rate signal
        store.state, _ = observe(RULES, store.state, 1000.0 + n * 0.01, Result.THROTTLED,
                                 retry_after_s=30.0)  # fmt: skip
    assert pace.before() is None  # its copy is older than the hold: still free here
    pace.refresh()
    clock.t += 0.05
    held = pace.before()
    pace.close()
    assert held is not None
    assert held.paced


def test_under_a_rate_answers_reach_the_store_with_the_next_refresh() -> None:
    """A cut reads the answers a second: they must not wait for this process's next
    admission, which may be seconds away while its threads wait for their turns. A
    configured rate is cut too (decision 046), so its answers are published alike;
    with nothing to publish a refresh stays a read."""
    for rate in (None, 50.0):
        store = SharedStore()
        store.state = PaceState(learned=50.0, learned_at=999.0)  # in force (or configured)
        pace, _ = local_pace(store, pace_rules(rate=rate, burst=10))
        for _ in range(3):
            assert pace.before() is None  # through the store: a rate is in force
        for _ in range(3):
            pace.after(Result.ANSWERED)
        updates = store.updates
        pace.refresh()
        assert store.state.window_answered == 3, rate
        assert store.updates == updates + 1, rate
        pace.refresh()
        assert store.updates == updates + 1, rate  # nothing new: a read
        pace.close()


def test_a_copy_older_than_stale_s_is_not_trusted() -> None:
    store = SharedStore()
    pace, clock = local_pace(store)
    pace.before()
    clock.t += 0.6  # no refresh for longer than stale_s
    before = store.updates
    pace.before()
    pace.close()
    assert store.updates == before + 1


class CommitFails(SharedStore):
    """A store whose next write runs and is then not committed (the connection lost)."""

    fail_next = False

    def update(self, fn: Any) -> Any:
        if not self.fail_next:
            return super().update(fn)
        self.fail_next = False
        fn(self.state, self.now)  # what the step decided, rolled back
        raise ConnectionError("the commit was lost")


def test_a_write_not_committed_shows_nowhere_and_gives_its_counts_back() -> None:
    store = CommitFails()
    pace, _ = local_pace(store, pace_rules(open_after=1))
    pace.before()  # the first, through the store: a free copy from now on
    for _ in range(7):
        assert pace.before() is None  # on the copy
    store.fail_next = True
    pace.after(Result.UNREACHABLE, error="refused")  # would open the circuit: not stored
    latest = pace._latest()
    assert latest is not None
    assert latest[0].open_since is None  # the copy shows only what was stored
    assert pace.before() is None  # still free here, as in the store
    pace.refresh()
    pace.close()
    assert store.state.window_calls == 1 + 8  # the counts the failed write took, given back


class SlowRead(SharedStore):
    """A store whose answers take `delay_s` of the process's monotonic clock."""

    def __init__(self, clock: Monotonic, delay_s: float) -> None:
        super().__init__()
        self.clock, self.delay_s = clock, delay_s

    def read(self) -> tuple[PaceState, float]:
        self.clock.t += self.delay_s
        return super().read()


def test_a_copy_runs_on_from_when_its_read_came_back_never_ahead() -> None:
    clock = Monotonic()
    store = SlowRead(clock, delay_s=0.08)
    pace = Pace(store, RULES, sleep=lambda s: None, refresh_s=3600.0, monotonic=clock)
    store.state = PaceState(paused_until=1000.05)  # a hold for 50 ms more, in the store's time
    pace.refresh()  # 80 ms to come back, the store's time read within it
    latest = pace._latest()
    assert latest is not None
    assert latest[1] == 1000.0  # not 1000.08: the read's time is counted once
    updates = store.updates
    pace.before()
    assert store.updates == updates + 1  # the hold still stands: not admitted on the copy
    pace.close()


def test_a_copy_older_than_stale_s_tells_no_thread_to_wait() -> None:
    """What a process knows of the fleet from a copy older than `stale_s` (its refresher
    stuck on the database): a told Retry-After is not waited in the thread on it, and
    the hop defers, as with no copy at all."""
    store = SharedStore()
    store.state = PaceState(learned=20.0, learned_at=999.0)  # a limit in force
    pace, clock = local_pace(store)
    pace.before()  # a copy, through the store
    assert pace.told(1.0) is True  # fresh: the thread waits its Retry-After
    clock.t += 0.6  # no refresh since, for longer than stale_s
    assert pace._latest(fresh=True) is None
    assert pace.told(1.0) is False
    pace.close()


class NewerMeanwhile(SharedStore):
    """A write whose answer comes back late: meanwhile another process writes a hold
    and this process's refresher reads it (`meanwhile`, once)."""

    def __init__(self) -> None:
        super().__init__()
        self.meanwhile: Any = None

    def update(self, fn: Any) -> Any:
        out = super().update(fn)
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            meanwhile()
        return out


def test_a_write_that_comes_back_after_a_newer_read_never_replaces_its_copy() -> None:
    store = NewerMeanwhile()
    pace, clock = local_pace(store)
    pace.before()  # a free copy from now on
    clock.t += 0.01

    def another_process_holds_and_this_one_reads_it() -> None:
        store.state = replace(store.state, paused_until=1030.0, version=store.state.version + 1)
        clock.t += 0.01
        pace.refresh()
        clock.t += 0.01

    store.meanwhile = another_process_holds_and_this_one_reads_it
    pace.after(Result.THROTTLED, retry_after_s=1.0)  # a stray 429: written, free still
    latest = pace._latest()
    assert latest is not None
    assert latest[0].paused_until == 1030.0  # the newer row the refresh read stays
    assert pace.before() is not None  # held: not sent into the fleet's hold
    pace.close()


def test_a_call_that_waited_its_turn_checks_even_a_stale_copy_for_a_hold() -> None:
    """A stale copy is no ground to wait a 429 in the thread, but one that knows of a
    hold begun since the call was admitted still holds it."""
    store = SharedStore()
    store.state = PaceState(learned=2.0, learned_at=999.0)  # a turn every 0.5 s
    clock = Monotonic()

    def sleep(seconds: float) -> None:
        if not slept:  # while the first call waits: a hold comes, then no refresh
            store.state = replace(store.state, paused_until=1030.0)
            pace.refresh()
        slept.append(seconds)
        clock.t += 0.6

    slept: list[float] = []
    pace = Pace(store, pace_rules(burst=1), sleep=sleep, refresh_s=3600.0, monotonic=clock)
    assert pace.before() is None  # the first goes at once
    held = pace.before()  # waits its turn; the copy is 0.6 s old when it wakes
    pace.close()
    assert isinstance(held, Hold)


def test_close_publishes_the_answers_a_learned_rate_reads() -> None:
    store = SharedStore()
    store.state = PaceState(learned=50.0, learned_at=999.0)
    pace, _ = local_pace(store)
    for _ in range(3):
        assert pace.before() is None  # through the store: a learned rate is in force
        pace.after(Result.ANSWERED)  # counted in the process, nothing written
    pace.close()
    assert store.state.window_answered == 3


class LockTakenFirst(SharedStore):
    """The refresher's write finds another thread of its process holding the row: that
    thread's 429 is written first."""

    def __init__(self) -> None:
        super().__init__()
        self.first: Any = None
        self.seen_by_first = -1

    def update(self, fn: Any) -> Any:
        first, self.first = self.first, None
        if first is not None:
            first()  # the other write, which took the lock first
            self.seen_by_first = self.state.window_calls
        return super().update(fn)


def test_the_write_that_takes_the_lock_first_publishes_the_calls_sent() -> None:
    store = LockTakenFirst()
    pace, _ = local_pace(store)
    pace.before()  # through the store: a copy from now on
    for _ in range(40):
        assert pace.before() is None
    store.first = lambda: pace.after(Result.THROTTLED, retry_after_s=1.0)
    pace.refresh()
    pace.close()
    assert store.seen_by_first == 41  # the 429 was judged with the 40 sent on the copy
    assert store.state.window_calls == 41  # and they were published once


def test_a_rate_reads_as_a_person_writes_it() -> None:
    from domain.pacing import shown

    assert [shown(r) for r in (0.25, 7.5, 19.0, 6580.4)] == ["0.25", "7.5", "19", "6,580"]


def learned_then(limit: float | None, seconds: float, seed: int) -> tuple[PaceState, int]:
    """A limit of 25 calls/s was learned; then, for `seconds`, calls as fast as the pace
    admits them, 3 % answered 429 at random and, with a `limit`, those beyond a bucket
    of that rate (burst 5). The pace's burst is a worker's default, 1: one of 10 would
    send faster than the bucket's, and its 429s would be dense, not stray. (The state
    at the end or once no limit is in force, the cuts made.)"""
    rules = pace_rules(burst=1)
    draw = random.Random(seed)
    state = PaceState(learned=21.0, learned_at=1000.0, ceiling=25.0, ceiling_dense=25.0)
    now, tokens, cuts = 1000.0, 5.0, 0
    while now < 1000.0 + seconds and rate_now(rules, state, now) is not None:
        state, decision = admit(rules, state, now)
        now += decision.wait_s
        if isinstance(decision, Go):
            if limit is not None:
                tokens = min(5.0, tokens + limit * 0.01)
            ok = tokens >= 1 and draw.random() >= 0.03
            tokens -= 1 if ok and limit is not None else 0
            before = state.learned_at
            result = Result.ANSWERED if ok else Result.THROTTLED
            state, _ = observe(rules, state, now, result, retry_after_s=1.0)
            state = count_answered(state, now, 1) if ok else state
            cuts += state.learned_at != before
        now += 0.01
        if limit is not None:
            tokens = min(5.0, tokens + limit * max(decision.wait_s, 0.0))
    return state, cuts


def test_stray_429s_under_a_learned_limit_never_ratchet_it_down() -> None:
    """The limit still 25 calls/s, stray 429s on top: the limit read stays within
    `few_keep` of it (without that floor, it falls cut by cut)."""
    for seed in range(3):
        state, _ = learned_then(25.0, 120.0, seed)
        assert state.ceiling is not None
        assert state.ceiling >= RULES.few_keep * 25.0, seed


def test_stray_429s_never_pin_a_learned_rate_once_the_limit_is_lifted() -> None:
    """No limit any more, only stray 429s: a cut now and then at most (a stray share
    above 5 % for a few seconds, by chance), and the rate grows past any limit."""
    for seed in range(3):
        state, cuts = learned_then(None, 600.0, seed)
        assert cuts <= 2, seed
        assert rate_now(RULES, state, 1600.0) is None, seed  # free within the ten minutes
        assert state.scored_at < 1300.0, seed  # ... within five


def strict_limiter(limit: float, seconds: float, seed: int) -> tuple[list[float], float]:
    """No rate configured; for `seconds`, calls as fast as the pace admits them into a
    limiter of `limit` calls/s with no burst, each reaching it up to 5 ms late. (The
    limits the cuts read, and the calls/s it answered.)"""
    rules = pace_rules(burst=1)
    draw = random.Random(seed)
    state, now = PaceState(), 1000.0
    tokens, at, reads, answered = 1.0, now, [], 0
    while now < 1000.0 + seconds:
        state, decision = admit(rules, state, now)
        now += decision.wait_s
        if isinstance(decision, Go):
            arrive = now + draw.random() * 0.005
            tokens, at = min(1.0, tokens + max(0.0, arrive - at) * limit), max(at, arrive)
            ok = tokens >= 1.0
            tokens -= 1.0 if ok else 0.0
            answered += ok
            before = state.learned_at
            result = Result.ANSWERED if ok else Result.THROTTLED
            state, _ = observe(rules, state, now, result, retry_after_s=1.0)
            state = count_answered(state, now, 1) if ok else state
            if state.learned_at != before and state.ceiling is not None:
                reads.append(state.ceiling)
        now += 0.01
    return reads, answered / seconds


def test_a_limiter_with_no_burst_is_read_from_its_clean_windows() -> None:
    """Past its limit such a limiter refuses every call that comes a little early, and
    the answers read 15 to 16 calls/s for 20 (it answered 15.2 to 15.6 a second). Its
    last window with hardly a 429 reads it: 15.2 to 19 at the cuts of three runs, 17.3
    at the median, and each run answered 15.8 to 16.7 a second."""
    reads = []
    for seed in range(3):
        more, answered = strict_limiter(20.0, 120.0, seed)
        reads += more
        assert answered >= 15.7, seed
    assert sorted(reads)[len(reads) // 2] >= 0.85 * 20.0, reads
