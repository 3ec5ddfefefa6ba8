"""Properties of the hop's pure decisions (`domain/hop.py`, `domain/creates.py`,
`domain/policies.py`) for random states and gateway answers, without I/O.

Each decision alone is checked against what it may never do; what our creates are
credited with (`domain.creates`) is checked against an independent model of the
gateway that knows which create made which workspace; then a whole attempt
is walked hop by hop: the decisions are asked as the shell asks them
(`infrastructure/usecases/hop.py`), with the family, the claims and every answer
of the gateway drawn at random, and their steps applied to a `ProvisioningAttempt`
(the aggregate, in memory). Whatever the draws, the decisions never bind or accept
a workspace another brand holds, never release an adopted (or existing)
workspace, never touch the parent, and leave every workspace a create made bound,
kept as the candidate, owed, or released.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import event, example, given, note, settings
from hypothesis import strategies as st

from domain import hop as decide
from domain.attempt import ProvisioningAttempt
from domain.creates import (
    Made,
    create_answered,
    created_again,
    created_is_claimed,
    created_takes_candidate,
    made_by_our_creates,
    recover,
)
from domain.hop import Failed, Failure
from domain.policies import (
    AttemptState,
    Backoff,
    Deferral,
    FailureReason,
    Provenance,
    StatusClass,
    adoption_shortlist,
    classify_status,
    owed_releases,
    same_title,
)
from domain.ports import FamilyMember
from tests.strategies import (
    BRAND,
    PARENT,
    TITLE,
    Member,
    World,
    failures,
    scaled,
    statuses,
    worlds,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GRACE_S = 60.0
BACKOFF = Backoff(5.0, 3)
DEFERRAL = Deferral(2.0, 30.0, 600.0)  # a short deadline: a walk of deferrals ends


def family(world: World) -> list[FamilyMember]:
    parent = FamilyMember(PARENT, world.parent_title, world.parent_status)
    return [parent, *(FamilyMember(m.id, m.title, m.status) for m in world.members)]


def eligible(world: World) -> list[str]:
    """The adoption shortlist as the shell filters it: not another brand's, empty."""
    return [
        m.id
        for m in adoption_shortlist(family(world), TITLE, PARENT)
        if not world.held_by_other(m.id) and _member(world, m.id).projects == 0
    ]


def _member(world: World, workspace_id: str) -> Member:
    found = world.member(workspace_id)
    assert found is not None, workspace_id
    return found


# Each decision alone.


@given(world=worlds())
def test_adoption_takes_only_a_ready_empty_same_title_child_no_other_brand_holds(
    world: World,
) -> None:
    step = decide.adopt_or_create(eligible(world), TITLE)
    if isinstance(step, decide.Accept):
        taken = _member(world, step.workspace_id)
        assert step.workspace_id != PARENT
        assert step.provenance is Provenance.ADOPTED
        assert not world.held_by_other(taken.id)
        assert taken.title == TITLE
        assert taken.projects == 0
        assert classify_status(taken.status) is StatusClass.READY
    elif isinstance(step, decide.Create):
        assert eligible(world) == []


@dataclass
class Upstream:
    """An independent model of what the family shows after our creates: which create
    made which workspace. Other brands' creates and our brand's other attempts' are
    on record as theirs (their claims, their created ids) by the time the rule looks:
    while one is in flight the title slot keeps the rule from looking (`slot_gate`).
    """

    attempt: ProvisioningAttempt
    family: list[FamilyMember] = field(default_factory=list)
    hidden: list[FamilyMember] = field(default_factory=list)  # made, not listed yet
    ours: set[str] = field(default_factory=set)  # what our creates made
    taken: set[str] = field(default_factory=set)  # what others' creates made
    hop: int = 0

    def make(self, status: str, *, late: bool = False) -> str:
        workspace_id = f"ws-{len(self.family) + len(self.hidden) + 1}"
        (self.hidden if late else self.family).append(FamilyMember(workspace_id, TITLE, status))
        return workspace_id

    def create(self, what: str, status: str) -> None:
        """One create of our attempt: answered, lost (made or not, listed or later), refused."""
        attempt = self.attempt
        self.hop += 1
        known = [m.id for m in same_title(self.family, TITLE, PARENT)]
        attempt.request_create(self.hop, known, NOW)
        if what == "refused":
            attempt.record_create_refused(self.hop, "409")
        elif what != "none":
            workspace_id = self.make(status, late=what == "late")
            self.ours.add(workspace_id)
            if what == "ok":
                attempt.record_created(workspace_id, self.hop)

    def credit(self) -> Made:
        """The rule, as the use cases ask it; what it credits is then on record."""
        attempt = self.attempt
        made = made_by_our_creates(self.family, TITLE, PARENT, attempt.creates, self.taken)
        if made.unclear == 0 or made.shells:  # what the hop and the orphan search record
            for workspace_id in made.ours:
                attempt.record_created(workspace_id, self.hop)
        return made


STEPS = ["ok", "lost", "late", "none", "refused", "theirs", "before", "reveal", "adopt", "look"]


@settings(max_examples=scaled(3))
@given(steps=st.lists(st.tuples(st.sampled_from(STEPS), statuses()), max_size=12))
def test_our_creates_are_credited_with_what_they_made_and_never_with_anothers(
    steps: list[tuple[str, str]],
) -> None:
    attempt = ProvisioningAttempt.start(BRAND, TITLE, PARENT, None, BACKOFF.max_requeues)
    up = Upstream(attempt, [FamilyMember(PARENT, TITLE, "ready")])
    for what, status in [*steps, ("look", "")]:
        on_record = set(attempt.created_ids)
        if what in ("ok", "lost", "late", "none", "refused") and attempt.candidate_id is None:
            up.create(what, status)
        elif what == "theirs":  # another brand's create, or another attempt's, on record
            up.taken.add(up.make(status))
        elif what == "before" and not attempt.create_unresolved and not attempt.create_lost:
            up.make(status)  # there before any create that counts: in the baseline
        elif what == "reveal":
            up.family += up.hidden
            up.hidden.clear()
        elif what == "adopt" and attempt.create_unresolved and attempt.candidate_id is None:
            attempt.accept_candidate(up.make("ready"), Provenance.ADOPTED, up.hop)
        elif what == "look" and attempt.orphan_search:  # when the hop or the search asks
            made = up.credit()
            note(f"{[(m.id, m.status) for m in up.family]} {attempt.creates} -> {made}")
            listed = {m.id for m in up.family}
            # Only what our creates made, never what was on record before.
            assert set(made.ours) <= up.ours - on_record
            unrecorded = (up.ours & listed) - on_record
            live = {ws for ws in unrecorded if not _terminal(up, ws)}
            if made.unclear == 0:  # all of it, when it can tell
                assert set(made.ours) == unrecorded
            else:  # it cannot tell several live ones apart, or several shells of one create
                assert made.live == ()
                assert made.unclear == (len(live) if len(live) > 1 else len(unrecorded))
            event(f"credited {len(made.ours)}, unclear {made.unclear > 0}")
        for workspace_id in attempt.created_ids:
            assert workspace_id in up.ours, f"{workspace_id} is on record; not ours"


def _terminal(up: Upstream, workspace_id: str) -> bool:
    return any(m.id == workspace_id and classify_status(m.status).is_terminal for m in up.family)


@given(answer=st.one_of(st.sampled_from(["", PARENT, "ws-9"]), st.text(max_size=8), failures()))
@example(answer=PARENT)
def test_a_create_answer_is_recorded_only_as_the_id_it_names_never_the_parent(
    answer: str | Failed,
) -> None:
    step = create_answered(answer, PARENT)
    if isinstance(step, decide.Record):
        assert step.workspace_id == answer
        assert step.workspace_id not in ("", PARENT)
    else:
        assert not isinstance(step, decide.Accept | decide.Promote)
    if answer in ("", PARENT):
        assert isinstance(step, decide.Fail)
        assert step.reason is FailureReason.GATEWAY_BUG


@given(
    answer=st.one_of(statuses(), failures()),
    provenance=st.sampled_from([*Provenance, None]),
)
def test_only_a_ready_status_promotes_and_only_a_bound_workspace_is_unbound(
    answer: str | Failed, provenance: Provenance | None
) -> None:
    step = decide.status_answered(answer, provenance, "ws-1")
    ready = isinstance(answer, str) and classify_status(answer) is StatusClass.READY
    assert isinstance(step, decide.Promote) == ready
    if isinstance(step, decide.DropExisting):
        assert provenance is Provenance.EXISTING
    if isinstance(step, decide.DropCandidate):
        assert provenance is not Provenance.EXISTING


@given(
    created=st.lists(st.sampled_from(["ws-1", "ws-2", "ws-3"]), unique=True),
    released=st.lists(st.sampled_from(["ws-1", "ws-2", "ws-3"]), unique=True),
    candidate=st.sampled_from([None, "ws-1", "ws-2", "ws-adopted"]),
    state=st.sampled_from(list(AttemptState)),
    reason=st.sampled_from([None, *FailureReason]),
)
def test_what_is_owed_is_only_what_our_creates_made_and_never_the_kept_candidate(
    created: list[str],
    released: list[str],
    candidate: str | None,
    state: AttemptState,
    reason: FailureReason | None,
) -> None:
    owed = owed_releases(created, released, candidate, state, reason)
    assert set(owed) <= set(created) - set(released)
    if state in (AttemptState.PENDING, AttemptState.PROMOTED):
        assert candidate not in owed
    kept = set(created) - set(released) - set(owed)
    assert kept <= {candidate}


# A whole attempt, hop by hop.


@dataclass
class Walk:
    """One attempt walked through the decisions, and what the gateway did."""

    world: World
    attempt: ProvisioningAttempt
    bound: str | None = None  # the brand's workspace
    made: list[str] = field(default_factory=list)  # what the gateway's creates made
    adopted: set[str] = field(default_factory=set)  # adopted or existing: never released
    released: list[str] = field(default_factory=list)  # emptied by the attempt's releases
    counter: int = 100

    def fresh(self, status: str) -> str:
        self.counter += 1
        workspace_id = f"ws-{self.counter}"
        self.world.members.append(Member(workspace_id, TITLE, status))
        self.made.append(workspace_id)
        return workspace_id


def _take(walk: Walk, workspace_id: str) -> None:
    """The claim goes to our brand: never a workspace another brand holds, never the parent."""
    assert workspace_id != PARENT, "the parent was taken"
    assert not walk.world.held_by_other(workspace_id), f"{workspace_id} is another brand's"
    _member(walk.world, workspace_id).holder = BRAND


def _give_back(walk: Walk, workspace_id: str) -> None:
    member = walk.world.member(workspace_id)
    if member is not None and member.holder == BRAND:
        member.holder = None


def _release_owed(walk: Walk) -> None:
    attempt = walk.attempt
    for workspace_id in attempt.owed_releases:
        assert workspace_id not in walk.adopted, f"adopted {workspace_id} is released"
        assert workspace_id != PARENT, "the parent is released"
        assert not walk.world.held_by_other(workspace_id), f"{workspace_id} is another brand's"
        attempt.record_release(workspace_id, 0)
        walk.released.append(workspace_id)
        _give_back(walk, workspace_id)


def _end(
    walk: Walk, step: decide.Wait | decide.Defer | decide.Fail, hop: int, now: datetime
) -> None:
    attempt = walk.attempt
    ending: decide.Schedule | decide.Fail
    if isinstance(step, decide.Wait):
        ending = decide.schedule_or_exhaust(
            hop, attempt.max_hop, BACKOFF, now, step.status, settled=attempt.settle_hops,
            spends=step.spends,
        )  # fmt: skip
    elif isinstance(step, decide.Defer):
        ending = decide.defer_or_expire(
            hop, step, in_row=attempt.deferred_in_row, unavailable_since=attempt.unavailable_since,
            deadline_at=NOW + timedelta(seconds=DEFERRAL.deadline_s), now=now,
            deferral=DEFERRAL, jitter=0.5,
        )  # fmt: skip
    else:
        ending = step
    note(f"hop {hop}: {ending}")
    if isinstance(ending, decide.Schedule):
        settled = attempt.settle_hops
        attempt.schedule_hop(ending.hop, ending.not_before, ending.status,
                             deferred=ending.deferred, spends=ending.spends)  # fmt: skip
        # A deferral never spends the settle budget, nor does an unconfirmed create's
        # grace; a settle wait spends one hop of it.
        assert attempt.settle_hops == settled + (1 if ending.spends else 0)
        return
    if ending.reason is FailureReason.EXHAUSTED:
        assert attempt.settle_hops == attempt.max_hop, "exhausted with settle hops left"
    if ending.reason is FailureReason.DEADLINE:
        assert now >= NOW + timedelta(seconds=DEFERRAL.deadline_s), "failed before its deadline"
    attempt.fail(ending.reason, ending.message, hop)
    if attempt.provenance is Provenance.ADOPTED and attempt.candidate_id:
        _give_back(walk, attempt.candidate_id)
    _release_owed(walk)


def _accept(walk: Walk, workspace_id: str, provenance: Provenance, hop: int) -> None:
    _take(walk, workspace_id)
    walk.attempt.accept_candidate(workspace_id, provenance, hop)
    if provenance is Provenance.ADOPTED:
        walk.adopted.add(workspace_id)


def _recover(walk: Walk, data: st.DataObject, hop: int, now: datetime) -> bool:
    """The unconfirmed create: True when a candidate was found (poll next)."""
    attempt = walk.attempt
    waited = data.draw(st.sampled_from([0.0, 30.0, 61.0, 600.0]), label="waited_s")
    taken = {m.id for m in walk.world.members if walk.world.held_by_other(m.id)}
    made = made_by_our_creates(family(walk.world), TITLE, PARENT, attempt.creates, taken)
    step = recover(made, TITLE, requested_hop=attempt.create_requested_hop, hop=hop,
                   waited_s=waited, grace_s=GRACE_S)  # fmt: skip
    if isinstance(step, decide.Accept):
        _accept(walk, step.workspace_id, step.provenance, hop)
        for workspace_id in made.ours:  # the rest: surplus, owed a release
            attempt.record_created(workspace_id, hop)
        return True
    if isinstance(step, decide.Proceed):
        return _adopt_or_create(walk, data, hop, now)
    _end(walk, step, hop, now)
    return False


def _adopt_or_create(walk: Walk, data: st.DataObject, hop: int, now: datetime) -> bool:
    attempt, world = walk.attempt, walk.world
    step = decide.adopt_or_create(eligible(world), TITLE)
    if isinstance(step, decide.Accept):
        _accept(walk, step.workspace_id, step.provenance, hop)
        return True
    if isinstance(step, decide.Fail):
        _end(walk, step, hop, now)
        return False
    known = [m.id for m in same_title(family(world), TITLE, PARENT)]
    attempt.request_create(hop, known, now)
    kind = data.draw(
        st.sampled_from(["made", "made", "lost", "none", "parent", "noid", "other's", "failed"]),
        label="create",
    )
    status = data.draw(statuses(), label="status of what it made")
    answer: str | Failed
    if kind == "made":
        answer = walk.fresh(status)
    elif kind in ("lost", "none"):
        if kind == "lost":
            walk.fresh(status)
        answer = Failed(Failure.AMBIGUOUS, "timed out")
    elif kind == "parent":
        answer = PARENT
    elif kind == "noid":
        answer = ""
    elif kind == "other's":  # a gateway bug: an id it already gave someone
        answer = data.draw(st.sampled_from([m.id for m in world.members] or [PARENT]))
    else:
        answer = data.draw(failures().filter(lambda f: f.kind is not Failure.AMBIGUOUS))
    answered = create_answered(answer, PARENT)
    note(f"hop {hop}: create {kind} -> {answered}")
    if isinstance(answered, decide.Record):
        workspace_id = answered.workspace_id
        if workspace_id in (*known, *attempt.created_ids):
            _end(walk, created_again(workspace_id), hop, now)
            return False
        if world.held_by_other(workspace_id):
            _end(walk, created_is_claimed(f"{workspace_id} is held"), hop, now)
            return False
        takes = created_takes_candidate(attempt.candidate_id, attempt.state)
        if world.member(workspace_id) is None:  # an id the family does not show
            world.members.append(Member(workspace_id, TITLE, status))
        if takes:
            _take(walk, workspace_id)
        attempt.record_created(workspace_id, hop)
        return takes
    if isinstance(answered, decide.Recover):
        return _recover(walk, data, hop, now)
    if isinstance(answered, decide.Refused):
        attempt.record_create_refused(hop, answered.detail)
        _end(walk, answered.then, hop, now)
        return False
    assert isinstance(answered, decide.Fail | decide.Wait | decide.Defer), answered
    _end(walk, answered, hop, now)
    return False


def _poll(walk: Walk, data: st.DataObject, hop: int, now: datetime) -> None:
    attempt = walk.attempt
    workspace_id = attempt.candidate_id
    assert workspace_id is not None
    answer = data.draw(st.one_of(statuses(), failures()), label="status")
    step = decide.status_answered(answer, attempt.provenance, workspace_id)
    note(f"hop {hop}: status {answer!r} -> {step}")
    if isinstance(step, decide.Promote):
        _take(walk, workspace_id)  # the claim names us: bound to nobody else
        attempt.promote(hop)
        walk.bound = workspace_id
    elif isinstance(step, decide.DropExisting):
        assert walk.bound == workspace_id
        walk.bound = None
        _give_back(walk, workspace_id)
        attempt.drop_candidate(step.raw, hop)
        _end(walk, decide.drop_existing_status(step.raw), hop, now)
    elif isinstance(step, decide.DropCandidate):
        if attempt.provenance is Provenance.ADOPTED:
            _give_back(walk, workspace_id)
        attempt.drop_candidate(step.raw, hop)
        _end(walk, decide.drop_candidate_status(step.raw), hop, now)
    else:
        _end(walk, step, hop, now)


def _check(walk: Walk) -> None:
    attempt = walk.attempt
    assert PARENT not in (walk.bound, attempt.candidate_id, *attempt.created_ids)
    assert PARENT not in walk.released
    for workspace_id in attempt.owed_releases:
        assert workspace_id not in walk.adopted, f"adopted {workspace_id} is owed a release"
    for workspace_id in attempt.created_ids:
        kept = workspace_id == attempt.candidate_id and (
            attempt.state in (AttemptState.PENDING, AttemptState.PROMOTED)
            or attempt.failure_reason is FailureReason.TERMINAL_STATUS
        )
        bound = workspace_id == walk.bound
        owed = workspace_id in attempt.owed_releases
        released = workspace_id in attempt.released_ids
        assert kept or bound or owed or released, f"{workspace_id} is left behind"
    for workspace_id in walk.made:  # on record, or still looked for (the orphan search)
        assert workspace_id in attempt.created_ids or attempt.orphan_search, workspace_id


@settings(max_examples=scaled(5))
@given(world=worlds(), data=st.data())
def test_a_walk_of_hops_never_takes_anothers_nor_releases_an_adopted_nor_leaves_a_create(
    world: World, data: st.DataObject
) -> None:
    ours = [m.id for m in world.members if m.holder == BRAND and m.title == TITLE]
    existing = data.draw(st.sampled_from([None, *ours]), label="bound workspace")
    attempt = ProvisioningAttempt.start(BRAND, TITLE, PARENT, existing, BACKOFF.max_requeues)
    walk = Walk(world, attempt, bound=existing, adopted={existing} if existing else set())
    now = NOW
    while not attempt.is_terminal:
        hop = attempt.expected_hop
        for stale in (hop - 1, hop + 1):  # a duplicate or early delivery changes nothing
            gate = decide.gate(attempt.state, attempt.expected_hop, stale, False)
            assert stale < 0 or isinstance(gate, decide.Stand)
        assert isinstance(decide.gate(attempt.state, hop, hop, False), decide.Proceed)
        _release_owed(walk)
        if attempt.candidate_id is not None:
            _poll(walk, data, hop, now)
        elif attempt.create_unresolved:
            if _recover(walk, data, hop, now):
                _poll(walk, data, hop, now)
        elif _adopt_or_create(walk, data, hop, now):
            _poll(walk, data, hop, now)
        _check(walk)
        if attempt.not_before is not None:
            now = max(now, attempt.not_before)
    _release_owed(walk)
    _check(walk)
    event(f"ended {attempt.state.value} {attempt.failure_reason or ''}".strip())
    event(f"created {len(attempt.created_ids)}, released {len(attempt.released_ids)}")
    gate = decide.gate(attempt.state, attempt.expected_hop, attempt.expected_hop, False)
    assert isinstance(gate, decide.Stand)  # an ended attempt is never acted on again
    if walk.bound is not None and attempt.state is AttemptState.PROMOTED:
        assert walk.bound == attempt.candidate_id
