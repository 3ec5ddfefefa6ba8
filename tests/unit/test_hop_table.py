"""The hop's decision table (docs/hop-table.md), row by row, without I/O.

Each table below is the documented table as data: rows of (name, situation,
decision), first match wins. Every combination of the inputs is decided by
`domain.hop` and compared with the first row whose situation holds; every row
must be reached by some case.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from domain import creates, ownership, steps, waits
from domain import hop as decide
from domain.outcomes import Outcome, StandDown
from domain.policies import AttemptState, FailureReason, Provenance
from domain.ports import (
    AmbiguousCreate,
    FamilyMember,
    FaultKind,
    GatewayError,
    GatewayFault,
    MalformedAnswer,
    RequestRejected,
    TransientGatewayError,
    Unauthorized,
    WorkspaceGone,
    fault_of,
)
from domain.steps import (
    Accept,
    Create,
    CreateAgain,
    Defer,
    DropCandidate,
    DropExisting,
    Fail,
    Promote,
    Record,
    Recover,
    Refused,
    Schedule,
    Stand,
    Wait,
)
from domain.waits import Backoff, Deferral

Row = tuple[str, Callable[..., bool], Callable[..., object]]
NOW = datetime(2026, 1, 1, tzinfo=UTC)
PARENT = "parent-1"
TITLE = "Acme"
FAILURES = [GatewayFault(kind, f"{kind.value} answer") for kind in FaultKind] + [
    GatewayFault(FaultKind.TRANSIENT, "throttled (HTTP 429)", retry_after_s=7.0),
    GatewayFault(FaultKind.AMBIGUOUS, "outcome unknown (HTTP 503)", answered=True),
    GatewayFault(FaultKind.TRANSIENT, "not sent (paced at 20 calls/s)", 3.5, paced=True),
    GatewayFault(FaultKind.TRANSIENT, "throttled (HTTP 429)", retry_after_s=1.0, waited=True),
]
CASES: list[tuple[str, Callable[..., object], tuple[Any, ...], list[Row]]] = []
REACHED: set[str] = set()


def table(
    name: str, rows: list[Row], fn: Callable[..., object], inputs: Iterable[tuple[Any, ...]]
) -> None:
    for args in inputs:
        CASES.append((name, fn, args, rows))


def expected(rows: list[Row], args: tuple[Any, ...]) -> tuple[str, object]:
    for row_name, holds, decision in rows:
        if holds(*args):
            return row_name, decision(*args)
    raise AssertionError(f"no row of the table covers {args}")


# Gate: (state, expected_hop, hop, placed_late).
GATE: list[Row] = [
    (
        "ended attempt",
        lambda s, e, h, p: s.is_terminal,
        lambda s, e, h, p: Stand(decide.STAND_DOWN_BY_STATE[s], f"attempt is {s.value}"),
    ),
    (
        "hop done; our late create just recorded",
        lambda s, e, h, p: h < e and p,
        lambda s, e, h, p: Stand(StandDown.CONCURRENT_DELIVERY, "next hop polls"),
    ),
    (
        "hop already done",
        lambda s, e, h, p: h < e,
        lambda s, e, h, p: Stand(
            StandDown.STALE_HOP, f"hop {h} already done; attempt expects hop {e}", Outcome.DUPLICATE
        ),
    ),
    (
        "hop not due yet",
        lambda s, e, h, p: h > e,
        lambda s, e, h, p: Stand(StandDown.FUTURE_HOP, f"attempt expects hop {e}"),
    ),
    ("the expected hop of a pending attempt", lambda *a: True, lambda *a: None),
]
table(
    "gate",
    GATE,
    decide.gate,
    itertools.product(AttemptState, [0, 2, 5], [0, 1, 2, 3, 5, 6], [False, True]),
)

# Another delivery's create: (requested_hop, candidate_id, hop).
LOST_RACE: list[Row] = [
    (
        "another delivery of this hop is creating",
        lambda r, c, h: r == h and c is None,
        lambda *a: Stand(StandDown.CONCURRENT_DELIVERY, "another delivery is creating"),
    ),
    ("anything else: decide again", lambda *a: True, lambda *a: None),
]
table(
    "lost_create_race",
    LOST_RACE,
    decide.lost_create_race,
    itertools.product([None, 0, 1, 2], [None, "ws-1"], [0, 1, 2]),
)

# The title slot before any family read: (busy, title).
SLOT: list[Row] = [
    (
        "another attempt's create of the title may be in flight",
        lambda b, t: b,
        lambda b, t: Wait(f"another create titled {t!r} in flight"),
    ),
    ("slot free, ours, or its reservation lapsed", lambda *a: True, lambda *a: None),
]
table("slot_gate", SLOT, decide.slot_gate, itertools.product([False, True], [TITLE, "Other"]))

# A gateway failure while acquiring: (failure,).
ACQUIRE_FAILED: list[Row] = [
    (
        "401/403",
        lambda f: f.kind is FaultKind.UNAUTHORIZED,
        lambda f: Fail(FailureReason.UNAUTHORIZED, f"gateway refused: {f.message}"),
    ),
    (
        "404: the parent",
        lambda f: f.kind is FaultKind.GONE,
        lambda f: Fail(FailureReason.REJECTED, f"parent workspace not found: {f.message}"),
    ),
    (
        "no answer (timeout, 429, 5xx, refused, held by the pace): defer",
        lambda f: f.kind is FaultKind.TRANSIENT,
        lambda f: Defer(f"gateway unavailable: {f.message}", f.retry_after_s, f.paced),
    ),
    (
        "an answer we cannot use (malformed, a refused read): a settle wait",
        lambda f: True,
        lambda f: Wait(f"gateway answered badly: {f.message}"),
    ),
]
table("acquire_faulted", ACQUIRE_FAILED, steps.acquire_faulted, [(f,) for f in FAILURES])


# What our unresolved creates made: (live, shells, given_up, others). The family holds
# `live` new live children (new-1, ...) and `shells` new terminal ones (shell-1, ...);
# with `others`, beside them what is never ours: what was there before the first
# create (its baseline), what is on record already, what is taken elsewhere,
# another title, and the parent.
def made_in(live: int, shells: int, given_up: int, others: bool) -> ownership.Made:
    family = [
        *(FamilyMember(f"new-{n}", TITLE, "not ready") for n in range(1, live + 1)),
        *(FamilyMember(f"shell-{n}", TITLE, "failed") for n in range(1, shells + 1)),
    ]
    if others:
        family += [
            FamilyMember(PARENT, TITLE, "ready"),
            *(FamilyMember(ws, TITLE, status) for ws, status in OTHERS),
            FamilyMember("other-title", "Other", "not ready"),
        ]
    ours = ownership.Creates(frozenset({"known-1", "known-2"}), frozenset({"ours-1"}), given_up)
    taken = {"taken-1": "claimed by brand b2", "taken-2": "made by another attempt's create"}
    empty: dict[str, int | None] = {m.id: 0 for m in family}  # as a create leaves it
    return ownership.credit(family, TITLE, PARENT, ours, taken=taken, projects=empty)


OTHERS = [("known-1", "not ready"), ("known-2", "failed"), ("ours-1", "created"),
          ("taken-1", "not ready"), ("taken-2", "creation_failed")]  # fmt: skip


def _ids(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}-{n}" for n in range(1, count + 1))


MADE: list[Row] = [
    (
        "several live new workspaces: none credited; after a create given up, every shell",
        lambda n, s, g, o: n > 1,
        lambda n, s, g, o: ownership.Made(shells=_ids("shell", s) if g else (), unclear=n),
    ),
    (
        "an earlier create given up: the one live workspace if any, and every shell",
        lambda n, s, g, o: g > 0,
        lambda n, s, g, o: ownership.Made(_ids("new", n), _ids("shell", s), settled=n == 1),
    ),
    (
        "one create: the one live workspace",
        lambda n, s, g, o: n == 1,
        lambda *a: ownership.Made(("new-1",)),
    ),
    (
        "one create, none live: the one shell",
        lambda n, s, g, o: s == 1,
        lambda *a: ownership.Made(shells=("shell-1",)),
    ),
    (
        "one create, none live: several shells, which one create cannot all have made",
        lambda n, s, g, o: s > 1,
        lambda n, s, g, o: ownership.Made(unclear=s),
    ),
    ("nothing new: nothing credited", lambda *a: True, lambda *a: ownership.Made()),
]
table(
    "credit",
    MADE,
    made_in,
    itertools.product(range(4), range(3), range(3), [False, True]),
)

# Recovering an unconfirmed create: (made, title, requested_hop, hop, waited_s, grace_s).
MADE_CASES = [
    ownership.Made(),
    ownership.Made(("ws-1",)),
    ownership.Made(("ws-1",), ("shell-1", "shell-2")),
    ownership.Made(shells=("shell-1",)),
    ownership.Made(shells=("shell-1",), settled=False),
    ownership.Made(shells=("shell-1", "shell-2"), settled=False),
    ownership.Made(unclear=2),
    ownership.Made(shells=("shell-1",), unclear=3),
]
RECOVER: list[Row] = [
    (
        "new workspaces that cannot be told apart",
        lambda m, *a: m.unclear > 0,
        lambda m, t, *a: Fail(
            FailureReason.AMBIGUOUS,
            f"{m.unclear} new workspaces titled {t!r} after an unconfirmed create",
        ),
    ),
    (
        "a live workspace credited to our creates",
        lambda m, *a: bool(m.live),
        lambda m, *a: Accept(m.live[0], Provenance.CREATED),
    ),
    (
        "none live; a shell credited, no create given up: this create's",
        lambda m, *a: bool(m.shells) and m.settled,
        lambda m, *a: Accept(m.shells[0], Provenance.CREATED),
    ),
    (
        "none live; shells after an earlier create was given up, this one may still appear",
        lambda m, t, r, h, w, g: bool(m.shells) and (r == h or w <= g),
        lambda *a: Wait("create unconfirmed; not in the family yet", spends=False),
    ),
    (
        "none live; shells after an earlier create was given up, and this one's grace is over",
        lambda m, *a: bool(m.shells),
        lambda m, *a: Accept(m.shells[0], Provenance.CREATED),
    ),
    (
        "none yet, requested by this hop",
        lambda m, t, r, h, w, g: r == h,
        lambda *a: Wait("create unconfirmed; not in the family yet", spends=False),
    ),
    (
        "none yet, within the grace",
        lambda m, t, r, h, w, g: w <= g,
        lambda *a: Wait("create unconfirmed; not in the family yet", spends=False),
    ),
    ("none after the grace: it did not happen", lambda *a: True, lambda *a: None),
]
table(
    "recover",
    RECOVER,
    lambda m, t, r, h, w, g: creates.recover(m, t, requested_hop=r, hop=h, waited_s=w, grace_s=g),
    itertools.product(
        MADE_CASES,
        [TITLE],
        [None, 0, 1, 2],
        [1, 2],
        [0.0, 59.9, 60.0, 60.1, 3600.0],
        [0.0, 60.0],
    ),
)

# When an unconfirmed create's grace began: (requested_at, deferred_until, answered).
T0 = datetime(2026, 1, 1, tzinfo=UTC)
GRACE_START: list[Row] = [
    ("the gateway answered the create (a 5xx): at the create", lambda r, d, a: a, lambda r, *_: r),
    (
        "no deferral after the create: at the create",
        lambda r, d, a: d is None or d <= r,
        lambda r, *_: r,
    ),
    ("unanswered, deferred since: when the last deferral ended", lambda *_: True, lambda *a: a[1]),
]
table(
    "grace_start",
    GRACE_START,
    creates.grace_start,
    itertools.product(
        [T0],
        [None, T0 - timedelta(seconds=5), T0, T0 + timedelta(minutes=10)],
        [False, True],
    ),
)

# Adopt or create: (eligible_ids, title).
ADOPT: list[Row] = [
    (
        "one ready, empty, unclaimed same-title child",
        lambda e, t: len(e) == 1,
        lambda e, t: Accept(e[0], Provenance.ADOPTED),
    ),
    (
        "several",
        lambda e, t: len(e) > 1,
        lambda e, t: Fail(
            FailureReason.AMBIGUOUS,
            f"{len(e)} adoptable workspaces titled {t!r}: " + ", ".join(sorted(e)),
        ),
    ),
    ("none: create", lambda *a: True, lambda *a: Create()),
]
table(
    "adopt_or_create",
    ADOPT,
    decide.adopt_or_create,
    itertools.product([(), ("b",), ("b", "a"), ("c", "a", "b")], [TITLE, "Other"]),
)

# What the create answered: (answer, parent_id).
CREATE: list[Row] = [
    (
        "no id",
        lambda a, p: a == "",
        lambda a, p: Fail(FailureReason.GATEWAY_BUG, "create answered no id"),
    ),
    (
        "the parent's id",
        lambda a, p: a == p,
        lambda a, p: Fail(FailureReason.GATEWAY_BUG, "create answered the parent's id"),
    ),
    ("an id", lambda a, p: isinstance(a, str), lambda a, p: Record(a)),
    (
        "timeout, dropped connection, 502/504 on the POST: the gateway may still hold it",
        lambda a, p: a.kind is FaultKind.AMBIGUOUS and not a.answered,
        lambda a, p: Recover(a.message, answered=False),
    ),
    (
        "another 5xx, or an unreadable answer: the gateway is done with it",
        lambda a, p: a.kind is FaultKind.AMBIGUOUS,
        lambda a, p: Recover(a.message, answered=True),
    ),
    (
        "409/422, other 4xx",
        lambda a, p: a.kind is FaultKind.REJECTED,
        lambda a, p: Refused(
            a.message, Fail(FailureReason.REJECTED, f"create rejected: {a.message}")
        ),
    ),
    (
        "401/403",
        lambda a, p: a.kind is FaultKind.UNAUTHORIZED,
        lambda a, p: Refused(
            a.message, Fail(FailureReason.UNAUTHORIZED, f"gateway refused: {a.message}")
        ),
    ),
    (
        "429 whose Retry-After its thread waited out (the pace limits the calls)",
        lambda a, p: a.kind is FaultKind.TRANSIENT and a.waited,
        lambda a, p: CreateAgain(
            a.message,
            Refused(a.message, Defer(f"gateway unavailable: {a.message}", 0.0)),  # waited out
        ),
    ),
    (
        "429 or never sent",
        lambda a, p: a.kind is FaultKind.TRANSIENT,
        lambda a, p: Refused(
            a.message, Defer(f"gateway unavailable: {a.message}", a.retry_after_s, a.paced)
        ),
    ),
    (
        "an answer off the contract",
        lambda a, p: a.kind is FaultKind.MALFORMED,
        lambda a, p: Fail(FailureReason.GATEWAY_BUG, f"create answer: {a.message}"),
    ),
    (
        "404: the parent",
        lambda a, p: a.kind is FaultKind.GONE,
        lambda a, p: Fail(FailureReason.REJECTED, f"parent workspace not found: {a.message}"),
    ),
]
table(
    "create_answered",
    CREATE,
    creates.create_answered,
    itertools.product(["", PARENT, "ws-9", *FAILURES], [PARENT]),
)

# Where what a run created goes: (candidate_id, state).
PLACE: list[Row] = [
    (
        "no candidate, not promoted: the candidate",
        lambda c, s: c is None and s is not AttemptState.PROMOTED,
        lambda *a: True,
    ),
    ("otherwise: a surplus, owed a release", lambda *a: True, lambda *a: False),
]
table(
    "created_takes_candidate",
    PLACE,
    creates.created_takes_candidate,
    itertools.product([None, "ws-1"], AttemptState),
)

# What a run created is held by another brand: (claimed_because,).
CLAIMED: list[Row] = [
    (
        "another brand holds it",
        lambda c: True,
        lambda c: Fail(FailureReason.GATEWAY_BUG, f"create answered {c}"),
    ),
]
table("created_is_claimed", CLAIMED, creates.created_is_claimed, [("ws-1 is claimed by b2",)])

# The candidate's status: (answer, provenance, workspace_id).
READY = ["created", "active", "ready", " Ready ", "ACTIVE"]
CREATION_FAILED = ["creation_failed", "creation failed", "Creation  Failed"]
TERMINAL = ["failed", "error", "invalid subscription", " ERROR", "Invalid Subscription"]
SETTLING = ["not ready", "", "creating", "pending", "readyish"]
STATUS: list[Row] = [
    (
        "401/403",
        lambda a, p, w: isinstance(a, GatewayFault) and a.kind is FaultKind.UNAUTHORIZED,
        lambda a, p, w: Fail(FailureReason.UNAUTHORIZED, f"gateway refused: {a.message}"),
    ),
    (
        "no answer (timeout, 429, 5xx, refused, held by the pace): defer",
        lambda a, p, w: isinstance(a, GatewayFault) and a.kind is FaultKind.TRANSIENT,
        lambda a, p, w: Defer(f"gateway unavailable: {a.message}", a.retry_after_s, a.paced),
    ),
    (
        "malformed and the like: counted as still settling",
        lambda a, p, w: isinstance(a, GatewayFault) and a.kind is not FaultKind.GONE,
        lambda a, p, w: Wait(f"unknown ({a.message})"),
    ),
    (
        "404, the bound workspace too (it stays bound: the brand reads degraded)",
        lambda a, p, w: isinstance(a, GatewayFault),
        lambda a, p, w: Fail(
            FailureReason.TERMINAL_STATUS, f"workspace {w} reported status 'gone (404)'"
        ),
    ),
    ("ready", lambda a, p, w: a in READY, lambda *a: Promote()),
    (
        "creation failed, the bound workspace",
        lambda a, p, w: a in CREATION_FAILED and p is Provenance.EXISTING,
        lambda a, p, w: DropExisting(a, Wait(f"bound workspace reported {a!r}")),
    ),
    (
        "creation failed: drop the candidate, create again",
        lambda a, p, w: a in CREATION_FAILED,
        lambda a, p, w: DropCandidate(a, Wait(f"candidate reported {a!r}; creating again")),
    ),
    (
        "failed, error, invalid subscription (whatever the provenance): not safe to create again",
        lambda a, p, w: a in TERMINAL,
        lambda a, p, w: Fail(FailureReason.TERMINAL_STATUS, f"workspace {w} reported status {a!r}"),
    ),
    ("anything else: still settling", lambda *a: True, lambda a, p, w: Wait(a)),
]
table(
    "status_answered",
    STATUS,
    decide.status_answered,
    itertools.product(
        [*READY, *CREATION_FAILED, *TERMINAL, *SETTLING, *FAILURES], [*Provenance, None], ["ws-1"]
    ),
)

# A candidate: (workspace_id, provenance, status, created). Polled, unless this
# round's create has just made it; once polled, its status decides (above).
CANDIDATE: list[Row] = [
    (
        "polled: what its status says",
        lambda w, p, a, c: a is not None,
        lambda w, p, a, c: decide.status_answered(a, p, w),
    ),
    (
        "just made by this round's create: not asked yet",
        lambda w, p, a, c: c == w,
        lambda w, p, a, c: Wait(decide.CREATED_WAIT, spends=False),
    ),
    ("otherwise: poll it", lambda *a: True, lambda w, p, a, c: decide.Poll(w)),
]
table(
    "candidate",
    CANDIDATE,
    decide.candidate,
    itertools.product(
        ["ws-1"],
        [*Provenance, None],
        [None, "created", "not ready", "failed", FAILURES[0]],
        [None, "ws-1", "ws-2", FAILURES[0]],
    ),
)

# Not yet: (hop, settled, max_hop, backoff, now, status, spends). The hop number
# counts deferrals too; only `settled` (the answered "not yet"s) spends the budget.
BACKOFFS = [Backoff(5.0, 5), Backoff(0.0, 0), Backoff(1.5, 3)]
ENDINGS: list[Row] = [
    (
        "a wait that spends no budget (an unconfirmed create's grace, a create's first"
        " wait): the first backoff step",
        lambda h, d, m, b, n, s, sp: not sp,
        lambda h, d, m, b, n, s, sp: Schedule(
            h + 1, n + timedelta(seconds=b.base_s), b.base_s, s, spends=False
        ),
    ),
    (
        "settle hops left",
        lambda h, d, m, b, n, s, sp: d < m and b.can_requeue(d),
        lambda h, d, m, b, n, s, sp: Schedule(
            h + 1, n + timedelta(seconds=b.base_s * 2**d), b.base_s * 2**d, s
        ),
    ),
    (
        "settle budget spent",
        lambda *a: True,
        lambda h, d, m, b, n, s, sp: Fail(
            FailureReason.EXHAUSTED, f"not confirmed after {d + 1} answered hops; last: {s}"
        ),
    ),
]
table(
    "schedule_or_exhaust",
    ENDINGS,
    lambda h, d, m, b, n, s, sp: waits.schedule_or_exhaust(h, m, b, n, s, settled=d, spends=sp),
    [
        (h, d, m, b, n, s, sp)
        for h, d, m, b, n, s, sp in itertools.product(
            range(0, 40, 3), range(8), [0, 3, 5, 8], BACKOFFS, [NOW], ["not ready"], [True, False]
        )
        if d <= h
    ],
)

# No answer: (hop, step, in_row, unavailable_since, deadline_at, now, deferral, jitter).
DEFERRALS = [
    Deferral(2.0, max_s=30.0, deadline_s=3600.0, retry_after_max_s=300.0),
    Deferral(1.0, max_s=1.0, deadline_s=60.0, retry_after_max_s=300.0),
]
NO_ANSWER = [
    Defer("gateway unavailable: HTTP 503"),
    Defer("gateway unavailable: throttled (HTTP 429)", retry_after_s=45.0),
    Defer("gateway unavailable: not sent (paced at 20 calls/s)", retry_after_s=3.5, paced=True),
    Defer("gateway unavailable: HTTP 429", retry_after_s=1.0, gateway_up=True),
    Defer("gateway unavailable: HTTP 429", retry_after_s=0.3),
]


def _deferred_until(h: int, st: Defer, r: int, since: datetime | None, n: datetime,
                    dl: datetime, d: Deferral, j: float) -> Schedule:  # fmt: skip
    # The cap doubles for each whole hour the gateway has been silent, up to 600 s.
    hours = int((n - (since or n)).total_seconds() // 3600)
    cap = max(d.max_s, min(600.0, d.max_s * 2**hours))
    step = 0 if st.gateway_up else r  # another call of the hop was answered: the first again
    backoff = min(cap, d.base_s * 2**step) * (0.5 + 0.5 * j)
    wait = max(st.retry_after_s, backoff)
    if st.paced:
        wait = st.retry_after_s * (1 + 0.25 * j)
    elif st.retry_after_s > 0 and r < 2:  # told when, the first two in a row: waited as told
        spread = max(0, min(st.retry_after_s / 4, 1.0, st.retry_after_s - 1))  # none in 1 s
        wait = max(st.retry_after_s, d.base_s / 2) + j * spread
    until = min(n + timedelta(seconds=wait), dl)
    return Schedule(h + 1, until, (until - n).total_seconds(), st.status, deferred=True,
                    spends=False, paced=st.paced)  # fmt: skip


DEFER: list[Row] = [
    (
        "the deadline has come: fail, naming since when nothing answered",
        lambda h, st, r, since, dl, n, d, j: n >= dl,
        lambda h, st, r, since, dl, n, d, j: Fail(
            FailureReason.DEADLINE,
            f"no answer from the gateway since {(since or n).isoformat(timespec='seconds')}; "
            f"last: {st.status}",
        ),
    ),
    (
        "held for the fleet's own turn: the next hop then, up to a quarter later, by the deadline",
        lambda h, st, *a: st.paced,
        lambda h, st, r, since, dl, n, d, j: _deferred_until(h, st, r, since, n, dl, d, j),
    ),
    (
        "before it: the next hop after Retry-After and the jittered backoff, by the deadline",
        lambda *a: True,
        lambda h, st, r, since, dl, n, d, j: _deferred_until(h, st, r, since, n, dl, d, j),
    ),
]
table(
    "defer_or_expire",
    DEFER,
    lambda h, st, r, since, dl, n, d, j: waits.defer_or_expire(
        h, st, in_row=r, unavailable_since=since, deadline_at=dl, now=n, deferral=d, jitter=j
    ),
    itertools.product(
        [0, 7],
        NO_ANSWER,
        [0, 1, 4, 20],
        [None, NOW - timedelta(minutes=5), NOW - timedelta(hours=2, minutes=1)],
        [NOW + timedelta(seconds=10), NOW + timedelta(hours=1), NOW],
        [NOW],
        DEFERRALS,
        [0.0, 0.5, 0.999],
    ),
)

# Before a create that gives an unconfirmed one up: (given_up, title).
MAY_CREATE: list[Row] = [
    (
        "as many unconfirmed creates as allowed",
        lambda g, t: g + 1 >= creates.MAX_CREATES,
        lambda g, t: Fail(
            FailureReason.EXHAUSTED, f"{g + 1} creates titled {t!r} were never confirmed"
        ),
    ),
    ("fewer: create again", lambda *a: True, lambda *a: None),
]
table("may_create", MAY_CREATE, creates.may_create, [(g, TITLE) for g in range(5)])

# Port failures as values: (exception,).
EXCEPTIONS: list[Row] = [
    (
        cls.__name__,
        lambda e, cls=cls: type(e) is cls,
        lambda e, kind=kind: GatewayFault(kind, str(e)),
    )
    for cls, kind in [
        (AmbiguousCreate, FaultKind.AMBIGUOUS),
        (TransientGatewayError, FaultKind.TRANSIENT),
        (WorkspaceGone, FaultKind.GONE),
        (RequestRejected, FaultKind.REJECTED),
        (Unauthorized, FaultKind.UNAUTHORIZED),
        (MalformedAnswer, FaultKind.MALFORMED),
    ]
] + [("another GatewayError", lambda e: True, lambda e: GatewayFault(FaultKind.TRANSIENT, str(e)))]
table(
    "fault_of",
    EXCEPTIONS,
    fault_of,
    [
        (cls(f"said {n}"),)
        for n, cls in enumerate(
            [
                AmbiguousCreate,
                TransientGatewayError,
                WorkspaceGone,
                RequestRejected,
                Unauthorized,
                MalformedAnswer,
                GatewayError,
            ]
        )
    ],
)


@pytest.mark.parametrize(
    ("name", "fn", "args", "rows"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_the_decision_is_the_tables(
    name: str, fn: Callable[..., object], args: tuple[Any, ...], rows: list[Row]
) -> None:
    row, want = expected(rows, args)
    REACHED.add(f"{name}: {row}")
    assert fn(*args) == want, f"{name} row {row!r} for {args}"


def test_every_row_is_reached_and_there_are_hundreds_of_cases() -> None:
    every = {f"{name}: {row[0]}" for name, _, _, rows in CASES for row in rows}
    reached = set()
    for name, _, args, rows in CASES:
        reached.add(f"{name}: {expected(rows, args)[0]}")
    assert every == reached, sorted(every - reached)
    assert len(CASES) >= 300


def test_the_ending_reports_its_outcome() -> None:
    assert decide.ended(Fail(FailureReason.AMBIGUOUS, "2 new")) == (
        Outcome.FAILED,
        "ambiguous: 2 new",
    )
    schedule = Schedule(1, NOW, 5.0, "not ready")
    assert decide.ended(schedule) == (Outcome.SCHEDULED, "not ready")
    deferred = Schedule(1, NOW, 5.0, "gateway unavailable: HTTP 503", deferred=True)
    assert decide.ended(deferred) == (Outcome.DEFERRED, "gateway unavailable: HTTP 503")
