"""The fleet's pace against real PostgreSQL and the fake gateway over HTTP: two
processes' worth of clients share one rate, one Retry-After and one circuit."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import fields, replace

import pytest

from domain.outcomes import Outcome
from domain.pacing import DENSE, PaceRules, PaceState, Result, rate_now, strays_seen
from domain.ports import TransientGatewayError, WorkspaceGone
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.gateway.pacing import Pace, PgPaceStore, read_pace
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import open_event_store
from tests.conftest import PARENT, TOKEN
from tests.support import ManualClock, pace_rules
from tests.unit.test_pacing import EVERY_429

pytestmark = pytest.mark.postgres


@pytest.fixture
def key() -> str:
    return f"https://gateway-{uuid.uuid4().hex[:8]}.test"


@pytest.fixture
def stores(pg_database: str, key: str) -> Iterator[list[PgPaceStore]]:
    """Two stores of one row, each with its own pool: two worker processes."""
    made = [PgPaceStore(pg_database, key), PgPaceStore(pg_database, key)]
    yield made
    for store in made:
        store.close()


def test_every_field_of_the_pace_comes_back_from_the_row_as_written(
    stores: list[PgPaceStore],
) -> None:
    """What one process writes (`held_s` too: the holds since a cut) is what another
    reads: no field is lost or changed on its way through PostgreSQL's jsonb."""
    written = PaceState(
        **{
            f.name: (
                f"{f.name}-value" if f.type == "str"
                else 7 + n if f.type == "int"
                else True if f.type == "bool"
                else 1.25 + n
            )
            for n, f in enumerate(fields(PaceState))
        }
    )  # fmt: skip
    assert written.held_s != PaceState().held_s
    stores[0].update(lambda _state, _now: (written, None))
    assert stores[1].read()[0] == written


def clients(fake: FakeGateway, stores: list[PgPaceStore], rules: PaceRules) -> list[HttpGateway]:
    return [
        HttpGateway(
            fake.url,
            TOKEN,
            retries=1,
            retry_backoff_s=0.0,
            read_timeout=2.0,
            pace=Pace(store, rules),
        )
        for store in stores
    ]


def hammer(gateways: list[HttpGateway], threads_each: int, seconds: float) -> tuple[int, int]:
    """Every thread reads a status as fast as the pace lets it; (answered, held)."""
    done = time.monotonic() + seconds
    counts = {"answered": 0, "held": 0}
    lock = threading.Lock()

    def run(gateway: HttpGateway) -> None:
        while time.monotonic() < done:
            try:
                gateway.status("ws-none")
            except WorkspaceGone:
                outcome = "answered"
            except TransientGatewayError:
                outcome = "held"
                time.sleep(0.05)
            else:
                outcome = "answered"
            with lock:
                counts[outcome] += 1

    workers = [
        threading.Thread(target=run, args=(g,)) for g in gateways for _ in range(threads_each)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return counts["answered"], counts["held"]


def test_a_configured_rate_holds_across_processes_and_the_gateway_throttles_nothing(
    fake: FakeGateway, stores: list[PgPaceStore]
) -> None:
    fake.configure(rate_limit=20.0, burst=3)
    gateways = clients(fake, stores, pace_rules(rate=20.0, burst=1, max_wait_s=0.5))

    answered, _ = hammer(gateways, threads_each=8, seconds=2.0)

    state = fake.state()
    assert state["throttled"] == 0
    assert state["calls_total"] == answered
    # The fleet's rate, not each client's (a call admitted before the end may wait
    # up to max_wait_s for its turn, then go).
    assert 30 <= answered <= 20 * (2.0 + 0.5) + 1
    for gateway in gateways:
        gateway.close()


def test_dense_429s_at_a_configured_rate_cut_it_for_both_processes(
    fake: FakeGateway, stores: list[PgPaceStore], pg_database: str, key: str
) -> None:
    """Decision 046 through the shared row: a gateway that allows half the configured
    rate (a quota other clients share) answers dense 429s to one process and the
    other; the rate in force for both is cut under the configured one, by what the
    gateway answered, and the fleet holds for the Retry-After."""
    fake.configure(rate_limit=10.0, burst=1)
    rules = pace_rules(rate=20.0, burst=1, max_wait_s=0.5)
    gateways = clients(fake, stores, rules)

    hammer(gateways, threads_each=8, seconds=2.0)

    assert fake.state()["throttled"] >= 5
    found = read_pace(pg_database, key)
    assert found is not None
    state, _ = found
    assert state.cut_by == DENSE
    assert state.ceiling is not None
    assert state.ceiling < 20.0
    other, at = stores[1].read()
    in_force = rate_now(rules, other, at)
    assert in_force is not None
    assert in_force < 20.0
    for gateway in gateways:
        gateway.close()


def test_a_429_pauses_every_process_until_its_retry_after(
    fake: FakeGateway, stores: list[PgPaceStore], pg_database: str, key: str
) -> None:
    """429s a rate signal (here every one is): the hold reaches a process that was
    admitting its calls on its own copy of the state within its refresh (~200 ms)."""
    fake.configure(rate_limit=0.2, burst=1)  # a token every 5 s: Retry-After 5
    rules = pace_rules(max_wait_s=2.0, **EVERY_429)
    first, second = clients(fake, stores, rules)
    with pytest.raises(WorkspaceGone):
        second.status("ws-none")  # the one token; it goes on on its copy: no limit yet
    with pytest.raises(TransientGatewayError, match="429") as throttled:
        first.status("ws-none")
    calls = fake.state()["calls_total"]
    time.sleep(0.3)  # the copy's refresh, every 100 ms, and its read

    with pytest.raises(TransientGatewayError, match="Retry-After") as held:
        second.status("ws-none")  # the other process: held, never sent

    assert throttled.value.retry_after_s == 5.0
    assert fake.state()["calls_total"] == calls
    assert 4.0 < held.value.retry_after_s <= 5.0  # the hop is deferred until then
    found = read_pace(pg_database, key)
    assert found is not None
    assert found[0].paused_until > found[1]
    assert found[0].learned is not None  # no rate configured: one is learned
    # The rate learned does not grow while the hold holds (decision 048): the row
    # keeps since when it holds, and the rate comes out of it as the cut set it.
    state = found[0]
    assert state.held_from <= found[1] < state.paused_until
    assert rate_now(rules, state, state.paused_until) == pytest.approx(state.learned)
    assert rate_now(rules, state, state.paused_until + 1.0) > state.learned
    assert found[0].version >= 2  # every write of the row counted one
    latest = second._pace._latest()  # type: ignore[union-attr]
    assert latest is not None
    assert latest[0].version == found[0].version  # the other process's copy: the newest
    first.close()
    second.close()


def test_a_stray_429_holds_its_own_call_not_the_other_process(
    fake: FakeGateway, stores: list[PgPaceStore], pg_database: str, key: str
) -> None:
    fake.configure(rate_limit=0.2, burst=1)
    first, second = clients(fake, stores, pace_rules(max_wait_s=2.0))
    with pytest.raises(WorkspaceGone):
        first.status("ws-none")  # the one token
    with pytest.raises(TransientGatewayError, match="429") as throttled:
        first.status("ws-none")  # one 429: no evidence of a rate limit
    calls = fake.state()["calls_total"]

    with pytest.raises(TransientGatewayError, match="429"):
        second.status("ws-none")  # sent: the fleet is not held for one 429

    assert throttled.value.retry_after_s == 5.0  # its own hop waits that long
    assert fake.state()["calls_total"] == calls + 1
    found = read_pace(pg_database, key)
    assert found is not None
    assert found[0].paused_until == 0.0
    assert found[0].learned is None
    first.close()
    second.close()


def test_under_a_limit_a_short_retry_after_is_waited_in_the_calls_thread(
    fake: FakeGateway, stores: list[PgPaceStore]
) -> None:
    """A rate in force (the threads wait for turns anyway): a read answered 429 with
    `Retry-After: 1` is sent again after it; a create's 429 comes back `waited`, for
    the hop to make it again on record. With no limit in force, neither waits."""
    fake.configure(rate_limit=1.0, burst=1)
    (paced,) = clients(fake, stores[:1], pace_rules(rate=50.0, burst=1))
    (free,) = clients(fake, stores[1:], pace_rules())
    with pytest.raises(WorkspaceGone):
        paced.status("ws-none")  # the one token
    with pytest.raises(WorkspaceGone):
        paced.status("ws-none")  # 429, waited 1 s, sent again: the next token
    assert (fake.state()["calls"]["status"], fake.state()["throttled"]) == (3, 1)

    with pytest.raises(TransientGatewayError, match="nothing created") as refused:
        paced.create_child(PARENT, "Waited Co")
    assert refused.value.waited
    assert paced.create_child(PARENT, "Waited Co")  # as the hop makes it again
    state = fake.state()
    assert state["creates"]["Waited Co"] == 2
    assert [w["title"] for w in state["workspaces"]].count("Waited Co") == 1

    with pytest.raises(TransientGatewayError, match="429") as stray:
        free.status("ws-none")  # no limit in force: its hop is deferred at once
    assert not getattr(stray.value, "waited", False)
    assert fake.state()["calls"]["status"] == 4
    paced.close()
    free.close()


def test_an_outage_opens_one_circuit_for_both_processes_with_one_probe_per_interval(
    fake: FakeGateway, stores: list[PgPaceStore], pg_database: str, key: str
) -> None:
    rules = pace_rules(open_after=5, probe_every_s=0.5)
    gateways = clients(fake, stores, rules)
    fake.outage(3.0, "503")

    hammer(gateways, threads_each=4, seconds=2.5)

    during = fake.state()["outage_calls"]
    found = read_pace(pg_database, key)
    assert found is not None
    assert found[0].open_since is not None
    # Before it opened: at most the five failures in a row and what was in flight
    # (8 threads, one retry each); after: one probe per half second for both.
    assert during <= 5 + 16 + 2.5 / 0.5 + 1
    time.sleep(1.0)  # the gateway is back; the next probe closes the circuit
    answered, _ = hammer(gateways, threads_each=1, seconds=1.0)
    assert answered > 0
    found = read_pace(pg_database, key)
    assert found is not None
    assert found[0].open_since is None
    for gateway in gateways:
        gateway.close()


def test_a_learned_rate_reads_the_limit_from_what_both_processes_got_answered(
    fake: FakeGateway, stores: list[PgPaceStore], pg_database: str, key: str
) -> None:
    """No rate configured: a cut after the first reads the gateway's limit as the
    calls answered a second, which each process publishes with its next write."""
    fake.configure(rate_limit=20.0, burst=3)
    gateways = clients(fake, stores, pace_rules(burst=1, max_wait_s=0.5))
    # A first cut made it 16 calls/s, under the limit: nothing throttled (a cut is
    # made 3 s after the last at the soonest).
    stores[0].update(lambda state, now: (replace(state, learned=16.0, learned_at=now), None))
    hammer(gateways, threads_each=8, seconds=1.5)
    assert fake.state()["throttled"] == 0
    # Then twice the limit (30 grown 10 %/s for 3 s): 429s, dense; the cut reads what
    # the gateway answered.
    stores[0].update(lambda state, now: (replace(state, learned=30.0, learned_at=now - 3), None))
    hammer(gateways, threads_each=8, seconds=2.0)

    found = read_pace(pg_database, key)
    assert found is not None
    state, _ = found
    assert state.learned is not None
    assert state.ceiling is not None  # a later cut: the limit read
    assert 15.0 <= state.ceiling <= 26.0  # 20 a second, and a burst of 3
    for gateway in gateways:
        gateway.close()


def test_a_hop_held_for_the_fleets_turn_then_throttled_waits_the_retry_after(
    fake: FakeGateway, stores: list[PgPaceStore], pg_database: str, settings: EngineSettings
) -> None:
    """Through PostgreSQL, the pace's row and the fake over HTTP: a hop the fleet's
    rate holds is deferred for its turn (`paced`, stored so), and the 429 that comes
    after those turns is waited as told, 1 s, not the backoff of a deferral in a row."""
    gateway = HttpGateway(
        fake.url, TOKEN, retries=0, read_timeout=2.0,
        pace=Pace(stores[0], pace_rules(rate=0.25, burst=1, max_wait_s=0.0)),
    )  # fmt: skip
    app = open_event_store(pg_database, pool_size=2)
    other = open_event_store(pg_database, pool_size=1)  # another process, loading it
    try:
        clock = ManualClock()
        service = ProvisioningService(
            app, gateway, clock=clock, settings=settings, jitter=lambda: 0.5
        )
        brand = f"brand-{uuid.uuid4().hex[:12]}"
        attempt_id = service.request_provisioning(brand, "Held", PARENT)
        with pytest.raises(WorkspaceGone):
            gateway.status("ws-none")  # the fleet's one call in these 4 s

        held = [service.run_hop(attempt_id, hop) for hop in range(3)]  # its turn not yet come
        fake.configure(throttle_rate=1.0)  # every read answered 429, Retry-After 1
        time.sleep(4.1)  # the turn has come: the family is sent, and throttled
        throttled = service.run_hop(attempt_id, 3)
        loaded = ProvisioningService(other, gateway, clock=clock, settings=settings).attempt(
            attempt_id
        )

        assert [o.outcome for o in (*held, throttled)] == [Outcome.DEFERRED] * 4
        assert all(0.0 < (o.delay_s or 0) <= 5.0 for o in held), held  # the turn, a quarter more
        assert throttled.delay_s == 1.0  # as told: three deferrals before it were the fleet's
        assert (loaded.deferrals, loaded.deferred_in_row, loaded.unanswered_in_row) == (4, 4, 1)
        assert fake.state()["faults"]["throttled"] == 1
    finally:
        gateway.close()
        app.close()
        other.close()


def test_under_a_learned_rate_answers_reach_the_row_within_a_refresh(
    fake: FakeGateway, stores: list[PgPaceStore], pg_database: str, key: str
) -> None:
    """Each admission publishes the answers before it; the last call's answer is
    published by the 100 ms refresh, not held until this process calls again."""
    stores[0].update(lambda state, now: (replace(state, learned=50.0, learned_at=now), None))
    pace = Pace(stores[0], pace_rules(burst=5, max_wait_s=0.5))
    gateway = HttpGateway(fake.url, TOKEN, retries=0, read_timeout=2.0, pace=pace)
    for _ in range(4):
        with pytest.raises(WorkspaceGone):
            gateway.status("ws-none")  # answered (a 404): admitted through the row
    time.sleep(0.5)  # a few refreshes

    found = read_pace(pg_database, key)
    gateway.close()
    pace.close()  # its refresher stopped before the fixture closes the store
    assert found is not None
    state, _ = found
    assert state.last_answered + state.window_answered == 4


def test_a_call_waiting_its_turn_when_another_process_is_throttled_asks_again(
    stores: list[PgPaceStore],
) -> None:
    """A call of one process waits 1 s for its turn at a learned rate; meanwhile the
    other process's 429 cuts the rate and holds the fleet. The first process hears of
    it through its 100 ms refresh of the row and asks again, going only once the
    hold is over, never at its old turn (decision 041)."""
    rules = pace_rules(rate=None, burst=1, **EVERY_429)
    stores[0].update(
        lambda state, now: (replace(state, learned=2.0, learned_at=now - 5, tat=now + 1.0), None)
    )
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    waiting, other = Pace(stores[0], rules, sleep=sleep), Pace(stores[1], rules)
    went: list[float] = []
    thread = threading.Thread(target=lambda: (waiting.before(), went.append(time.monotonic())))
    started = time.monotonic()
    thread.start()
    time.sleep(0.3)
    other.after(Result.THROTTLED, retry_after_s=1.0)  # a cut and a 1 s hold of the fleet
    thread.join(10)
    waiting.close()
    other.close()

    assert went, "the waiting call never went"
    assert len(slept) == 2, slept  # its turn, then the hold's end after asking again
    assert slept[0] == pytest.approx(1.0, abs=0.1)
    assert went[0] - started >= 1.25  # the hold began at 0.3 s and lasts 1 s at least


def test_a_floor_read_by_one_process_paces_the_other_at_its_fast_growth(
    stores: list[PgPaceStore], pg_database: str, key: str
) -> None:
    """A limit read from unspaced calls is a floor in the shared row: the other
    process, and `read_pace`, see it as one, and the rate it admits at grows from it
    without the slow band a limit read would have."""
    rules = pace_rules(rate=None)
    stores[0].update(
        lambda state, now: (
            replace(state, learned=8.5, learned_at=now - 10.0, ceiling=10.0, ceiling_low=True),
            None,
        )
    )
    found = read_pace(pg_database, key)
    assert found is not None
    state, now = found
    assert state.ceiling_low
    other, _ = stores[1].read()
    assert other.ceiling_low
    grown = rate_now(rules, other, now)
    assert grown == pytest.approx(8.5 * (1 + rules.growth_per_s) ** 10, rel=0.02)
    as_a_limit = rate_now(rules, replace(other, ceiling_low=False), now)
    assert as_a_limit is not None
    assert grown > as_a_limit  # 13.8 against 9.9 in the slow band


def test_a_stray_429_one_process_got_sets_the_bar_the_other_cuts_by(
    fake: FakeGateway, stores: list[PgPaceStore], pg_database: str, key: str
) -> None:
    """Decision 044 through the shared row: 429s under the limit read, answered over
    HTTP to one process, are counted as stray there; one is a data point, and two
    within a minute or so make the other process's view of the row ask three calls
    short of a cut past the read, not one."""
    rules = pace_rules(rate=None, max_wait_s=0.5)
    stores[0].update(
        lambda state, now: (
            replace(state, learned=8.5, learned_at=now - 3.0, ceiling=20.0, ceiling_dense=20.0),
            None,
        )
    )
    other, now = stores[1].read()
    assert strays_seen(rules, other, now) == 0.0  # none yet: one call short would cut
    fake.configure(throttle_rate=1.0)  # every read answered 429: a shared tenant's
    first = clients(fake, stores[:1], rules)[0]
    with pytest.raises(TransientGatewayError, match="429"):
        first.status("ws-none")
    other, now = stores[1].read()
    assert 0.9 < strays_seen(rules, other, now) < 1.0  # one, decaying: not yet
    with pytest.raises(TransientGatewayError, match="429"):
        first.status("ws-none")

    assert fake.state()["faults"]["throttled"] == 2
    other, now = stores[1].read()
    assert strays_seen(rules, other, now) >= 1.0
    found = read_pace(pg_database, key)
    assert found is not None
    assert found[0].learned_at < now - 2.0  # one 429 under the read cut nothing
    first.close()


def test_a_clean_window_of_both_processes_calls_is_kept_in_the_row_429s_end_it(
    fake: FakeGateway, stores: list[PgPaceStore]
) -> None:
    """Decision 047 through the shared row: the calls both processes had answered over
    HTTP make a clean window, its rate at most the rate in force, which a cut may read
    when the answers read far under it; 429s at half the calls make none."""
    rules = pace_rules(rate=None)
    stores[0].update(
        lambda state, now: (
            replace(state, learned=20.0, learned_at=now - 1.0, ceiling=22.0, ceiling_dense=22.0),
            None,
        )
    )
    gateways = clients(fake, stores, rules)
    answered, _ = hammer(gateways, threads_each=2, seconds=2.5)
    assert answered > 20
    state, now = stores[1].read()
    assert state.learned_at < state.clean_at <= now
    in_force = rate_now(rules, state, now)
    assert in_force is not None
    assert 5.0 < state.clean_rate <= 1.1 * in_force

    fake.configure(throttle_rate=0.5)  # half the calls 429, at random
    _, began = stores[1].read()
    hammer(gateways, threads_each=2, seconds=2.5)
    assert fake.state()["faults"]["throttled"] > 5
    after, _ = stores[1].read()
    # The window rolled at the first call since may hold only the calls before; none
    # of the 429s' windows is clean.
    assert after.clean_at < began + 1.0
    for gateway in gateways:
        gateway.close()
