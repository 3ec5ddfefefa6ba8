"""What the service refuses to act on, as pure rules of plain values: a parent it
is not configured for, and a command from beyond the producers' clock skew. (A
configured parent listed in some family is ownership's: `domain.ownership`.)"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from domain.errors import ForeignParent, FutureCommand, InvalidRequest


def check_parent(parent_workspace_id: str, allowed: Collection[str] | None) -> None:
    """Raise ForeignParent unless the parent is one of `allowed` (None: any)."""
    if allowed is not None and parent_workspace_id not in allowed:
        raise ForeignParent(
            f"parent_workspace_id {parent_workspace_id!r} is not one of the parents this "
            "service acts under (PROVISIONER_PARENT_IDS): refused, not stored"
        )


def check_command_time(requested_at: datetime | None, now: datetime, skew_s: float) -> None:
    """An aware time no further ahead of `now` than `skew_s`: a command from the far
    future, once stored, would make every later command for the brand stale."""
    if requested_at is None:
        return
    if requested_at.utcoffset() is None:
        raise InvalidRequest("requested_at must carry a UTC offset")
    ahead_s = (requested_at - now).total_seconds()
    if ahead_s > skew_s:
        raise FutureCommand(
            f"requested_at {requested_at.isoformat()} is {ahead_s:.0f} s in the future, more "
            f"than the {skew_s:g} s allowed (PROVISIONER_COMMAND_SKEW_S): refused, not stored; "
            "check the producer's clock"
        )
