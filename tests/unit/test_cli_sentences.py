"""What `provision --wait` and `deactivate` say, for every way an attempt ends."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from infrastructure.usecases.commands import Deactivation
from worker.actions import deactivation_sentence
from worker.console import outcome_sentence

ATTEMPT = "5aa9d005-f08a-4bf0-b6c2-93cc97ec6dc2"


def _story(state: str, last: dict[str, Any], **more: Any) -> dict[str, Any]:
    event = {"at": "", "hop": None, "workspace_id": None, "provenance": None,
             "reason": None, "message": None, **last}  # fmt: skip
    return {"attempt_id": ATTEMPT, "brand_id": "b-1", "state": state, "events": [event], **more}


def test_each_end_of_an_attempt_is_one_whole_sentence() -> None:
    head = f"attempt {ATTEMPT} for brand b-1"

    promoted = _story("promoted", {"type": "Promoted", "workspace_id": "ws-9"})
    failed = _story(
        "failed",
        {"type": "Failed", "reason": "unauthorized"},
        failure_reason="unauthorized",
        failure_message="401: token refused",
    )
    cancelled = _story("cancelled", {"type": "Cancelled", "reason": "brand deactivated"})
    superseded = _story("superseded", {"type": "Superseded", "reason": "superseded by attempt 7"})
    superseded_before = _story("superseded", {"type": "Superseded"})

    assert outcome_sentence(promoted) == f"{head} promoted: the brand is ready in workspace ws-9."
    assert outcome_sentence(failed) == f"{head} failed (unauthorized): 401: token refused"
    assert outcome_sentence(cancelled) == f"{head} was cancelled (brand deactivated)."
    assert outcome_sentence(superseded) == f"{head} was superseded by attempt 7, which carries on."
    assert outcome_sentence(superseded_before) == (
        f"{head} was superseded by a newer attempt, which carries on."
    )


def test_deactivate_says_what_it_did_and_what_follows() -> None:
    attempt = UUID(ATTEMPT)

    due = datetime(2030, 1, 4, 12, 0, tzinfo=UTC)
    with_workspace = Deactivation("b-1", False, None, "ws-9", due)
    with_attempt = Deactivation("b-1", False, attempt, None)
    again = Deactivation("b-1", True, None, "ws-9", due)
    emptied = Deactivation("b-1", True, None, None)

    assert deactivation_sentence(with_workspace) == (
        "brand b-1 deactivated; no attempt was pending. A worker will empty workspace "
        "ws-9 at 2030-01-04T12:00:00+00:00 and unbind it; a provision of the same "
        "title and parent before then keeps it."
    )
    assert deactivation_sentence(with_attempt) == (
        f"brand b-1 deactivated; its pending attempt {ATTEMPT} was cancelled, "
        "and it has no workspace to empty."
    )
    assert deactivation_sentence(again) == (
        "brand b-1 was already deactivated; workspace ws-9 is to be emptied at "
        "2030-01-04T12:00:00+00:00."
    )
    assert deactivation_sentence(emptied) == "brand b-1 was already deactivated; nothing changed."
