"""The fake gateway's family listing and same-title check, kept per parent instead
of scanned over every workspace: the listing is always the one the scan gives
(the same bytes), whatever was created, seeded, polled, re-cased or reset (no HTTP;
tests/integration/test_fake_gateway.py serves them)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infrastructure.fake_gateway.config import FakeConfig
from infrastructure.fake_gateway.replies import NotFoundError, RawJson, Request
from infrastructure.fake_gateway.state import FakeState

PARENT, OTHER = "org-parent", "org-other"
CASES = {"lower": str, "upper": str.upper, "title": str.title}  # "lower": as stored


def fake(**knobs: Any) -> FakeState:
    return FakeState(FakeConfig(**knobs), [PARENT, OTHER], id_prefix="")


def create(state: FakeState, title: str, parent: str = PARENT) -> str:
    body = json.dumps({"title": title}).encode()
    request = Request("POST", f"/v2/workspaces/{parent}/child", {}, "Bearer t", body)
    reply = state.create(request, (parent,))
    assert reply.status == 200
    assert isinstance(reply.body, dict)
    made: str = reply.body["id"]
    return made


def poll(state: FakeState, workspace_id: str) -> str:
    request = Request("GET", f"/v1/workspaces/{workspace_id}/status", {}, "Bearer t", b"")
    body = state.status(request, (workspace_id,)).body
    assert isinstance(body, dict)
    answer: str = body["status"]
    return answer


def listing(state: FakeState, parent: str = PARENT) -> bytes:
    request = Request("GET", f"/v1/workspaces/{parent}/family", {}, "Bearer t", b"")
    reply = state.family(request, (parent,))
    assert reply.status == 200
    assert isinstance(reply.body, RawJson)
    return reply.body.data


def scanned(state: FakeState, parent: str = PARENT) -> bytes:
    """The listing as the scan over every workspace gives it, encoded as the server
    encodes a reply body (the state document shows each status as a poll would)."""
    recase = CASES[state.config.status_case]
    shown = state.snapshot()["workspaces"]
    members = [next(ws for ws in shown if ws["id"] == parent)]
    members += [ws for ws in shown if ws["parent"] == parent]
    entries = [
        {"id": ws["id"], "title": ws["title"], "status": recase(ws["status"])} for ws in members
    ]
    return json.dumps(entries, separators=(",", ":")).encode()


def assert_listed_as_scanned(state: FakeState, parent: str = PARENT) -> list[Any]:
    listed = listing(state, parent)
    expected = scanned(state, parent)
    assert json.loads(listed) == json.loads(expected)
    assert listed == expected
    answer: list[Any] = json.loads(listed)
    return answer


def statuses(state: FakeState, parent: str = PARENT) -> list[str]:
    return [member["status"] for member in assert_listed_as_scanned(state, parent)]


def test_a_parent_without_children_lists_itself_alone() -> None:
    state = fake()
    assert assert_listed_as_scanned(state) == [
        {"id": PARENT, "title": f"Organisation {PARENT}", "status": "active"}
    ]


def test_creates_and_seeds_are_listed_in_the_order_made_under_their_own_parent() -> None:
    state = fake(settle_polls=1)
    made = [create(state, "A")]
    made.append(state.seed_workspace("Seeded", PARENT, "created", 1)["id"])
    assert_listed_as_scanned(state)  # entries encoded: later additions must follow them
    seeded = state.seed_workspaces("Many", PARENT, "failed", 0, 500)
    made.append(create(state, "B"))
    create(state, "Elsewhere", OTHER)
    state.seed_workspace("Top", None, "active", 0)
    made.append(state.seed_workspace("Seeded", PARENT, "created", 0)["id"])

    members = assert_listed_as_scanned(state)
    ids = [member["id"] for member in members]
    assert ids[:3] == [PARENT, made[0], made[1]]
    assert (ids[3], ids[502]) == (seeded["first"], seeded["last"])
    assert ids[503:] == made[2:]
    assert [member["title"] for member in assert_listed_as_scanned(state, OTHER)] == [
        f"Organisation {OTHER}",
        "Elsewhere",
    ]


def test_a_child_lists_its_own_children() -> None:
    state = fake()
    child = create(state, "A")
    grandchild = create(state, "B", child)
    assert [m["id"] for m in assert_listed_as_scanned(state, child)] == [child, grandchild]
    assert [m["id"] for m in assert_listed_as_scanned(state)] == [PARENT, child]


def test_an_unknown_parent_is_not_found() -> None:
    with pytest.raises(NotFoundError, match="nope"):
        listing(fake(), "nope")


def test_statuses_settle_with_polls_and_time_as_a_poll_would_answer() -> None:
    state = fake(settle_polls=2, settle_s=60.0)
    state.seed_workspaces("Many", PARENT, "created", 0, 50)
    slow, quick = create(state, "Slow"), create(state, "Quick")
    assert statuses(state)[-2:] == ["not ready", "not ready"]
    assert [poll(state, quick), poll(state, quick)] == ["not ready", "not ready"]
    assert statuses(state)[-2:] == ["not ready", "not ready"]  # not 60 s old yet
    state.workspaces[quick].born -= 61.0
    assert statuses(state)[-2:] == ["not ready", "created"]
    state.workspaces[slow].born -= 61.0
    poll(state, slow)
    assert statuses(state)[-2:] == ["not ready", "created"]
    poll(state, slow)
    assert statuses(state)[-2:] == ["created", "created"]
    assert listing(state) is listing(state)  # nothing changed: nothing encoded again


def test_a_listing_settles_a_child_as_a_peek_did() -> None:
    """A listing that finds a child due settles it: it stays settled even if the
    knobs then ask for more polls, as when every child was peeked at."""
    state = fake(settle_polls=1)
    child = create(state, "A")
    poll(state, child)
    assert statuses(state)[-1] == "created"
    state.configure({"settle_polls": 5})
    assert statuses(state)[-1] == "created"
    assert poll(state, child) == "created"


def test_scripted_fates_and_a_fixed_status_set_later_are_listed() -> None:
    state = fake()
    state.script("Z", "zombie")
    state.script("F", "creation_failed")
    zombie, failed, seeded = create(state, "Z"), create(state, "F"), create(state, "S")
    assert statuses(state) == ["active", "not ready", "creation_failed", "created"]
    # A test may break a workspace by hand (tests/integration/test_brand_status.py).
    state.workspaces[seeded].fixed_status = "failed"
    state.workspaces[zombie].fixed_status = "error"
    assert statuses(state) == ["active", "error", "creation_failed", "failed"]
    state.workspaces[zombie].fixed_status = None
    assert statuses(state) == ["active", "not ready", "creation_failed", "failed"]
    assert poll(state, failed) == "creation_failed"


def test_a_fixed_status_changed_among_many_seeded_is_listed() -> None:
    state = fake()
    seeded = state.seed_workspaces("Many", PARENT, "created", 0, 1000)
    assert set(statuses(state)[1:]) == {"created"}
    state.workspaces[seeded["last"]].fixed_status = "invalid subscription"
    assert statuses(state)[-1] == "invalid subscription"
    state.workspaces[PARENT].fixed_status = "suspended"  # the children as they were
    assert statuses(state)[0] == "suspended"


@pytest.mark.parametrize("case", ["upper", "title", "lower"])
def test_statuses_are_recased_as_configured_and_back(case: str) -> None:
    state = fake(settle_polls=1)
    state.seed_workspaces("Many", PARENT, "invalid subscription", 0, 20)
    state.seed_workspace("Mixed", PARENT, "On Hold", 0)  # re-cased, never lowered
    child = create(state, "A")
    assert_listed_as_scanned(state)
    state.configure({"status_case": case})
    assert statuses(state)[-1] == CASES[case]("not ready")
    poll(state, child)
    expected = [CASES[case](status) for status in ("invalid subscription", "On Hold", "created")]
    assert statuses(state)[-3:] == expected
    state.configure({"status_case": "lower"})
    assert statuses(state)[-3:] == ["invalid subscription", "On Hold", "created"]


def test_reset_lists_the_parents_alone_then_what_comes_after() -> None:
    state = fake()
    state.seed_workspaces("Many", PARENT, "created", 0, 100)
    create(state, "A", OTHER)
    assert len(assert_listed_as_scanned(state)) == 101
    state.reset()
    assert [m["id"] for m in assert_listed_as_scanned(state)] == [PARENT]
    assert [m["id"] for m in assert_listed_as_scanned(state, OTHER)] == [OTHER]
    again = create(state, "A")
    assert [m["id"] for m in assert_listed_as_scanned(state)] == [PARENT, again]


def test_same_title_others_are_seeded_once_per_title_and_parent() -> None:
    state = fake(same_title_others=2)
    create(state, "T")
    create(state, "T")
    create(state, "U")
    create(state, "T", OTHER)
    titles = [m["title"] for m in assert_listed_as_scanned(state)[1:]]
    assert titles == ["T", "T", "T", "T", "U", "U", "U"]
    assert len(assert_listed_as_scanned(state, OTHER)) == 1 + 3
    assert state.snapshot()["faults"] == {"same_title_other": 6}


def test_a_seeded_child_or_the_others_of_a_dropped_create_count_as_that_title() -> None:
    state = fake(same_title_others=1)
    state.seed_workspace("Seeded", PARENT, "failed", 0)
    state.script("Dropped", "timeout_without_create")
    create_dropped = Request(
        "POST", f"/v2/workspaces/{PARENT}/child", {}, "Bearer t", b'{"title": "Dropped"}'
    )
    state.create(create_dropped, (PARENT,))  # times out, makes nothing but the others
    create(state, "Seeded")
    state.script("Dropped", "")
    create(state, "Dropped")
    titles = [m["title"] for m in assert_listed_as_scanned(state)[1:]]
    assert titles == ["Seeded", "Dropped", "Seeded", "Dropped"]
    assert state.snapshot()["faults"]["same_title_other"] == 1


def test_same_title_others_are_seeded_again_after_a_reset() -> None:
    state = fake(same_title_others=1)
    create(state, "T")
    state.reset()
    create(state, "T")
    assert [m["title"] for m in assert_listed_as_scanned(state)[1:]] == ["T", "T"]
    assert state.snapshot()["faults"] == {"same_title_other": 1}  # counted since the reset
