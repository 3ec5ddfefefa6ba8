"""The order of a hop, read off `domain.hop.decide` alone: no store, no gateway.

A walk feeds the decider what each effect would have seen and checks the order
it asks in; the properties check what no order may ever do, over every view and
everything a round may have seen.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from domain import hop as decide
from domain.ownership import Made
from domain.policies import AttemptState, Provenance
from domain.ports import FaultKind, GatewayFault
from domain.steps import Defer, Fail, Promote, Refused, Stand, Wait

NOW = datetime(2026, 1, 1, tzinfo=UTC)
FRESH = decide.HopView(
    hop=0, now=NOW, state=AttemptState.PENDING, expected_hop=0, title="Acme",
    parent_id="parent-1", parents=("parent-1",), candidate_id=None, provenance=None,
    late_created=None, created_ids=(), create_unresolved=False, create_requested_hop=None,
    create_requested_at=None, create_answered=False, deferred_until=None,
    creates_given_up=0, grace_s=60.0,
)  # fmt: skip
BEGUN = decide.Seen(released=True, slot_busy=False)


def walk(view: decide.HopView, answers: dict[type, Any]) -> list[str]:
    """Run the decider as the runner does, each effect answered from `answers` (and the
    view changed as recording it would); the names of what it asked, then its ending."""
    seen, asked = decide.Seen(), []
    for _ in range(decide_limit()):
        step = decide.decide(view, seen)
        asked.append(type(step).__name__)
        answer = answers.get(type(step))
        if isinstance(step, decide.ReleaseOwed):
            seen = replace(seen, released=True)
        elif isinstance(step, decide.ReadSlot):
            seen = replace(seen, slot_busy=bool(answer))
        elif isinstance(step, decide.FindAdoptable):
            seen = replace(seen, eligible=tuple(answer or ()), family_answered=True)
        elif isinstance(step, decide.CreditLostCreates):
            seen = replace(seen, made=answer or Made(), family_answered=True)
        elif isinstance(step, decide.RequestCreate):
            view = replace(view, create_unresolved=True, create_requested_hop=view.hop,
                           create_requested_at=view.now)  # fmt: skip
            seen = replace(seen, creating=True, created=answer)
        elif isinstance(step, decide.RecordCreated | decide.TakeCandidate):
            view = replace(view, candidate_id=step.workspace_id, create_unresolved=False,
                           provenance=getattr(step, "provenance", Provenance.CREATED))  # fmt: skip
        elif isinstance(step, decide.RecordRefusal):
            view = replace(view, create_unresolved=False)
            seen = replace(seen, creating=False, created=None, created_again=True)
        elif isinstance(step, decide.NoteUnconfirmed):
            seen = replace(seen, creating=False, made=None, family_answered=False)
        elif isinstance(step, decide.Poll):
            seen = replace(seen, status=answer)
        else:
            return asked
    raise AssertionError(f"the decider never ended: {asked}")


def decide_limit() -> int:
    from infrastructure.usecases.hop import MAX_EFFECTS

    return MAX_EFFECTS


def test_a_fresh_attempt_reads_the_slot_looks_for_one_to_adopt_creates_then_waits() -> None:
    """What it created is never ready the instant its create returns: the hop does not
    poll it but waits, without spending the settle budget; the next hop polls it."""
    asked = walk(FRESH, {decide.RequestCreate: "ws-1", decide.Poll: "ready"})
    assert asked == ["ReleaseOwed", "ReadSlot", "FindAdoptable", "RequestCreate",
                     "RecordCreated", "Wait"]  # fmt: skip
    created = replace(FRESH, candidate_id="ws-1", provenance=Provenance.CREATED)
    just_made = replace(BEGUN, eligible=(), family_answered=True, creating=True, created="ws-1")
    step = decide.decide(created, just_made)
    assert isinstance(step, Wait), step
    assert not step.spends
    next_hop = replace(created, hop=1, expected_hop=1)
    assert walk(next_hop, {decide.Poll: "ready"}) == ["ReleaseOwed", "Poll", "Promote"]


def test_one_adoptable_workspace_is_taken_and_polled_and_nothing_is_created() -> None:
    asked = walk(FRESH, {decide.FindAdoptable: ["ws-9"], decide.Poll: "provisioning"})
    assert asked == ["ReleaseOwed", "ReadSlot", "FindAdoptable", "TakeCandidate", "Poll", "Wait"]


def test_a_busy_title_slot_waits_before_the_family_is_read() -> None:
    asked = walk(FRESH, {decide.ReadSlot: True})
    assert asked == ["ReleaseOwed", "ReadSlot", "Wait"]


def test_a_create_that_timed_out_is_looked_for_in_the_family_in_the_same_hop() -> None:
    lost = GatewayFault(FaultKind.AMBIGUOUS, "timed out")
    asked = walk(FRESH, {decide.RequestCreate: lost})
    assert asked == ["ReleaseOwed", "ReadSlot", "FindAdoptable", "RequestCreate",
                     "NoteUnconfirmed", "CreditLostCreates", "Wait"]  # fmt: skip


def test_a_create_whose_429_was_waited_out_is_made_again_once_a_round() -> None:
    """Each create sent is on record: the refusal, then the create again; a second
    such 429 in the round ends it refused (deferred), not in a loop."""
    waited = GatewayFault(FaultKind.TRANSIENT, "HTTP 429", retry_after_s=1.0, waited=True)
    asked = walk(FRESH, {decide.RequestCreate: waited})
    assert asked == ["ReleaseOwed", "ReadSlot", "FindAdoptable", "RequestCreate",
                     "RecordRefusal", "RequestCreate", "Refused"]  # fmt: skip


def test_an_unconfirmed_create_is_recovered_before_anything_is_adopted_or_created() -> None:
    view = replace(FRESH, hop=3, expected_hop=3, create_unresolved=True,
                   create_requested_hop=1, create_requested_at=NOW)  # fmt: skip
    found = Made(live=("ws-7",))
    asked = walk(view, {decide.CreditLostCreates: found, decide.Poll: "ready"})
    assert asked == ["ReleaseOwed", "ReadSlot", "CreditLostCreates", "TakeCandidate", "Poll",
                     "Promote"]  # fmt: skip


def test_a_create_that_never_happened_is_given_up_after_its_grace_and_made_again() -> None:
    view = replace(FRESH, hop=3, expected_hop=3, create_unresolved=True, create_requested_hop=1,
                   create_requested_at=NOW - timedelta(seconds=61))  # fmt: skip
    asked = walk(view, {decide.RequestCreate: "ws-2", decide.Poll: "ready"})
    assert asked[:5] == ["ReleaseOwed", "ReadSlot", "CreditLostCreates", "FindAdoptable",
                         "RequestCreate"]  # fmt: skip


def test_a_candidate_is_polled_without_reading_the_slot_or_the_family() -> None:
    view = replace(FRESH, candidate_id="ws-1", provenance=Provenance.CREATED)
    assert walk(view, {decide.Poll: "ready"}) == ["ReleaseOwed", "Poll", "Promote"]


def test_a_late_create_goes_on_record_before_the_gate_and_the_releases() -> None:
    view = replace(FRESH, late_created="ws-1")
    assert decide.decide(view, decide.Seen()) == decide.RecordLate("ws-1")
    placed = decide.Seen(placed_late=True)
    assert isinstance(decide.decide(view, placed), decide.ReleaseOwed)


def test_the_gate_stands_down_before_anything_is_read() -> None:
    stale = replace(FRESH, expected_hop=2)
    assert walk(stale, {}) == ["ReleaseOwed", "Stand"]


# What no order may do, whatever the view and whatever the round has seen.

answers = st.one_of(
    st.none(),
    st.sampled_from(["ready", "provisioning", "creation_failed", "failed", "ws-1", "ws-2"]),
    st.builds(GatewayFault, st.sampled_from(list(FaultKind)), st.just("x")),
    st.just(GatewayFault(FaultKind.TRANSIENT, "HTTP 429", retry_after_s=1.0, waited=True)),
)
views = st.builds(
    replace, st.just(FRESH),
    hop=st.integers(0, 3), expected_hop=st.integers(0, 3),
    state=st.sampled_from(list(AttemptState)),
    candidate_id=st.sampled_from([None, "ws-1"]),
    provenance=st.sampled_from([None, *Provenance]),
    late_created=st.sampled_from([None, "ws-5"]),
    created_ids=st.sampled_from([(), ("ws-1",), ("ws-2",)]),
    create_unresolved=st.booleans(),
    create_requested_hop=st.sampled_from([None, 0, 1]),
    create_requested_at=st.sampled_from([None, NOW, NOW - timedelta(seconds=600)]),
    creates_given_up=st.integers(0, 3),
)  # fmt: skip
seens = st.builds(
    decide.Seen,
    placed_late=st.booleans(), released=st.booleans(),
    slot_busy=st.sampled_from([None, False, True]),
    fault=st.sampled_from([None, GatewayFault(FaultKind.TRANSIENT, "503")]),
    made=st.sampled_from([None, Made(), Made(live=("ws-3",)), Made(unclear=2)]),
    eligible=st.sampled_from([None, (), ("ws-4",), ("ws-4", "ws-6")]),
    known=st.sampled_from([(), ("ws-2",)]), creating=st.booleans(), created=answers,
    create_conflict=st.sampled_from([None, (0, None), (1, "ws-1")]), status=answers,
    created_again=st.booleans(),
)  # fmt: skip
READS_OR_CALLS = (decide.ReadSlot, decide.CreditLostCreates, decide.FindAdoptable,
                  decide.RequestCreate, decide.Poll, decide.TakeCandidate)  # fmt: skip


@given(views, seens)
def test_nothing_is_read_called_or_taken_past_a_gate_that_objects(
    view: decide.HopView, seen: decide.Seen
) -> None:
    step = decide.decide(view, seen)
    objects = decide.gate(view.state, view.expected_hop, view.hop, seen.placed_late)
    if objects is not None and isinstance(step, READS_OR_CALLS):
        raise AssertionError(f"{step} past the gate's {objects}")


@given(views, seens)
def test_a_create_is_asked_only_with_no_candidate_a_free_slot_and_nothing_to_adopt(
    view: decide.HopView, seen: decide.Seen
) -> None:
    step = decide.decide(view, seen)
    if isinstance(step, decide.RequestCreate):
        assert view.candidate_id is None
        assert seen.slot_busy is False
        assert seen.eligible == ()
        assert seen.created is None
        assert not seen.creating
        assert seen.fault is None


@given(views, st.sampled_from([(0, None), (1, "ws-1"), (None, None), (3, None)]))
def test_a_create_whose_save_lost_a_race_ends_the_round_with_nothing_saved(
    view: decide.HopView, conflict: tuple[int | None, str | None]
) -> None:
    """The view then holds the `CreateRequested` whose save failed (its version taken
    in memory, never stored): anything recorded on it would leave a gap in the log
    that no one could load again. Only a stand-down or a fresh round may follow,
    whatever the view says of earlier creates (an exhausted one included)."""
    lost = replace(view, create_unresolved=True, create_requested_hop=view.hop,
                   creates_given_up=2, candidate_id=None, late_created=None)  # fmt: skip
    seen = replace(BEGUN, eligible=(), family_answered=True, creating=True,
                   create_conflict=conflict)  # fmt: skip
    step = decide.decide(lost, seen)
    gate = decide.gate(lost.state, lost.expected_hop, lost.hop, seen.placed_late)
    assert isinstance(step, Stand | decide.Race) or (gate is not None and step == gate), step


@given(views, seens)
def test_only_a_ready_status_of_the_candidate_promotes(
    view: decide.HopView, seen: decide.Seen
) -> None:
    step = decide.decide(view, seen)
    if isinstance(step, Promote):
        assert view.candidate_id is not None
        assert seen.status == "ready"


@given(views, seens)
def test_a_gateway_fault_while_acquiring_ends_the_hop_deferred_waiting_or_failed(
    view: decide.HopView, seen: decide.Seen
) -> None:
    step = decide.decide(view, seen)
    if seen.fault is not None and seen.released and view.late_created is None:
        assert isinstance(step, Stand | Defer | Wait | Fail), step


def test_a_deferral_after_the_family_answered_starts_the_backoff_again() -> None:
    """Only the create went unanswered (throttled): the gateway is up."""
    throttled = GatewayFault(FaultKind.TRANSIENT, "HTTP 429", retry_after_s=2.0)
    listed = replace(BEGUN, eligible=(), family_answered=True)  # nothing to adopt
    assert isinstance(decide.decide(FRESH, listed), decide.RequestCreate)
    creating = replace(FRESH, create_unresolved=True, create_requested_hop=0)
    step = decide.decide(creating, replace(listed, creating=True, created=throttled))
    assert isinstance(step, Refused), step  # a create refused for now: recorded, then deferred
    assert isinstance(step.then, Defer)
    assert step.then.gateway_up
    unanswered = decide.decide(FRESH, replace(BEGUN, fault=throttled))  # the family itself
    assert isinstance(unanswered, Defer)
    assert not unanswered.gateway_up
