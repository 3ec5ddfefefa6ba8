"""What the service refuses to act on, as pure rules of plain values: a parent it
is not configured for, a command from beyond the producers' clock skew, and a
configured parent listed in some family (never ours, whoever lists it)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime

from domain.errors import ForeignParent, FutureCommand, InvalidRequest
from domain.ports import FamilyMember


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


def without_parents(
    family: Iterable[FamilyMember], parents: Collection[str] | None
) -> list[FamilyMember]:
    """The family without any configured parent."""
    return [m for m in family if m.id not in (parents or ())]
