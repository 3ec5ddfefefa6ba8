"""The promises, checked over facts gathered after a run: pure functions, no I/O.

`facts.py` reads the event store, the fake's admin state, the dead-letter queue
and the logs into the plain values below; each check returns the violations it
finds, each naming its kind, the brand when there is one, and what is wrong.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from domain.policies import StatusClass, classify_status

ENDED = ("promoted", "failed", "cancelled", "superseded")
# Attempt events that settle a create (the create is no longer unresolved).
RESOLVING = ("CandidateAccepted", "SurplusCreated", "CandidateReleased", "CreateRefused")
# Attempt events after which a new create is safe (docs/architecture.md).
NEW_CREATE_SAFE = ("CandidateDropped", "CreateRefused")


@dataclass(frozen=True)
class AttemptFacts:
    attempt_id: str
    title: str
    state: str
    failure_reason: str | None = None
    candidate_id: str | None = None
    created_ids: tuple[str, ...] = ()
    released_ids: tuple[str, ...] = ()  # by CandidateReleased (emptied), not handed over
    events: tuple[str, ...] = ()  # event class names, in order
    failure_message: str | None = None
    deferrals: int = 0  # hops the gateway did not answer (HopScheduled.deferred)
    create_times: tuple[float, ...] = ()  # CreateRequested timestamps (epoch seconds)


@dataclass(frozen=True)
class BrandFacts:
    brand_id: str
    lifecycle: str  # active / deactivated
    workspace_id: str | None
    attempts: tuple[AttemptFacts, ...] = ()  # in the order the brand began them
    unbound_ids: tuple[str, ...] = ()  # WorkspaceUnbound's workspaces


@dataclass(frozen=True)
class Upstream:
    """The fake's admin state: workspaces by id, creates per title, creates per
    title that timed out with nothing made; and what we knew before the run: the
    parents as they were, the workspaces we seeded."""

    workspaces: Mapping[str, Mapping[str, Any]]
    creates: Mapping[str, int]
    parents_before: Mapping[str, Mapping[str, Any]]
    seeded: frozenset[str] = frozenset()
    dropped: Mapping[str, int] = field(default_factory=dict)
    kills: tuple[float, ...] = ()  # when the run SIGKILLed a worker (epoch seconds)


# A create is cut by a worker kill that falls this soon after it was recorded: the
# run's gateway timeout (1.5 s) plus the longest the pace holds a create (10 s).
KILL_WINDOW_S = 11.5


def creates_lost(attempt: AttemptFacts, upstream: Upstream) -> int:
    """How many of the attempt's creates the run's faults can account for losing:
    those the fake dropped (timed out with nothing made) for its title, and those
    a worker kill may have cut before they were sent."""
    cut = sum(
        any(0 <= kill - at <= KILL_WINDOW_S for kill in upstream.kills)
        for at in attempt.create_times
    )
    return upstream.dropped.get(attempt.title, 0) + cut


@dataclass(frozen=True)
class Violation:
    kind: str
    brand_id: str | None
    detail: str


@dataclass
class Facts:
    brands: Mapping[str, BrandFacts]
    claims: Mapping[str, str | None]  # workspace id -> the brand holding its claim
    upstream: Upstream
    poison: Sequence[bytes] = ()
    dead_letters: Sequence[bytes] = ()
    projection_problems: Sequence[str] = ()
    rebuild_problems: Sequence[str] = ()
    secret_hits: Sequence[str] = ()
    extra: list[Violation] = field(default_factory=list)


def attempts_ended(brands: Iterable[BrandFacts]) -> list[Violation]:
    return [
        Violation("attempt_not_ended", b.brand_id, f"attempt {a.attempt_id} is {a.state}")
        for b in brands
        for a in b.attempts
        if a.state not in ENDED
    ]


def _ready(upstream: Upstream, workspace_id: str) -> bool:
    ws = upstream.workspaces.get(workspace_id)
    return ws is not None and classify_status(str(ws.get("status"))) is StatusClass.READY


def bindings(
    brands: Iterable[BrandFacts], claims: Mapping[str, str | None], upstream: Upstream
) -> list[Violation]:
    """Each active brand whose last attempt was promoted is bound to one ready
    workspace whose claim names it; no workspace is bound to two brands; no
    deactivated brand keeps a pointer."""
    found: list[Violation] = []
    holders: dict[str, list[str]] = {}
    for brand in brands:
        ws = brand.workspace_id
        if ws is not None:
            holders.setdefault(ws, []).append(brand.brand_id)
        if brand.lifecycle == "deactivated":
            if ws is not None:
                found.append(Violation("deactivated_with_pointer", brand.brand_id, ws))
            continue
        last = brand.attempts[-1] if brand.attempts else None
        if last is None or last.state != "promoted":
            continue
        if ws is None:
            found.append(Violation("promoted_not_bound", brand.brand_id, last.attempt_id))
        elif ws != last.candidate_id:
            found.append(
                Violation("bound_elsewhere", brand.brand_id, f"{ws} != {last.candidate_id}")
            )
        elif not _ready(upstream, ws):
            status = upstream.workspaces.get(ws, {}).get("status", "missing")
            found.append(Violation("bound_not_ready", brand.brand_id, f"{ws} is {status}"))
        elif claims.get(ws) != brand.brand_id:
            found.append(
                Violation("claim_mismatch", brand.brand_id, f"{ws} held by {claims.get(ws)}")
            )
    for ws, names in holders.items():
        if len(names) > 1:
            for name in names:
                found.append(Violation("bound_twice", name, f"{ws} bound to {sorted(names)}"))
    return found


def upstream_accounted(brands: Iterable[BrandFacts], upstream: Upstream) -> list[Violation]:
    """Every workspace our creates made is on record, and bound, or released with
    the release recorded (emptied), or the candidate of an attempt that failed on a
    terminal status (never usable, owed nothing)."""
    brands = list(brands)
    bound = {b.workspace_id for b in brands if b.workspace_id}
    released: set[str] = set()
    creator: dict[str, tuple[str, AttemptFacts]] = {}
    titled: dict[str, str] = {}  # a title -> a brand that asked for it
    for brand in brands:
        released.update(brand.unbound_ids)
        for attempt in brand.attempts:
            released.update(attempt.released_ids)
            titled.setdefault(attempt.title, brand.brand_id)
            for made in attempt.created_ids:
                creator[made] = (brand.brand_id, attempt)
    found: list[Violation] = []
    for ws_id, ws in upstream.workspaces.items():
        if ws_id in upstream.parents_before or ws_id in upstream.seeded:
            continue
        if ws_id not in creator and ws_id not in bound:
            # An empty shell in a terminal status: a create answered, and its status
            # polled, but the save that would record it lost (a worker killed, a
            # backend terminated); recovery skips terminal children (new_since).
            shell = classify_status(str(ws.get("status"))).is_terminal and not ws.get("projects")
            kind = "terminal_shell_not_on_record" if shell else "create_not_on_record"
            found.append(Violation(kind, titled.get(str(ws.get("title"))), f"{ws_id} {dict(ws)}"))
            continue
        brand_id, attempt = creator.get(ws_id) or (None, None)
        if ws_id in bound:
            continue
        if ws_id in released:
            if ws.get("projects"):
                found.append(Violation("released_not_empty", brand_id, f"{ws_id} {dict(ws)}"))
            continue
        unusable = (
            attempt is not None
            and attempt.failure_reason == "terminal_status"
            and attempt.candidate_id == ws_id
        )
        if not unusable:
            where = f"attempt {attempt.attempt_id} ({attempt.state})" if attempt else ""
            found.append(Violation("left_unreleased", brand_id, f"{ws_id} of {where}"))
    return found


def unjustified_creates(attempt: AttemptFacts) -> int:
    """Creates an attempt requested beyond its first without an ambiguous create
    (one left unresolved) or a dropped or refused one before them."""
    count = 0
    seen = 0
    unresolved = safe = False
    for name in attempt.events:
        if name == "CreateRequested":
            if seen and not (unresolved or safe):
                count += 1
            seen += 1
            unresolved, safe = True, False
        elif name in RESOLVING:
            unresolved = False
        if name in NEW_CREATE_SAFE:
            safe = True
    return count


def creates(brands: Iterable[BrandFacts], upstream: Upstream) -> list[Violation]:
    """Upstream, no title got more creates than its attempts recorded; within an
    attempt, creates beyond the first only after an ambiguous (or refused, or
    dropped) create."""
    found: list[Violation] = []
    requested: Counter[str] = Counter()
    who: dict[str, list[str]] = {}
    for brand in brands:
        for attempt in brand.attempts:
            requested[attempt.title] += attempt.events.count("CreateRequested")
            who.setdefault(attempt.title, []).append(brand.brand_id)
            extra = unjustified_creates(attempt)
            if extra:
                found.append(
                    Violation(
                        "unjustified_create",
                        brand.brand_id,
                        f"attempt {attempt.attempt_id}: {extra} create(s) after a resolved one",
                    )
                )
    for title, made in upstream.creates.items():
        if made > requested.get(title, 0):
            names = who.get(title, [None])
            found.append(
                Violation(
                    "create_beyond_record",
                    names[0],
                    f"{title!r}: {made} creates upstream, {requested.get(title, 0)} recorded",
                )
            )
    return found


def parents_untouched(brands: Iterable[BrandFacts], upstream: Upstream) -> list[Violation]:
    found: list[Violation] = []
    for parent, before in upstream.parents_before.items():
        now = upstream.workspaces.get(parent)
        if now is None or now.get("projects") != before.get("projects"):
            found.append(Violation("parent_touched", None, f"{parent}: {before} -> {now}"))
    for brand in brands:
        if brand.workspace_id in upstream.parents_before:
            found.append(Violation("parent_bound", brand.brand_id, str(brand.workspace_id)))
    return found


# Why an attempt may end failed under the run's faults; every other reason
# (deadline, internal_error, unauthorized, rejected, gateway_bug) is a violation:
# the run's deadline is longer than the run, the fake answers 401 only without a
# token, never refuses a parent nor lies about an id, and no outage, 429 or 503
# may cost an attempt its settle budget.
EXPLAINED_REASONS = {
    "terminal_status": "its workspace went terminal upstream (a title scripted to)",
    "exhausted": "a workspace it made never settled (a zombie) or failed creation again, "
    "or the fake dropped or a worker kill cut every create it was allowed",
    "ambiguous": "two or more workspaces upstream carry its title (same-title faults)",
}


def failure_explained(attempt: AttemptFacts, upstream: Upstream) -> bool:
    """Whether the run's faults account for this failed attempt's reason, by what
    the fake holds: `terminal_status` needs its candidate terminal upstream
    (`failed`, `error`, `invalid subscription`); `exhausted` one of its own
    workspaces still settling (a zombie never settles) or `creation failed` (a
    title scripted so is created again and fails again), or its creates never
    confirmed no more than the run lost (`creates_lost`); `ambiguous` at least two
    workspaces of its title besides the parents (only the seeded lookalikes and
    brands sharing a title make those; creates beyond the record are checked apart)."""
    reason = attempt.failure_reason

    def status(ws_id: str | None) -> StatusClass | None:
        ws = upstream.workspaces.get(ws_id) if ws_id else None
        return None if ws is None else classify_status(str(ws.get("status")))

    if reason == "terminal_status":
        return status(attempt.candidate_id) is StatusClass.TERMINAL
    if reason == "exhausted":
        own = {attempt.candidate_id, *attempt.created_ids} - {None}
        stuck = (StatusClass.SETTLING, StatusClass.CREATION_FAILED)
        unconfirmed = attempt.events.count("CreateRequested") - len(attempt.created_ids)
        lost = 0 < unconfirmed <= creates_lost(attempt, upstream)
        return lost or any(status(ws_id) in stuck for ws_id in own)
    if reason == "ambiguous":
        alike = [
            ws_id
            for ws_id, ws in upstream.workspaces.items()
            if ws.get("title") == attempt.title and ws_id not in upstream.parents_before
        ]
        return len(alike) >= 2
    return False


def failures_explained(brands: Iterable[BrandFacts], upstream: Upstream) -> list[Violation]:
    """Every failed attempt failed for a reason the run's faults account for
    (`failure_explained`): none `exhausted` or `deadline` for an outage, a 429 or a 503."""
    return [
        Violation(
            "failure_unexplained",
            brand.brand_id,
            f"attempt {a.attempt_id} failed {a.failure_reason}: {a.failure_message} "
            f"({a.deferrals} hops deferred)",
        )
        for brand in brands
        for a in brand.attempts
        if a.state == "failed" and not failure_explained(a, upstream)
    ]


def brands_ready(brands: Iterable[BrandFacts], upstream: Upstream) -> list[Violation]:
    """Every active brand ends ready (its last attempt promoted; `bindings` checks
    the workspace) unless its last attempt failed for a reason the faults explain."""
    found = []
    for brand in brands:
        if brand.lifecycle == "deactivated":
            continue
        last = brand.attempts[-1] if brand.attempts else None
        if last is not None and last.state == "promoted":
            continue
        if last is not None and last.state == "failed" and failure_explained(last, upstream):
            continue
        what = "no attempt" if last is None else f"last attempt {last.attempt_id} {last.state}"
        if last is not None and last.failure_reason:
            what += f" ({last.failure_reason})"
        found.append(Violation("brand_not_ready", brand.brand_id, what))
    return found


def dead_letters(poison: Sequence[bytes], dead: Sequence[bytes]) -> list[Violation]:
    """The dead-letter queue holds the poisoned messages and nothing else: each one
    at least once (a worker killed between dead-lettering and acking one gets it
    redelivered and dead-letters it again: at-least-once, see `dead_letter_repeats`)."""
    want, got = set(poison), set(dead)
    found = [Violation("poison_not_dead_lettered", None, _short(b)) for b in sorted(want - got)]
    found += [
        Violation("unexpected_dead_letter", None, f"{n} x {_short(body)}")
        for body, n in sorted(Counter(dead).items())
        if body not in want
    ]
    return found


def dead_letter_repeats(poison: Sequence[bytes], dead: Sequence[bytes]) -> int:
    """Poisoned messages dead-lettered more than once (the extra copies)."""
    return sum(n - 1 for body, n in Counter(dead).items() if body in set(poison) and n > 1)


def _short(body: bytes) -> str:
    return repr(body[:160]) + (f"... ({len(body)} bytes)" if len(body) > 160 else "")


# Kinds of `provisioner audit` a drained run never leaves, whatever its faults: the
# operators' definition of the promises, checked here under the stronger checks above
# (which read the fake's admin state). Not `unclear` (an attempt failed `ambiguous`
# leaves its new workspaces so: failures_explained judges it), nor `bound_terminal`
# (brands_ready does), nor information (`foreign`, `in_flight`).
AUDIT_BREACHES = frozenset({"orphan", "bound_missing", "claimed_twice", "released_not_empty",
                            "release_owed", "parent_on_record"})  # fmt: skip


def audited(findings: Iterable[Mapping[str, Any]]) -> list[Violation]:
    """The findings of `provisioner audit --json` that break a promise."""
    return [
        Violation(
            f"audit_{f['kind']}",
            next(iter(f.get("brand_ids") or ()), None),
            f"{f['workspace_id']}: {f['detail']}",
        )
        for f in findings
        if f["kind"] in AUDIT_BREACHES
    ]


def check(facts: Facts) -> list[Violation]:
    brands = list(facts.brands.values())
    found = [
        *attempts_ended(brands),
        *bindings(brands, facts.claims, facts.upstream),
        *upstream_accounted(brands, facts.upstream),
        *creates(brands, facts.upstream),
        *parents_untouched(brands, facts.upstream),
        *failures_explained(brands, facts.upstream),
        *brands_ready(brands, facts.upstream),
        *dead_letters(facts.poison, facts.dead_letters),
    ]
    found += [
        Violation("projection_differs_from_replay", None, p) for p in facts.projection_problems
    ]
    found += [Violation("projection_differs_from_rebuild", None, p) for p in facts.rebuild_problems]
    found += [Violation("secret_in_log", None, hit) for hit in facts.secret_hits]
    return found + list(facts.extra)


def by_kind(violations: Iterable[Violation]) -> dict[str, int]:
    return dict(sorted(Counter(v.kind for v in violations).items()))


def secret_hits(logs: Mapping[str, str], secrets: Mapping[str, str]) -> list[str]:
    """'file:line: which secret' for every captured line that shows a secret (the
    secret itself is never repeated)."""
    hits = []
    for name, text in logs.items():
        for number, line in enumerate(text.splitlines(), 1):
            for what, secret in secrets.items():
                if secret and secret in line:
                    hits.append(f"{name}:{number}: {what}")
    return hits
