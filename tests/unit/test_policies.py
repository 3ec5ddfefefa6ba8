from __future__ import annotations

import pytest

from domain.ownership import Facts, Owner, judge, same_title
from domain.policies import StatusClass, classify_status
from domain.ports import FamilyMember
from domain.waits import Backoff
from infrastructure.settings.model import Settings

PARENT = "p"


@pytest.mark.parametrize("raw", ["created", "Active", " READY ", "ready\n"])
def test_ready_statuses_whatever_their_case_and_spacing(raw: str) -> None:
    assert classify_status(raw) is StatusClass.READY


@pytest.mark.parametrize(
    "raw",
    ["creation_failed", "Creation Failed", "creation  failed", "CREATION_FAILED"],
)
def test_creation_failed_is_terminal_and_safe_to_create_again(raw: str) -> None:
    assert classify_status(raw) is StatusClass.CREATION_FAILED
    assert classify_status(raw).is_terminal


@pytest.mark.parametrize("raw", ["FAILED", "error", "Invalid Subscription", " Error "])
def test_terminal_statuses_not_safe_to_create_again(raw: str) -> None:
    assert classify_status(raw) is StatusClass.TERMINAL
    assert classify_status(raw).is_terminal


@pytest.mark.parametrize("raw", ["not ready", "locked", "", None, "mystery"])
def test_anything_else_is_still_settling(raw: str | None) -> None:
    assert classify_status(raw) is StatusClass.SETTLING


def test_default_backoff_is_5_10_20_40_80_seconds_155_in_all() -> None:
    backoff = Settings().engine().backoff
    assert [backoff.delay_after(h) for h in range(5)] == [5, 10, 20, 40, 80]
    assert backoff.total_s() == 155
    assert backoff.can_requeue(4)
    assert not backoff.can_requeue(5)


def test_backoff_is_configurable_and_validated() -> None:
    assert Backoff(base_s=0.5, max_requeues=2).total_s() == 1.5
    with pytest.raises(ValueError, match="base"):
        Backoff(base_s=-1, max_requeues=5)
    with pytest.raises(ValueError, match="requeues"):
        Backoff(base_s=5.0, max_requeues=-1)


def family(*members: tuple[str, str, str]) -> list[FamilyMember]:
    return [FamilyMember(*m) for m in members]


def test_adoption_shortlist_keeps_exact_title_ready_children_only() -> None:
    members = family(
        (PARENT, "Acme", "active"),  # the parent itself, same title
        ("w1", "Acme", "created"),
        ("w2", "acme", "created"),  # not the exact title
        ("w3", "Acme", "not ready"),  # zombie or settling
        ("w4", "Acme", "creation_failed"),
        ("w5", "Acme ", "created"),
    )
    titled = same_title(members, "Acme", PARENT)
    adoptable = [
        m.id
        for m in titled
        if judge(Facts(m.id, (PARENT,), same_title=True, status=m.status, projects=0)).owner
        is Owner.ADOPTABLE
    ]
    assert adoptable == ["w1"]
