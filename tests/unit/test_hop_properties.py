"""Properties of the hop's pure decisions (`domain/hop.py`, `domain/creates.py`,
`domain/policies.py`) for random states and gateway answers, without I/O.

Each decision alone is checked against what it may never do. What our creates are
credited with (`domain.creates`) is checked against an independent model of the
gateway that knows which create made which workspace. Then a whole attempt is
walked hop by hop as the service runs it (`HopRun` on the memory event store and
`MemoryGateway`), with the family, the claims and every answer of the gateway
drawn at random. Whatever the draws, a hop never binds or takes a workspace
another brand holds, never empties one our creates did not make (an adopted one,
the parent), and leaves every workspace a create made on record, bound or
released, or still looked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import uuid4

from hypothesis import event, example, given, note, settings
from hypothesis import strategies as st

from domain import hop as decide
from domain import steps
from domain.attempt import ProvisioningAttempt
from domain.claim import WorkspaceClaim
from domain.creates import create_answered
from domain.ownership import Facts, Made, Owner, credit, judge, same_title
from domain.policies import (
    AttemptState,
    FailureReason,
    Provenance,
    StatusClass,
    classify_status,
    owed_releases,
)
from domain.ports import (
    FamilyMember,
    GatewayFault,
    MalformedAnswer,
    RequestRejected,
    TransientGatewayError,
    Unauthorized,
    WorkspaceGone,
)
from domain.waits import Backoff, Deferral
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import open_event_store
from tests.memory_gateway import MemoryGateway
from tests.strategies import (
    BRAND,
    OTHER_BRANDS,
    PARENT,
    TITLE,
    Member,
    World,
    failures,
    scaled,
    statuses,
    worlds,
)
from tests.support import ManualClock

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GRACE_S = 60.0
BACKOFF = Backoff(5.0, 3)
# A short deadline: a walk of deferrals ends.
DEFERRAL = Deferral(2.0, max_s=30.0, deadline_s=600.0, retry_after_max_s=300.0)


def family(world: World) -> list[FamilyMember]:
    parent = FamilyMember(PARENT, world.parent_title, world.parent_status)
    return [parent, *(FamilyMember(m.id, m.title, m.status) for m in world.members)]


def eligible(world: World) -> list[str]:
    """What ownership calls adoptable, as the shell asks it: not another brand's, empty."""
    return [
        m.id
        for m in same_title(family(world), TITLE, PARENT)
        if not world.held_by_other(m.id)
        and judge(Facts(m.id, (PARENT,), same_title=True, status=m.status,
                        projects=_member(world, m.id).projects)).owner is Owner.ADOPTABLE
    ]  # fmt: skip


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
    if isinstance(step, steps.Accept):
        taken = _member(world, step.workspace_id)
        assert step.workspace_id != PARENT
        assert step.provenance is Provenance.ADOPTED
        assert not world.held_by_other(taken.id)
        assert taken.title == TITLE
        assert taken.projects == 0
        assert classify_status(taken.status) is StatusClass.READY
    elif isinstance(step, steps.Create):
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
        taken = dict.fromkeys(self.taken, "another's create")
        projects: dict[str, int | None] = {m.id: 0 for m in self.family}  # as a create leaves it
        made = credit(self.family, TITLE, PARENT, attempt.creates, taken=taken, projects=projects)
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
    answer: str | GatewayFault,
) -> None:
    step = create_answered(answer, PARENT)
    if isinstance(step, steps.Record):
        assert step.workspace_id == answer
        assert step.workspace_id not in ("", PARENT)
    else:
        assert not isinstance(step, steps.Accept | steps.Promote)
    if answer in ("", PARENT):
        assert isinstance(step, steps.Fail)
        assert step.reason is FailureReason.GATEWAY_BUG


@given(
    answer=st.one_of(statuses(), failures()),
    provenance=st.sampled_from([*Provenance, None]),
)
def test_only_a_ready_status_promotes_and_only_a_bound_workspace_is_unbound(
    answer: str | GatewayFault, provenance: Provenance | None
) -> None:
    step = decide.status_answered(answer, provenance, "ws-1")
    ready = isinstance(answer, str) and classify_status(answer) is StatusClass.READY
    assert isinstance(step, steps.Promote) == ready
    if isinstance(step, steps.DropExisting):
        assert provenance is Provenance.EXISTING
    if isinstance(step, steps.DropCandidate):
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


# A whole attempt, hop by hop, as the service runs it.

ERRORS = {
    "429": lambda: TransientGatewayError("429 too many requests"),
    "401": lambda: Unauthorized("401"),
    "409": lambda: RequestRejected("409 quota"),
    "garbled": lambda: MalformedAnswer("not JSON"),
    "404": lambda: WorkspaceGone("404"),
}
# What a create does, and how often: made, lost, late; bugs; refusals.
CREATES = [*["ok", "lost"] * 3, "none", "late", "late", "lost5xx", "none5xx", "parent", "noid",
           "echo", "429", "409"]  # fmt: skip


def _world_on(gateway: MemoryGateway, service: ProvisioningService, world: World) -> set[str]:
    """The world's family upstream and its claims on record: what other brands hold."""
    parent = gateway.workspaces[PARENT]
    parent.title, parent.statuses, parent.projects = (
        world.parent_title, [world.parent_status], ["parent-project"],
    )  # fmt: skip
    theirs = set()
    for member in world.members:
        workspace_id = gateway.add(PARENT, member.title, member.status, projects=member.projects)
        holder = member.holder if member.holder not in (None, BRAND) else None
        if holder is None and not member.releasing:
            continue
        claim, by = WorkspaceClaim.open(workspace_id), uuid4()
        if holder is not None:
            claim.claim(holder, by)
        if member.releasing:
            claim.begin_release(holder or OTHER_BRANDS[0], by)
        service.app.save(claim)
        theirs.add(workspace_id)
    return theirs


def _script(gateway: MemoryGateway, data: st.DataObject) -> None:
    """What the gateway does in the next hop: its create, its statuses, its faults."""
    what = data.draw(st.sampled_from(CREATES), label="create")
    gateway.creates = [ERRORS[what]() if what in ERRORS else what]
    gateway.new_statuses = data.draw(st.lists(statuses(), min_size=1, max_size=3), label="made")
    for method in ("status", "family", "list_projects"):
        fault = data.draw(st.sampled_from([None] * 12 + [*ERRORS]), label=method)
        gateway.fail[method] = [ERRORS[fault]()] if fault else []


@settings(max_examples=scaled(5))
@given(world=worlds(), data=st.data())
def test_a_walk_of_hops_never_takes_anothers_nor_empties_what_we_did_not_make(
    world: World, data: st.DataObject
) -> None:
    gateway, clock = MemoryGateway(PARENT), ManualClock()
    engine = EngineSettings(backoff=BACKOFF, deferral=DEFERRAL, create_grace_s=GRACE_S)
    service = ProvisioningService(open_event_store("memory://"), gateway, clock, engine)
    theirs = _world_on(gateway, service, world)
    attempt_id = service.request_provisioning(BRAND, TITLE, PARENT)
    for _ in range(40):
        attempt = service.attempt(attempt_id)
        if attempt.is_terminal:
            break
        _script(gateway, data)
        outcome = service.run_hop(attempt_id, attempt.expected_hop)
        note(f"hop {outcome.hop}: {outcome.outcome.value} {outcome.detail}")
        gateway.creates.clear()
        gateway.fail.clear()
        again = service.run_hop(attempt_id, outcome.hop)  # a duplicate changes nothing
        assert again.stand_down is not None, again
        if data.draw(st.booleans(), label="reveal"):
            gateway.reveal()
        clock.advance((outcome.delay_s or 0.0) + data.draw(st.sampled_from([0.0, GRACE_S + 1])))
    else:
        service.expire(attempt_id, clock.now())  # the reconciler's backstop
    service.release(attempt_id)
    attempt = service.attempt(attempt_id)
    event(f"ended {attempt.state.value} {attempt.failure_reason or ''}".strip())
    event(f"created {len(attempt.created_ids)}, released {len(attempt.released_ids)}")
    bound = service.brand(BRAND).workspace_id
    for workspace_id in theirs:  # another brand's claim is never taken, nor bound
        assert workspace_id not in (bound, attempt.candidate_id, *attempt.created_ids)
        claim = service.claim(workspace_id)
        assert claim is not None, workspace_id
        assert claim.brand_id != BRAND, workspace_id
    # Only what our creates made is emptied (or what a buggy create answered: believed).
    assert {ws for ws, _ in gateway.deleted} <= {*gateway.made, *gateway.echoed}
    assert gateway.workspaces[PARENT].projects == ["parent-project"]
    assert service.claim(PARENT) is None
    assert PARENT not in (bound, attempt.candidate_id, *attempt.created_ids)
    assert attempt.owed_releases == (), "released: nothing left owed"
    for workspace_id in gateway.made:  # on record, or still looked for (the orphan search)
        assert workspace_id in attempt.created_ids or attempt.orphan_search, workspace_id
    assert attempt.settle_hops <= attempt.max_hop
    if attempt.state is AttemptState.PROMOTED:
        assert bound == attempt.candidate_id
