"""Whose a workspace is: one model, decided here for every path that looks at one.

The hop (recovering an unconfirmed create, adopting), the orphan search of an
ended attempt, the releases, the decommission and the upstream audit all ask
`judge` (one workspace) or `credit` (the new children of a family, judged each
and counted); none decides ownership with rules of its own. The kinds
(docs/operations.md, "Trust boundaries"):

    PARENT      a parent the service acts under, or an id a gateway may take for
                one (case, Unicode normalisation, invisible characters, spaces)
    PROOF       ours by proof: our create's answer named it, or we bound it
    INFERENCE   ours by inference: a child new beside a create of ours whose answer
                was lost, seen within that create's window (`window_s` from when its
                grace began), nobody else's, and still as a create leaves it: empty
    UNCLEAR     inference cannot decide: it holds projects, or one create has
                several such children; a finding for a person, never emptied
    ADOPTABLE   pre-existing (or past every window), same title, ready, empty,
                unclaimed: what a hop may adopt
    FOREIGN     anything else: someone else's, never touched

Only a workspace ours by proof is ever emptied of projects (`may_empty`). One
ours by inference is recorded, and emptying it deletes nothing: it is judged
again on the projects listed at that moment, and holding any it is UNCLEAR.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from domain.policies import StatusClass, classify_status
from domain.ports import FamilyMember

# Projects a create of ours leaves in its workspace: it carves none (docs/gateway.md).
CARVED_PROJECTS = 0


class Owner(StrEnum):
    PARENT = "parent"
    PROOF = "ours_by_proof"
    INFERENCE = "ours_by_inference"
    UNCLEAR = "unclear"
    ADOPTABLE = "adoptable"
    FOREIGN = "foreign"


# Identity, as a gateway may compare it.


def canonical(workspace_id: str) -> str:
    """The id as a lenient gateway may compare it: NFKC, no invisible (format)
    characters, no surrounding spaces, case folded."""
    text = unicodedata.normalize("NFKC", workspace_id)
    return "".join(c for c in text if unicodedata.category(c) != "Cf").strip().casefold()


def is_parent(workspace_id: str, parents: Iterable[str]) -> bool:
    """Equal to one of `parents` under any comparison a gateway might make."""
    mine = canonical(workspace_id)
    return any(mine == canonical(parent) for parent in parents)


def without_parents(
    family: Iterable[FamilyMember], parents: Collection[str] | None
) -> list[FamilyMember]:
    """The family without any member a gateway may take for a configured parent."""
    return [m for m in family if not is_parent(m.id, parents or ())]


def same_title(
    family: Iterable[FamilyMember], title: str, parent_id: str, parents: Collection[str] = ()
) -> list[FamilyMember]:
    """Children carrying exactly this title; never the parent, nor anything equal to a
    parent under a gateway's comparisons."""
    never = (parent_id, *parents)
    return [m for m in family if m.id and m.title == title and not is_parent(m.id, never)]


# What an attempt's creates left on record.


@dataclass(frozen=True, slots=True)
class Creates:
    """An attempt's creates, as ownership needs them (`ProvisioningAttempt.creates`)."""

    baseline: frozenset[str]  # same-title children before the first create still counted
    on_record: frozenset[str]  # what they made that is on record (and the candidate)
    given_up: int = 0  # creates given up unconfirmed: what they made may still appear
    # When the window of its latest create began (the create's grace start): children
    # new beside it are credited to it only within `window_s` of then. None: no create.
    window_from: datetime | None = None
    inferred: frozenset[str] = frozenset()  # on record by inference, not by proof

    @property
    def proven(self) -> frozenset[str]:
        """What our creates' answers named (and a candidate we accepted on proof)."""
        return self.on_record - self.inferred

    def window_open(self, now: datetime, window_s: float) -> bool:
        since = self.window_from
        return since is not None and (now - since).total_seconds() <= window_s


# One workspace.


@dataclass(frozen=True, slots=True)
class Facts:
    """What is known of one workspace, as plain values."""

    workspace_id: str
    parents: Collection[str] = ()  # the attempt's parent and every configured one
    proven: bool = False  # our create's answer named it, or we bound it (with our claim)
    credited: bool = False  # on record as a lost create's, by inference (not proof)
    taken: str | None = None  # why it is not ours to take: another brand's claim, ...
    new: bool = False  # beside a create of ours whose answer was lost: not in its baseline
    window_open: bool = False  # ... and within that create's window
    same_title: bool = False  # titled as the brand, under its parent
    status: str | None = None  # upstream; None: not listed
    projects: int | None = None  # None: not read


@dataclass(frozen=True, slots=True)
class Verdict:
    owner: Owner
    why: str

    @property
    def ours(self) -> bool:
        return self.owner in (Owner.PROOF, Owner.INFERENCE)


def judge(f: Facts) -> Verdict:
    """Whose the workspace is (the module's docstring)."""
    if is_parent(f.workspace_id, f.parents):
        return Verdict(Owner.PARENT, "a parent the service acts under: never touched")
    if f.proven:
        return Verdict(Owner.PROOF, "our create's answer named it, or we bound it")
    if f.taken:
        return Verdict(Owner.FOREIGN, f.taken)
    if f.credited or (f.new and f.window_open):
        if f.projects is None:
            return Verdict(Owner.UNCLEAR, "new beside a lost create of ours; projects not read")
        if f.projects > CARVED_PROJECTS:
            return Verdict(
                Owner.UNCLEAR,
                f"new beside a lost create of ours, but holds {f.projects} projects, which "
                "no create of ours makes: a person decides",
            )
        why = "new beside a lost create of ours, within its window, empty"
        return Verdict(Owner.INFERENCE, why)
    ready = classify_status(f.status) is StatusClass.READY
    if f.same_title and ready and f.projects == 0:
        return Verdict(Owner.ADOPTABLE, "same title, ready, empty and unclaimed: adoptable")
    if f.new:
        return Verdict(Owner.FOREIGN, "new beside a lost create of ours, but past its window")
    return Verdict(Owner.FOREIGN, "nothing on record makes it ours: someone else's")


def may_empty(verdict: Verdict) -> bool:
    """Whether projects may be deleted from it: only ours (by proof; by inference it is
    empty, so nothing is deleted: judged again on what is listed when emptying)."""
    return verdict.ours


def taken_because(
    brand_id: str, holder: str | None, releasing: bool, made_by_other: bool
) -> str | None:
    """Why a workspace cannot be what a brand's attempt's lost create made: another
    brand's claim holds it, an emptying holds it, or another attempt's create made it."""
    if releasing:
        return "being emptied by a release"
    if holder is not None and holder != brand_id:
        return f"claimed by brand {holder}"
    if made_by_other:
        return "made by another attempt's create, on record"
    return None


# The new children of a family.


@dataclass(frozen=True, slots=True)
class Made:
    """What the family shows our lost creates made, as judged and counted."""

    live: tuple[str, ...] = ()  # the live workspace credited (at most one): the candidate
    shells: tuple[str, ...] = ()  # terminal ones credited: recorded, owed, never bound
    unclear: int = 0  # live workspaces credited that cannot be told apart (ambiguous)
    # False when only shells are credited after a create was given up: the shells
    # may be the given-up one's while the latest create's workspace is on its way.
    settled: bool = True
    # New children that inference cannot credit (they hold projects): for a person.
    held: tuple[tuple[str, str], ...] = ()

    @property
    def ours(self) -> tuple[str, ...]:
        """Every workspace credited: the live one first."""
        return self.live + self.shells


def new_children(
    family: Iterable[FamilyMember],
    title: str,
    parent_id: str,
    creates: Creates,
    parents: Collection[str] = (),
) -> list[FamilyMember]:
    """Same-title children new since the baseline and not on record: what a lost create
    of ours may have made, unless taken elsewhere."""
    gone = creates.baseline | creates.on_record
    return [m for m in same_title(family, title, parent_id, parents) if m.id not in gone]


def credit(
    family: Iterable[FamilyMember],
    title: str,
    parent_id: str,
    creates: Creates,
    *,
    taken: Mapping[str, str] | None = None,
    projects: Mapping[str, int | None] | None = None,
    window_open: bool = True,
    parents: Collection[str] = (),
) -> Made:
    """Which new children our lost creates are credited with: each judged
    (`judge`: nobody else's, within the window, empty), then counted.

    One create makes at most one workspace. With none given up, that is the one
    live workspace credited, else the one shell, else nothing we can tell apart.
    With a create given up, it is the one live workspace if there is exactly one,
    and every shell besides (a shell is never usable: recording it costs nothing).
    `taken`: why a new child is someone else's (`taken_because`), by id; `projects`:
    each new child's count, as the use case listed it (one not read is unclear).
    """
    counts, whose = projects or {}, taken or {}
    found: list[FamilyMember] = []
    held: list[tuple[str, str]] = []
    for m in new_children(family, title, parent_id, creates, parents):
        facts = Facts(
            m.id,
            (parent_id, *parents),
            taken=whose.get(m.id),
            new=True,
            window_open=window_open,
            same_title=True,
            status=m.status,
            projects=counts.get(m.id),
        )
        verdict = judge(facts)
        if verdict.owner is Owner.INFERENCE:
            found.append(m)
        elif verdict.owner is Owner.UNCLEAR:
            held.append((m.id, verdict.why))
    live = tuple(m.id for m in found if not classify_status(m.status).is_terminal)
    shells = tuple(m.id for m in found if classify_status(m.status).is_terminal)
    kept = tuple(held)
    if len(live) > 1:  # several live: none can be told apart
        return Made(shells=shells if creates.given_up else (), unclear=len(live), held=kept)
    if creates.given_up:
        return Made(live, shells, settled=bool(live), held=kept)
    if live or len(shells) == 1:
        return Made(live, () if live else shells, held=kept)
    return Made(unclear=len(shells), held=kept)  # several shells: one create made one
