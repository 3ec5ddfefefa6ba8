"""The boundary rules as pure functions of plain values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from domain.boundaries import check_command_time, check_parent
from domain.errors import ForeignParent, FutureCommand, InvalidRequest
from domain.ownership import without_parents
from domain.ports import FamilyMember

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def test_a_parent_outside_the_configured_ones_is_refused() -> None:
    check_parent("org-a", {"org-a", "org-b"})
    check_parent("anything", None)  # a service embedded without a list
    with pytest.raises(ForeignParent, match="'org-c'"):
        check_parent("org-c", {"org-a", "org-b"})


@pytest.mark.parametrize("ahead_s", [-86_400.0, 0.0, 299.0, 300.0])
def test_a_command_within_the_skew_or_past_is_accepted(ahead_s: float) -> None:
    check_command_time(NOW + timedelta(seconds=ahead_s), NOW, 300.0)
    check_command_time(None, NOW, 300.0)


def test_a_command_beyond_the_skew_or_without_offset_is_refused() -> None:
    with pytest.raises(FutureCommand, match="301 s in the future"):
        check_command_time(NOW + timedelta(seconds=301), NOW, 300.0)
    with pytest.raises(FutureCommand):
        check_command_time(datetime(9999, 12, 31, 23, 59, tzinfo=UTC), NOW, 300.0)
    with pytest.raises(InvalidRequest, match="UTC offset"):
        check_command_time(datetime(2026, 12, 1), NOW, 300.0)


def test_configured_parents_are_taken_out_of_any_family() -> None:
    family = [FamilyMember("org-a", "", "ready"), FamilyMember("ws-1", "T", "ready"),
              FamilyMember("org-b", "T", "ready")]  # fmt: skip
    assert [m.id for m in without_parents(family, {"org-a", "org-b"})] == ["ws-1"]
    assert without_parents(family, None) == family


def test_a_family_member_a_lenient_gateway_takes_for_a_parent_is_taken_out() -> None:
    wide = "\uff4f\uff52\uff47-a"  # "org-a" in full-width letters: NFKC makes it "org-a"
    family = [FamilyMember("ORG-A", "T", "ready"), FamilyMember(" org-b\u200b", "T", "ready"),
              FamilyMember(wide, "T", "ready"), FamilyMember("ws-1", "T", "ready")]  # fmt: skip
    assert [m.id for m in without_parents(family, {"org-a", "org-b"})] == ["ws-1"]
