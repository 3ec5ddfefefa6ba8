"""Why an attempt is where it is, and what comes next, as a pure function of plain
values: what `provisioner status` and the web view say about an attempt.

`progress(facts, now)` gives the reason (a failure reason, `deferred`, or none),
the advice that goes with it, and for a pending attempt the hop it is at, the
settle budget, when its next hop is due, when it fails unless confirmed, and the
deferrals in a row. Times are UTC; a time on another day than `now` carries its
date.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from domain.hop import CREATED_WAIT
from domain.policies import AttemptState, FailureReason, StatusClass, classify_status
from domain.waits import Backoff

RETRY = "`provisioner retry --failed`"
OVERDUE_S = 60.0  # a hop this late is overdue (as `provisioner attempts --stuck` counts)

ADVICE: dict[FailureReason, str] = {
    FailureReason.UNAUTHORIZED: (
        f"the gateway refused the token: rotate the token (PROVISIONER_GATEWAY_TOKEN), then {RETRY}"
    ),
    FailureReason.EXHAUSTED: (
        "the workspace was not ready within the settle budget, or three creates went "
        "unconfirmed: check its status on the gateway (a workspace stuck `not ready` is a "
        f"zombie only its support can clear), then {RETRY} starts a fresh attempt"
    ),
    FailureReason.TERMINAL_STATUS: (
        "the gateway reported the workspace failed for good; a new create may meet the "
        f"same fate: ask the gateway's owners, then {RETRY}"
    ),
    FailureReason.AMBIGUOUS: (
        "several new workspaces of this title appeared after an unconfirmed create: "
        f"keep the right one on the gateway, then {RETRY}"
    ),
    FailureReason.REJECTED: (
        f"the gateway rejected the create: check the brand's title and parent, then {RETRY}"
    ),
    FailureReason.GATEWAY_BUG: (
        "the gateway answered what it should not (no id, or one that is not new): "
        "report it to the gateway's owners"
    ),
    FailureReason.INTERNAL_ERROR: (
        "a hop raised an unexpected error on every retry (a bug): the worker's log has "
        f"the traceback; {RETRY} once it is fixed"
    ),
}
ENDED: dict[AttemptState, str] = {
    AttemptState.PROMOTED: "the brand's workspace is bound; nothing to do",
    AttemptState.CANCELLED: "the attempt was cancelled (the brand was deactivated)",
    AttemptState.SUPERSEDED: "a newer attempt of the brand carries on",
}


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """What an attempt's stream says, as plain values (`ProvisioningAttempt`'s fields).

    `hop`: the hop it expects next; `settle_hops` of `max_hop`: the settle budget
    used; `next_hop_at`: when that hop may run (None once ended); `deadline_at`:
    when a pending attempt fails whatever happens; `deferred_in_row` and
    `unavailable_since`: the gateway's silence towards it; `parent_allowed`:
    whether its parent is one this service acts under (None: not known)."""

    state: AttemptState
    hop: int
    settle_hops: int
    max_hop: int
    parent_id: str
    failure_reason: FailureReason | None = None
    failure_message: str | None = None
    last_status: str = ""
    next_hop_at: datetime | None = None
    deadline_at: datetime | None = None
    deferred_in_row: int = 0
    unavailable_since: datetime | None = None
    parent_allowed: bool | None = None


@dataclass(frozen=True, slots=True)
class BrandStanding:
    """What the brand's stream says that changes the advice: whether it is active,
    whether a workspace is bound, and a deactivated one's emptying."""

    active: bool = True
    bound: bool = False
    to_be_emptied_at: datetime | None = None
    emptying_refused: str | None = None


@dataclass(frozen=True, slots=True)
class Fleet:
    """What the deployment's heartbeats say that changes the advice (None: not read):
    since when the relay, which publishes every hop, has been silent."""

    relay_silent_since: datetime | None = None


@dataclass(frozen=True, slots=True)
class Progress:
    """What to tell a person: `reason` (a code), `advice` (a sentence), and while
    pending `step` ("hop 4 of 6, next at ..."), `deferral` ("deferred ×7: ...")
    and the figures they are made of."""

    state: str
    reason: str | None
    advice: str | None
    step: str | None = None
    deferral: str | None = None
    next_hop_at: datetime | None = None
    fails_after: datetime | None = None
    budget_left: int | None = None
    overdue: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "state": self.state,
            "reason": self.reason,
            "advice": self.advice,
            "step": self.step,
            "deferral": self.deferral,
            "next_hop_at": self.next_hop_at,
            "fails_after": self.fails_after,
            "budget_left": self.budget_left,
            "overdue": self.overdue,
        }


def clock(at: datetime, now: datetime) -> str:
    """A time as HH:MM:SS (UTC), with its date when it is not `now`'s day."""
    at, today = at.astimezone(UTC), now.astimezone(UTC)
    shown = at.strftime("%H:%M:%S")
    return shown if at.date() == today.date() else f"{at:%Y-%m-%d} {shown}"


def exhausted_at(facts: AttemptFacts, backoff: Backoff) -> datetime | None:
    """When the attempt fails `exhausted` if every hop from the next one on finds the
    workspace still settling: the next hop's time plus the waits left in the budget."""
    if facts.next_hop_at is None:
        return None
    last = min(facts.max_hop, backoff.max_requeues)
    waits = sum(backoff.delay_after(n) for n in range(facts.settle_hops, last))
    return facts.next_hop_at + timedelta(seconds=waits)


def _deadline_advice(facts: AttemptFacts, now: datetime) -> str:
    if facts.unavailable_since is not None:
        down = f"the gateway is down since {clock(facts.unavailable_since, now)}"
    else:
        down = "its hops could not run until its deadline (see `provisioner dead-letters list`)"
    return f"{down}; retry with {RETRY} once it answers"


def _failure(facts: AttemptFacts, now: datetime) -> tuple[str | None, str]:
    reason = facts.failure_reason
    if reason is FailureReason.DEADLINE:
        return reason.value, _deadline_advice(facts, now)
    if reason is None:
        return None, f"the attempt failed with no reason on record: {RETRY}"
    return reason.value, ADVICE[reason]


def _deferral(facts: AttemptFacts, now: datetime) -> str | None:
    if not facts.deferred_in_row:
        return None
    status = facts.last_status or "gateway unavailable"
    since = (
        "" if facts.unavailable_since is None else f" since {clock(facts.unavailable_since, now)}"
    )
    return f"deferred ×{facts.deferred_in_row}: {status}{since}"


def _throttled(status: str) -> bool:
    """A deferral's status that says the gateway throttled, or the pace held, the call."""
    said = status.lower()
    return any(word in said for word in ("429", "throttled", "paced at", "retry-after"))


def _pending(facts: AttemptFacts, now: datetime, backoff: Backoff, fleet: Fleet | None) -> Progress:
    left = max(facts.max_hop - facts.settle_hops, 0)
    parts = [f"hop {facts.settle_hops + 1} of {facts.max_hop + 1}"]
    if facts.hop != facts.settle_hops:
        parts[0] += f" (hop #{facts.hop} in all)"
    late = None if facts.next_hop_at is None else (now - facts.next_hop_at).total_seconds()
    overdue = late is not None and late > OVERDUE_S
    if facts.next_hop_at is not None:
        due = clock(facts.next_hop_at, now)
        parts.append(f"next at {due}" + (" (overdue)" if overdue else ""))
    ends = [t for t in (exhausted_at(facts, backoff), facts.deadline_at) if t is not None]
    fails_after = min(ends) if ends else None
    if fails_after is not None:
        parts.append(f"fails after {clock(fails_after, now)} unless confirmed")
    deferral = _deferral(facts, now)
    relay = fleet.relay_silent_since if fleet is not None else None
    if relay is not None:
        advice = (
            f"its hops are not published: the relay is silent since {clock(relay, now)}; "
            "start `provisioner relay` (or `provisioner run`)"
        )
    elif deferral is not None and _throttled(facts.last_status):
        advice = (
            "throttled by the gateway (429) or held for the fleet's turn: its hops wait "
            "their turn, the settle budget untouched"
        )
    elif deferral is not None:
        advice = "the gateway does not answer: its hops wait, the settle budget untouched"
    elif overdue:
        advice = (
            "its next hop is overdue: is a worker running? `provisioner reconcile` re-publishes it"
        )
    elif facts.last_status == CREATED_WAIT:
        advice = (
            "created: the workspace is given time to settle before its first poll, "
            "the settle budget untouched"
        )
    elif classify_status(facts.last_status) is StatusClass.CREATION_FAILED:
        advice = "the gateway reported the workspace's creation failed: a new one is created"
    else:
        advice = "waiting for the workspace to be ready"
    return Progress(
        state=facts.state.value,
        reason="deferred" if deferral else None,
        advice=advice,
        step=", ".join(parts),
        deferral=deferral,
        next_hop_at=facts.next_hop_at,
        fails_after=fails_after,
        budget_left=left,
        overdue=overdue,
    )


def _brand_advice(brand: BrandStanding, state: AttemptState, now: datetime) -> str | None:
    """What the brand's own state says, where it overrides the attempt's advice."""
    if not brand.active:
        if brand.bound and brand.emptying_refused:
            return (
                f"the brand is deactivated; the gateway refused to empty its workspace "
                f"({brand.emptying_refused}): it is kept, not retried: fix it upstream, "
                "then `provisioner deactivate BRAND --purge-now`"
            )
        if brand.bound and brand.to_be_emptied_at is not None and brand.to_be_emptied_at > now:
            return (
                f"the brand is deactivated: its workspace is kept until "
                f"{clock(brand.to_be_emptied_at, now)}, then emptied; provision the brand "
                "again before then to keep it"
            )
        if brand.bound:
            return "the brand is deactivated: its workspace is being emptied"
        return (
            "the brand is deactivated and holds no workspace: nothing to do; provision "
            "it again to give it one"
        )
    if state is AttemptState.PROMOTED and not brand.bound:
        return (
            "the brand's workspace was unbound since its attempt (see `provisioner "
            "history`): provision it again to give it another"
        )
    return None


def progress(
    facts: AttemptFacts,
    now: datetime,
    backoff: Backoff,
    brand: BrandStanding | None = None,
    fleet: Fleet | None = None,
) -> Progress:
    """Why the attempt is where it is and what comes next (`backoff`: the settle
    waits, to say when it fails unless confirmed; `brand`, `fleet`: the brand's state
    and the deployment's liveness, where known)."""
    if facts.state is AttemptState.PENDING:
        found = _pending(facts, now, backoff, fleet)
    elif facts.state is AttemptState.FAILED:
        reason, advice = _failure(facts, now)
        found = Progress(state=facts.state.value, reason=reason, advice=advice)
    else:
        found = Progress(state=facts.state.value, reason=None, advice=ENDED[facts.state])
    said = _brand_advice(brand, facts.state, now) if brand is not None else None
    if said is not None:
        found = replace(found, advice=said)
    if facts.parent_allowed is False:
        foreign = (
            f"its parent {facts.parent_id} is not one of PROVISIONER_PARENT_IDS: "
            "a new provision under it is refused"
        )
        advice = foreign if found.advice is None else f"{found.advice}; {foreign}"
        ended_well = facts.state is AttemptState.PROMOTED
        reason = found.reason or (None if ended_well else "foreign_parent")
        found = replace(found, reason=reason, advice=advice)
    return found
