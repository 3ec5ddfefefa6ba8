"""Hypothesis strategies shared by the property tests: gateway answers, statuses,
failures, and small worlds (a parent's family with claims and projects)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st

from domain.ports import FaultKind, GatewayFault

PARENT = "parent-1"
TITLE = "Acme"
BRAND = "b1"
OTHER_BRANDS = ("b2", "b3")

READY = ("created", "active", "ready", " Ready ", "ACTIVE")
SETTLING = ("not ready", "creating", "", "pending", "readyish")
CREATION_FAILED = ("creation_failed", "creation failed", "Creation  Failed")
TERMINAL = ("failed", "error", "invalid subscription", " ERROR")
STATUSES = READY + SETTLING + CREATION_FAILED + TERMINAL


def scaled(times: float) -> int:
    """A number of examples relative to the loaded profile's (`default` or `deep`,
    tests/conftest.py), for the tests that need more than the rest."""
    return max(1, int(settings.default.max_examples * times))


def statuses() -> st.SearchStrategy[str]:
    """Statuses the contract names, case and spacing varied, and some it does not."""
    return st.one_of(st.sampled_from(STATUSES), st.text(max_size=12))


def failures() -> st.SearchStrategy[GatewayFault]:
    return st.builds(
        GatewayFault,
        st.sampled_from(list(FaultKind)),
        st.text(max_size=20),
        st.sampled_from([0.0, 0.0, 1.0, 90.0]),  # a Retry-After, shared or the gateway's
    )


@dataclass
class Member:
    """One child of the parent, with what the shell knows of it."""

    id: str
    title: str
    status: str
    holder: str | None = None  # the brand whose claim holds it
    releasing: bool = False  # its claim is marked Releasing
    projects: int = 0


@dataclass
class World:
    """The parent's family as the hop sees it: the parent (same title sometimes) and
    its children, some claimed by other brands, some being emptied, some with projects."""

    parent_title: str
    parent_status: str
    members: list[Member] = field(default_factory=list)

    def member(self, workspace_id: str) -> Member | None:
        return next((m for m in self.members if m.id == workspace_id), None)

    def held_by_other(self, workspace_id: str, brand: str = BRAND) -> bool:
        """What `WorkspaceClaim.held_by_other_than(brand)` answers."""
        m = self.member(workspace_id)
        return m is not None and (m.releasing or m.holder not in (None, brand))


def members(ids: list[str]) -> st.SearchStrategy[list[Member]]:
    one = st.builds(
        Member,
        st.sampled_from(ids),
        st.sampled_from([TITLE, TITLE, "Other", f"{TITLE} "]),
        statuses(),
        st.sampled_from([None, None, BRAND, *OTHER_BRANDS]),
        st.just(False),
        st.integers(0, 2),
    )
    return st.lists(one, max_size=6, unique_by=lambda m: m.id)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    ids = [f"ws-{n}" for n in range(1, 9)]
    family = draw(members(ids))
    for m in family:  # being emptied by another brand's attempt (ours hold theirs bound)
        m.releasing = m.holder != BRAND and draw(st.integers(0, 9)) == 0
    return World(
        parent_title=draw(st.sampled_from([TITLE, "Org"])),
        parent_status=draw(st.sampled_from(READY + SETTLING)),
        members=family,
    )
