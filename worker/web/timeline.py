"""What the web view draws of an attempt's events: the time between each event and
the one before, and a strip of its hops on a time axis (drawn by the template as
SVG, its colours from the stylesheet: no script, no inline style)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

STRIP_WIDTH = 640  # the SVG's width, in its own units
STRIP_PAD = 8
ENDS = frozenset({"promoted", "failed", "ended"})

# The kind of mark each event type makes on the strip (its CSS class: `mark-<kind>`).
KINDS = {
    "Started": "start",
    "HopScheduled": "hop",
    "CreateRequested": "create",
    "CreateRefused": "bad",
    "CreateUnconfirmed": "deferred",
    "CandidateAccepted": "candidate",
    "SurplusCreated": "candidate",
    "CandidateDropped": "bad",
    "Promoted": "promoted",
    "Failed": "failed",
    "Cancelled": "ended",
    "Superseded": "ended",
    "CandidateReleased": "released",
    "CandidateHandedOver": "released",
}


def duration(seconds: float) -> str:
    """A span as a person reads it: 250 ms, 1.5 s, 12 s, 3 min 5 s, 2 h 4 min, 1 d 3 h."""
    s = max(seconds, 0.0)
    if s < 1:
        return "under 1 ms" if s < 0.001 else f"{s * 1000:.0f} ms"
    if s < 10:
        return f"{s:.1f} s"
    whole = int(s)
    for big, big_name, small, small_name in (
        (86400, "d", 3600, "h"),
        (3600, "h", 60, "min"),
        (60, "min", 1, "s"),
    ):
        if whole >= big:
            rest = (whole % big) // small
            return f"{whole // big} {big_name}" + (f" {rest} {small_name}" if rest else "")
    return f"{whole} s"


def _at(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def with_durations(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events, each with `after`: the time since the event before it ("" for
    the first), and for a run of deferrals `lasted`: from its first to its last."""
    shown: list[dict[str, Any]] = []
    before: datetime | None = None
    for event in events:
        at = _at(event["at"])
        item = {
            **event,
            "after": "" if before is None else "+" + duration((at - before).total_seconds()),
        }
        if event.get("until"):
            until = _at(event["until"])
            item["lasted"] = duration((until - at).total_seconds())
            at = until
        shown.append(item)
        before = at
    return shown


@dataclass(frozen=True, slots=True)
class Mark:
    x: float
    kind: str
    label: str


def hop_strip(
    events: Sequence[dict[str, Any]], next_hop_at: datetime | None = None
) -> dict[str, Any]:
    """Marks on a time axis from the first event to the last (or the next hop, when
    one is due): each event at its time, a run of deferrals as a span; `span` is
    the axis's length as text."""
    if not events:
        return {"marks": [], "spans": [], "span": "", "width": STRIP_WIDTH, "hollow": False}
    start = _at(events[0]["at"])
    times = [_at(e.get("until") or e["at"]) for e in events]
    end = max([*times, *([next_hop_at] if next_hop_at else [])])
    total = max((end - start).total_seconds(), 1e-3)
    room = STRIP_WIDTH - 2 * STRIP_PAD

    def x(at: datetime) -> float:
        return round(STRIP_PAD + room * (at - start).total_seconds() / total, 1)

    marks: list[Mark] = []
    spans: list[dict[str, Any]] = []
    for event in events:
        at = _at(event["at"])
        hop = "" if event.get("hop") is None else f" (hop {event['hop']})"
        if event.get("deferred"):
            until = _at(event["until"])
            spans.append(
                {
                    "x": x(at),
                    "w": max(x(until) - x(at), 2.0),
                    "label": f"deferred ×{event['deferred']}{hop}",
                }
            )
            continue
        kind, label = KINDS.get(event["type"], "hop"), f"{event['type']}{hop}"
        if kind == "hop" and event.get("spent") is False:
            # A wait the settle budget does not pay for: the first after a create, a
            # busy slot, a create not yet seen; drawn hollow beside the "not yet"s.
            kind, label = "wait", f"{label}: {event.get('reason') or 'a wait'}, no budget spent"
        marks.append(Mark(x(at), kind, label))
    if next_hop_at is not None:
        marks.append(Mark(x(next_hop_at), "next", "next hop due"))
    marks.sort(key=lambda m: m.kind in ENDS)  # drawn last: on top of what came at once
    hollow = any(m.kind == "wait" for m in marks)  # the caption says what such a mark is
    return {
        "marks": marks,
        "spans": spans,
        "span": duration(total),
        "width": STRIP_WIDTH,
        "hollow": hollow,
    }
