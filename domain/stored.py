"""What the attempt's stream stores beyond its state: texts cut to a summary, and
the upcasters that read events stored by earlier versions as today's."""

from __future__ import annotations

from typing import Any

# Stored error texts are summaries for people; they are cut to this length.
MAX_MESSAGE_CHARS = 300


def deferred_false(state: dict[str, Any]) -> None:
    """Upcaster: before deferrals, every scheduled hop was a settle wait."""
    state["deferred"] = False


def spent_unless_deferred(state: dict[str, Any]) -> None:
    """Upcaster: before `spent`, every hop not deferred spent the settle budget."""
    state["spent"] = not state["deferred"]


def paced_false(state: dict[str, Any]) -> None:
    """Upcaster: before `paced`, no deferral was told apart as the fleet's own turn."""
    state["paced"] = False


def safe_message(text: str) -> str:
    """One line, bounded length: what may be stored in an event or a log line."""
    line = " ".join(str(text).split())
    return line[:MAX_MESSAGE_CHARS]
