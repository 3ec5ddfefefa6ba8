"""Where the fleet's pace lives, and the pace a gateway adapter asks before each call.

`Pace.before()` is asked before every request: it sleeps a short wait itself
(never inside a database transaction) or answers a `Hold` (the request is not
sent; the hop is deferred). `Pace.after()` reports what came back. The rules
are `domain.pacing`'s; the state is shared through a store:

- `PgPaceStore`: one row of `provisioner_gateway_pace` per gateway, read and
  written under `SELECT ... FOR UPDATE` in one short transaction, on the
  database's clock. Every worker process of a deployment shares it.
- `MemoryPaceStore`: the same in one process (SQLite and memory:// deployments,
  where `provisioner run` is the only process that calls the gateway).

While no limit is in force (`domain.pacing.free`: no rate configured or learned,
the circuit closed, nothing failing, no hold), a call costs no database round
trip: the process admits it from its own copy of the shared state, which a
background thread reads again every `refresh_s` (100 ms), publishing in the same
short transaction how many calls the process sent since (for the learned rate
and the 429 evidence; every other write of the process publishes them too, so a
429 that cuts the rate is counted with the calls sent before it). A 429 or an
unreachable answer is written at once by the process that got it, so a hold, a
cut or an opened circuit reaches every process within `refresh_s` plus one read
(about 200 ms); a copy older than `stale_s` is not trusted. A copy shows only
what was committed, its time running on from when its read came back (never
ahead of the store's); every write counts one version of the row, and a copy
gives way only to a later version or to a read begun after it came back. The
counts ride with whichever write of the process takes the row's lock first. With a limit in
force, each call is admitted in one transaction, as the rate requires. An
answered call changes nothing while the circuit is closed and nothing failed, so
it writes nothing: it is counted in the process and published with its next
write or refresh (what a cut reads as the gateway's limit, in the second it
came).
A call that slept its turn asks again if a cut, a new hold or an opened
circuit came meanwhile (`domain.pacing.still_admitted`), read on the local copy
(one process: on the state itself).
The pace never stops a call for its own sake: a store that cannot be read
(the database down) holds the call back unsent, and a report it cannot take
is dropped (both logged once an outage).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from domain.pacing import (
    DENSE,
    Change,
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
    sent_rate,
    shown,
    still_admitted,
    waits_told,
)
from infrastructure.redaction import redact
from infrastructure.store.eventstore import postgres_conninfo
from infrastructure.store.pg_connect import connect

log = logging.getLogger("provisioner.gateway")
lifecycle = logging.getLogger("provisioner.gateway.lifecycle")  # shown without -v

T = TypeVar("T")
# How many times a call asks again after a cut, a hold or an opened circuit came while
# it waited for its turn (each wait within its patience); then it is held (its hop
# waits). Holding it sooner, within one patience in all, deferred more hops mid-way,
# which then list the family again: 6.2 and 7.7 % of calls answered 429 at 10 calls/s
# against 4.5 to 5.5 % (decision 041).
ASK_AGAIN_MAX = 3
Update = Callable[[PaceState, float], tuple[PaceState, T]]
_FIELDS = frozenset(f.name for f in fields(PaceState))


def _state(raw: Any) -> PaceState:
    data = raw if isinstance(raw, dict) else json.loads(raw or "{}")
    return PaceState(**{k: v for k, v in data.items() if k in _FIELDS})


class MemoryPaceStore:
    """The pace of one process."""

    shared = False  # an update is a lock, not a round trip: no local copy needed

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._state = PaceState()

    def update(self, fn: Update[T]) -> T:
        with self._lock:
            self._state, out = fn(self._state, self._clock())
            return out

    def read(self) -> tuple[PaceState, float]:
        with self._lock:
            return self._state, self._clock()

    def close(self) -> None:
        pass


_LOCKED = (
    "SELECT state, extract(epoch FROM clock_timestamp())::float8 "
    "FROM provisioner_gateway_pace WHERE key = %s FOR UPDATE"
)
_INSERT = (
    "INSERT INTO provisioner_gateway_pace (key, state) VALUES (%s, '{}') "
    "ON CONFLICT (key) DO NOTHING"
)


class PgPaceStore:
    """The pace of every process that shares this database, in one row per gateway."""

    shared = True

    def __init__(
        self,
        url: str,
        key: str,
        *,
        max_size: int = 4,
        timeout_s: float = 10.0,
        stop: threading.Event | None = None,
    ) -> None:
        """`stop` (a long-running process): the table and the row are made on a
        connection of their own first, waited for while the database is full or
        unreachable, until `stop` (infrastructure/store/pg_connect.py); a refusal is raised
        at once. Without it, the pool's first connection is waited for `timeout_s`."""
        self.key = key
        if stop is not None:
            conninfo, where = postgres_conninfo(url), redact(url)
            with connect(conninfo, where, wait_s=None, stop=stop, autocommit=True) as conn:
                create_table(conn)
                conn.execute(_INSERT, (key,))
        self._pool: ConnectionPool[Any] = ConnectionPool(
            postgres_conninfo(url),
            min_size=1,
            max_size=max_size,
            kwargs={"autocommit": True},
            timeout=timeout_s,
            open=True,
        )
        if stop is not None:
            return  # the pool fills in the background; a hop waits `timeout_s` at most
        try:
            with self._pool.connection() as conn:
                create_table(conn)
                conn.execute(_INSERT, (key,))
        except BaseException:
            self._pool.close()  # its threads with it
            raise

    def update(self, fn: Update[T]) -> T:
        with self._pool.connection() as conn, conn.transaction():
            row = conn.execute(_LOCKED, (self.key,)).fetchone()
            if row is None:  # deleted under us: put it back, then lock it
                conn.execute(_INSERT, (self.key,))
                row = conn.execute(_LOCKED, (self.key,)).fetchone()
            raw, now = row
            before = _state(raw)
            after, out = fn(before, now)
            if after != before:
                conn.execute(
                    "UPDATE provisioner_gateway_pace SET state = %s WHERE key = %s",
                    (json.dumps(asdict(after)), self.key),
                )
            return out

    def read(self) -> tuple[PaceState, float]:
        with self._pool.connection() as conn:
            raw, now = conn.execute(
                "SELECT state, extract(epoch FROM clock_timestamp())::float8 "
                "FROM provisioner_gateway_pace WHERE key = %s",
                (self.key,),
            ).fetchone() or ({}, time.time())
            return _state(raw), now

    def close(self) -> None:
        self._pool.close()


def create_table(conn: Any) -> None:
    """Idempotent; concurrent creators may race on the catalogue, so a loser retries."""
    for _ in range(3):
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS provisioner_gateway_pace "
                "(key text PRIMARY KEY, state jsonb NOT NULL)"
            )
        except psycopg.errors.UniqueViolation:  # "... pg_type": another creator won the race
            time.sleep(0.05)
        else:
            return
    conn.execute("SELECT 1 FROM provisioner_gateway_pace LIMIT 0")  # exists now, or the error


PaceStore = MemoryPaceStore | PgPaceStore


def read_pace(url: str, key: str, *, timeout_s: float = 3.0) -> tuple[PaceState, float] | None:
    """The shared pace as stored (one short connection; nothing created); None when no
    process has called the gateway yet."""
    conninfo = postgres_conninfo(url)
    with psycopg.connect(conninfo, connect_timeout=max(1, round(timeout_s))) as conn:
        exists = conn.execute("SELECT to_regclass('provisioner_gateway_pace')").fetchone()
        if not exists or exists[0] is None:
            return None
        row = conn.execute(
            "SELECT state, extract(epoch FROM clock_timestamp())::float8 "
            "FROM provisioner_gateway_pace WHERE key = %s",
            (key,),
        ).fetchone()
    return None if row is None else (_state(row[0]), row[1])


def _ignore(_kind: str, _value: float) -> None:
    pass


def _versioned(stored: PaceState, new: PaceState) -> PaceState:
    """`new`, to be written over `stored`: one version on when it differs."""
    return new if new == stored else replace(new, version=stored.version + 1)


def _with_time(fn: Update[T]) -> Update[tuple[PaceState, float, T]]:
    """`fn` as a store's update, answering also the state written and the store's time."""

    def update(stored: PaceState, now: float) -> tuple[PaceState, tuple[PaceState, float, T]]:
        new, out = fn(stored, now)
        return new, (new, now, out)

    return update


class Pace:
    """The pace one gateway adapter keeps; thread-safe.

    `on_event(kind, value)` is told of: ("waited", seconds slept before a call),
    ("held", 1 per call held back), ("circuit", 1.0 open / 0.0 closed), as metrics.
    """

    def __init__(
        self,
        store: PaceStore,
        rules: PaceRules,
        *,
        sleep: Callable[[float], None] = time.sleep,
        on_event: Callable[[str, float], None] | None = None,
        refresh_s: float = 0.1,
        stale_s: float = 0.5,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.rules = rules
        self._sleep = sleep
        self._on_event = on_event or _ignore
        # Per thread: whether its call was admitted with the circuit closed and nothing
        # failing; then an answer to it changes nothing and is not written.
        self._admitted = threading.local()
        self._store_down = False
        # The local copy of a shared state: (state, the store's time, monotonic when it
        # came back, monotonic when its read or write began).
        self.refresh_s, self.stale_s, self._monotonic = refresh_s, stale_s, monotonic
        self._copy: tuple[PaceState, float, float, float] | None = None
        self._sent = 0  # calls admitted on the copy, not yet published
        self._answered = 0  # calls answered (not 429), not yet published
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None

    def before(self, *, create: bool = False) -> Hold | None:
        """Wait for this call's turn (a short wait, slept here; a create waits longer);
        a Hold when it must not be sent now (the store unreadable too: a call is never
        sent unpaced)."""

        if self._free_here():
            with self._lock:
                self._sent += 1
            self._admitted.clean, self._admitted.probe = True, False
            return None

        wait = 0.0
        for asked in range(1 + ASK_AGAIN_MAX):
            admitted = self._admit(create, again=asked > 0)
            if isinstance(admitted, Hold):
                self._on_event("held", 1.0)
                return admitted
            decision, state = admitted
            wait = decision.wait_s
            if wait <= 0:
                return None
            self._on_event("waited", wait)
            self._sleep(wait)
            latest = self._latest()
            if latest is None or still_admitted(state, *latest):
                return None
            # A cut, a hold or an opened circuit while it waited: ask again.
            wait = max(wait, latest[0].paused_until - latest[1])
        # Not sent: the hop waits for the fleet's turn, as for any call held back.
        self._on_event("held", 1.0)
        return Hold(wait, "the fleet's pace changed while the call waited its turn", paced=True)

    def told(self, retry_after_s: float, *, create: bool = False) -> bool:
        """A call was answered 429 with this Retry-After: while the pace limits the
        fleet and within the call's patience (`domain.pacing.waits_told`), wait it
        here and answer True (the caller sends it once more, asking its turn again);
        else False (its hop is deferred)."""
        latest = self._latest(fresh=True)
        if latest is None or not waits_told(self.rules, *latest, retry_after_s, create=create):
            return False
        self._on_event("waited", retry_after_s)
        self._sleep(retry_after_s)
        return True

    def _admit(self, create: bool, *, again: bool) -> tuple[Go, PaceState] | Hold:
        """One admission in the store: Go and the state it was made on, or a Hold
        (`again`: a call asking again, see `domain.pacing.admit`)."""

        def step(state: PaceState, now: float) -> tuple[PaceState, Go | Hold]:
            return admit(self.rules, state, now, create=create, again=again)

        try:
            _, state, _, decision = self._write(step)
        except Exception as exc:  # noqa: BLE001 - the database down: hold, never send unpaced
            self._admitted.clean = False
            return Hold(5.0, f"the pace's database is unavailable ({type(exc).__name__})")
        self._admitted.clean = state.open_since is None and state.unreachable == 0
        self._admitted.probe = isinstance(decision, Go) and decision.probe
        self._on_event("circuit", 0.0 if state.open_since is None else 1.0)
        return decision if isinstance(decision, Hold) else (decision, state)

    def _latest(self, *, fresh: bool = False) -> tuple[PaceState, float] | None:
        """What this process knows of the shared state now, and the store's time now:
        the local copy (refreshed every `refresh_s`), or the store itself when it is
        this process's memory; None when neither can be read, or (`fresh`) when the
        copy is older than `stale_s`. A call that waited its turn checks it against
        any copy (one that knows of a hold holds it); a wait for a 429 is only begun
        on a fresh one."""
        if getattr(self.store, "shared", False):
            copy = self._copy
            if copy is None:
                return None
            state, at, read, _ = copy
            age = self._monotonic() - read
            return None if fresh and age > self.stale_s else (state, at + age)
        try:
            return self.store.read()
        except Exception:  # noqa: BLE001 - unknown: the call goes on its admission
            return None

    def after(self, result: Result, *, retry_after_s: float = 0.0, error: str = "") -> None:
        """Report what the admitted call got; never raises (a report lost is logged)."""
        if result is Result.ANSWERED:
            with self._lock:
                self._answered += 1  # published with this process's next write
            if getattr(self._admitted, "clean", False):
                return

        probe = getattr(self._admitted, "probe", False)

        def step(state: PaceState, now: float) -> tuple[PaceState, Change | None]:
            return observe(
                self.rules,
                state,
                now,
                result,
                retry_after_s=retry_after_s,
                error=error,
                probe=probe,
            )

        try:
            state, new, now, change = self._write(step)
        except Exception:  # noqa: BLE001 - what the call got stands; the report is lost
            return
        if new.learned_at != state.learned_at:
            self._log_cut(state, new, now)
        if change is not None:
            self._announce(change)

    def _log_cut(self, state: PaceState, new: PaceState, now: float) -> None:
        """A learned rate set or cut (`state` before it, `new` after), for the operator."""
        if new.learned is None:  # a cut always sets one
            return
        held = max(0.0, new.paused_until - now)
        floor = "at least " if new.ceiling_low else ""
        read = "" if new.ceiling is None else f"{floor}{shown(new.ceiling)}"
        limit = f"its limit read as {read}; " if read else ""
        before = rate_now(self.rules, state, now)
        was = "none" if before is None else shown(before)
        sending = f"{limit}{was} in force, {shown(sent_rate(state, now))} sent"
        why = (
            f"after 429s dense enough to be its rate limit; the fleet holds "
            f"{held:.0f} s (Retry-After)"
            if new.cut_by == DENSE
            else "after 429s past the limit it had read; they hold no call but their own"
        )
        lifecycle.info(
            "gateway pace %s: %s calls/s (%s), %s",
            "learned" if before is None else "cut",
            shown(new.learned),
            sending,
            why,
        )

    # The local copy of a shared state (the module's docstring).

    def _free_here(self) -> bool:
        """Whether this call may go on the local copy: a shared store, a copy fresh
        enough, and no limit in force in it."""
        if not getattr(self.store, "shared", False):
            return False
        self._start_refresher()
        copy = self._copy
        if copy is None:
            return False
        state, at, read, _ = copy
        age = self._monotonic() - read
        return age <= self.stale_s and free(self.rules, state, at + age)

    def _write(
        self, step: Callable[[PaceState, float], tuple[PaceState, T]]
    ) -> tuple[PaceState, PaceState, float, T]:
        """One write of the shared state: the counts not yet published (`_published`),
        then `step`; one version on when it changed anything; the copy kept once it
        committed (a copy shows only what was stored). (The state `step` was given,
        the state written, the store's time, what `step` answered.) A write that
        fails gives the counts back, is logged once an outage, and is raised."""
        taken = [0, 0]

        def versioned(stored: PaceState, now: float) -> tuple[PaceState, tuple[PaceState, T]]:
            state = self._published(stored, now, taken)
            new, out = step(state, now)
            return _versioned(stored, new), (state, out)

        began = self._monotonic()
        try:
            new, now, (state, out) = self.store.update(_with_time(versioned))
        except Exception as exc:
            self._give_back(taken)
            self._down(exc)
            raise
        self._up()
        self._keep(new, now, began)
        return state, new, now, out

    def _published(self, state: PaceState, now: float, taken: list[int]) -> PaceState:
        """`state` with the calls sent on the copy and the calls answered (not 429) not
        yet published, taken under the row's lock by the write about to be made (into
        `taken`, given back if it fails): every write publishes both, so that a 429
        which cuts the rate is counted with every call the process sent before it,
        whichever of its writes takes the lock first (a first cut read from the
        refreshes alone missed up to 100 ms of a burst and read a limit of 20 calls/s
        as 5). A refresh publishes them too, within `refresh_s` of coming: a cut reads
        answers over a second or two, and answers held back for seconds would land in a
        later second in one batch and read the limit high."""
        with self._lock:
            sent = self._sent
            answered = self._answered
            self._sent, self._answered = 0, 0
        taken[:] = [taken[0] + sent, taken[1] + answered]
        return count_answered(count_calls(self.rules, state, now, sent), now, answered)

    def _give_back(self, taken: list[int]) -> None:
        with self._lock:
            self._sent += taken[0]
            self._answered += taken[1]

    def _keep(self, state: PaceState, now: float, began: float) -> None:
        """The local copy: `state`, committed, at the store's time `now`, from a read or
        write that began at monotonic `began`. Its time runs on from the monotonic
        clock as it came back, so it never runs ahead of the store's (a read's wait
        and round trip are not counted twice). It replaces the copy held when it is a
        later version of the row, or was read after that copy came back (a row made
        again starts its versions again); the same version read later only moves the
        copy's time on. Never the other way: a read or a write that overlapped a
        newer write, kept after it, would show the row as it was before."""
        if not getattr(self.store, "shared", False):
            return
        read = self._monotonic()
        with self._lock:
            held = self._copy
            newer = (
                held is None
                or state.version > held[0].version
                or began >= held[2]
                or (state.version == held[0].version and now - read > held[1] - held[2])
            )
            if newer:
                self._copy = (state, now, read, began)

    def _start_refresher(self) -> None:
        if self._refresher is None:
            with self._lock:
                if self._refresher is None and not self._stop.is_set():
                    self._refresher = threading.Thread(
                        target=self._refresh_every, name="gateway-pace", daemon=True
                    )
                    self._refresher.start()

    def _refresh_every(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.refresh()

    def refresh(self) -> None:
        """Read the shared state again, publishing the calls sent on the copy since."""
        # Answers ride along, rather than wait for this process's next admission,
        # which may be seconds away while its threads wait for their turns. Otherwise
        # a refresh with nothing sent or answered stays a read.
        with self._lock:
            write = bool(self._sent or self._answered)
        if write:
            try:
                self._write(lambda state, _now: (state, None))
            except Exception:  # noqa: BLE001 - no copy: calls take the slow path, held
                self._copy = None
            return
        began = self._monotonic()
        try:
            state, now = self.store.read()
        except Exception as exc:  # noqa: BLE001 - no copy: calls take the slow path, held
            self._copy = None
            self._down(exc)
            return
        self._up()
        self._keep(state, now, began)

    def _down(self, exc: Exception) -> None:
        if not self._store_down:
            self._store_down = True
            log.warning(
                "the gateway pace cannot be read or written (%s): calls are held "
                "until the database answers",
                " ".join(str(exc).split())[:200],
            )

    def _up(self) -> None:
        if self._store_down:
            self._store_down = False
            log.info("the gateway pace is readable again")

    def _announce(self, change: Change) -> None:
        since = datetime.fromtimestamp(change.since, UTC).isoformat(timespec="seconds")
        self._on_event("circuit", 1.0 if change.opened else 0.0)
        if change.opened:
            log.warning(
                "gateway circuit open: %d calls in a row got no answer since %s (last: %s); "
                "calls are held and hops deferred, one probe every %.0f s",
                self.rules.open_after,
                since,
                change.error,
                self.rules.probe_every_s,
            )
        else:
            lifecycle.info(
                "gateway circuit closed: the gateway answers again (down since %s)", since
            )

    def state(self) -> tuple[PaceState, float]:
        """The shared state and the store's time now (for health and metrics)."""
        return self.store.read()

    def close(self) -> None:
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join(5)
            if self._sent or self._answered:
                self.refresh()  # what was sent on the copy and answered, published
        self.store.close()
