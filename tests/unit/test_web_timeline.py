"""What the web view draws of an attempt: the time between events, and its hop strip."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from worker.attempt_tables import _age
from worker.web.timeline import STRIP_PAD, STRIP_WIDTH, duration, hop_strip, with_durations

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def event(seconds: float, type_: str, **more: object) -> dict[str, object]:
    return {"at": (T0 + timedelta(seconds=seconds)).isoformat(), "type": type_, "hop": None,
            **more}  # fmt: skip


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0.0004, "under 1 ms"), (0.25, "250 ms"), (1.5, "1.5 s"), (12, "12 s"), (185, "3 min 5 s"),
     (120, "2 min"), (7440, "2 h 4 min"), (97200, "1 d 3 h"), (-3, "under 1 ms")],
)  # fmt: skip
def test_a_duration_reads_in_its_largest_units(seconds: float, said: str) -> None:
    assert duration(seconds) == said


def test_each_event_says_how_long_after_the_one_before() -> None:
    events = [event(0, "Started"), event(0.3, "CreateRequested", hop=0),
              event(5, "HopScheduled", hop=1, deferred=3,
                    until=(T0 + timedelta(seconds=65)).isoformat()),
              event(125, "Promoted", hop=4)]  # fmt: skip

    shown = with_durations(events)

    assert [e["after"] for e in shown] == ["", "+300 ms", "+4.7 s", "+1 min"]  # from the last
    assert shown[2]["lasted"] == "1 min"  # the run of deferrals, first to last


def test_the_strip_places_each_event_on_the_time_axis() -> None:
    events = [event(0, "Started"), event(50, "HopScheduled", hop=1), event(100, "Failed", hop=1),
              event(100, "CandidateReleased")]  # fmt: skip
    pending = [
        event(0, "Started"),
        event(
            10, "HopScheduled", hop=1, deferred=2, until=(T0 + timedelta(seconds=30)).isoformat()
        ),
    ]

    strip = hop_strip(events)
    waiting = hop_strip(pending, next_hop_at=T0 + timedelta(seconds=40))

    xs = {m.kind: m.x for m in strip["marks"]}
    assert xs["start"] == STRIP_PAD
    assert xs["failed"] == STRIP_WIDTH - STRIP_PAD
    assert xs["hop"] == STRIP_WIDTH / 2
    assert strip["marks"][-1].kind == "failed"  # drawn above the release at the same time
    assert strip["span"] == "1 min 40 s"
    assert [m.kind for m in waiting["marks"]] == ["start", "next"]
    assert waiting["marks"][-1].x == STRIP_WIDTH - STRIP_PAD  # the axis runs to the next hop
    (span,) = waiting["spans"]
    assert span["label"] == "deferred ×2 (hop 1)"
    assert span["w"] == pytest.approx((STRIP_WIDTH - 2 * STRIP_PAD) / 2)
    assert hop_strip([])["marks"] == []


def test_an_attempts_age_is_in_its_largest_unit() -> None:
    assert [_age(T0 - timedelta(seconds=s), T0) for s in (42, 420, 7200, 864000)] == [
        "42s", "7m", "2h", "10d"]  # fmt: skip
    assert _age(None, T0) == ""


def test_a_wait_that_spends_no_settle_budget_is_drawn_apart_from_a_not_yet() -> None:
    created = "created; first poll after the first settle wait"
    events = [event(0, "Started"), event(1, "CreateRequested", hop=0),
              event(2, "HopScheduled", hop=1, spent=False, reason=created),
              event(7, "HopScheduled", hop=2, spent=True, reason="not ready"),
              event(12, "HopScheduled", hop=3)]  # fmt: skip  # older stories: no `spent`

    strip = hop_strip(events)
    marks = strip["marks"]

    assert strip["hollow"]  # the caption's cue
    assert not hop_strip(events[:2])["hollow"]
    assert [m.kind for m in marks] == ["start", "create", "wait", "hop", "hop"]
    assert marks[2].label == f"HopScheduled (hop 1): {created}, no budget spent"
    assert marks[3].label == "HopScheduled (hop 2)"
