"""The upstream audit: the gateway's family of a parent against the log, as a pure
function of plain values (`classify`). Not the audit trail of attempts
(`infrastructure/audit.py`): this compares what is upstream with what is on record.

What it classifies, under one parent:

- every workspace on record: bound and ready upstream (clean); released and
  empty (clean); bound but terminal (`bound_terminal`) or missing
  (`bound_missing`) upstream; bound to two brands, or bound to one while
  another's claim holds it (`claimed_twice`); released but holding projects
  (`released_not_empty`); made by our creates and owed a release by an ended
  attempt (`release_owed`);
- every same-title child of a title we provisioned under the parent that nothing
  on record explains: an orphan of ours (`orphan`) if exactly one ended
  attempt's creates are credited with it by the rule the hop uses
  (`domain.creates.made_by_our_creates`, called here); `unclear` if several
  are, or the rule cannot tell it apart from another new one; `in_flight` while
  a pending attempt's create of that title is unresolved (its hop decides);
  otherwise someone else's (`foreign`);
- the parent (and every configured parent): never in a finding to act on; on
  record as bound, created or claimed it is `parent_on_record`.

`foreign` and `in_flight` are information (`Finding.is_problem` is False); every
other kind is a problem. Only `orphan` and `release_owed` (a release through the
release use case) and `bound_missing` of an active brand (provision again) have
an action: nothing else is ever touched.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from domain.creates import Creates, Made, made_by_our_creates, unaccounted
from domain.policies import StatusClass, classify_status, same_title
from domain.ports import FamilyMember


class Kind(StrEnum):
    BOUND_TERMINAL = "bound_terminal"
    BOUND_MISSING = "bound_missing"
    CLAIMED_TWICE = "claimed_twice"
    RELEASED_NOT_EMPTY = "released_not_empty"
    RELEASE_OWED = "release_owed"
    ORPHAN = "orphan"
    UNCLEAR = "unclear"
    PARENT_ON_RECORD = "parent_on_record"
    IN_FLIGHT = "in_flight"  # information: a pending attempt's create decides
    FOREIGN = "foreign"  # information: someone else's, never touched


INFORMATION = frozenset({Kind.IN_FLIGHT, Kind.FOREIGN})


class Action(StrEnum):
    NONE = "none"
    RELEASE = "release"  # the release use case of `attempt_id`: records and empties
    PROVISION = "provision"  # request the brand's workspace again


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """An attempt as the audit needs it (`ProvisioningAttempt`'s fields)."""

    attempt_id: str
    brand_id: str
    parent_id: str
    title: str
    pending: bool
    creates: Creates
    orphan_search: bool = False  # a create's workspace may still appear upstream
    created_ids: tuple[str, ...] = ()
    released_ids: tuple[str, ...] = ()  # emptied, or handed to a later attempt
    owed: tuple[str, ...] = ()  # owed a release (`ProvisioningAttempt.owed_releases`)
    candidate_id: str | None = None
    state: str = "pending"


@dataclass(frozen=True, slots=True)
class BrandRecord:
    """A brand with an attempt under the parent; its bound workspace is judged under
    its own (current) parent only."""

    brand_id: str
    parent_id: str
    title: str
    active: bool
    workspace_id: str | None = None
    emptied_ids: tuple[str, ...] = ()  # unbound after their decommission emptied them


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """A workspace's claim, when one is on record (held or not)."""

    workspace_id: str
    brand_id: str | None = None
    releasing: bool = False


@dataclass(frozen=True, slots=True)
class Record:
    """What the log says about one parent (attempts and brands under it) and the
    claims of every workspace that matters."""

    attempts: tuple[AttemptRecord, ...] = ()
    brands: tuple[BrandRecord, ...] = ()
    claims: Mapping[str, ClaimRecord] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Upstream:
    """What the gateway says: the parent's family; for a bound workspace the family
    does not list, its status (None: gone, 404); projects of what matters."""

    family: tuple[FamilyMember, ...]
    statuses: Mapping[str, str | None] = field(default_factory=dict)
    projects: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Finding:
    kind: Kind
    parent_id: str
    workspace_id: str
    detail: str
    title: str | None = None
    brand_ids: tuple[str, ...] = ()
    attempt_id: str | None = None
    status: str | None = None  # upstream; None when missing
    projects: int | None = None  # None when not read
    action: Action = Action.NONE

    @property
    def is_problem(self) -> bool:
        return self.kind not in INFORMATION


@dataclass(frozen=True, slots=True)
class Audit:
    parent_id: str
    findings: tuple[Finding, ...]
    clean: Mapping[str, int]  # bound_ready, bound_settling, released_empty: counts

    @property
    def problems(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.is_problem)


def released_ids(record: Record) -> set[str]:
    """Workspaces emptied by a release or a decommission, on record."""
    gone = {ws for a in record.attempts for ws in a.released_ids}
    return gone | {ws for b in record.brands for ws in b.emptied_ids}


def on_record(record: Record) -> set[str]:
    """Every workspace the log names: bound, made by a create, a candidate, released,
    or with a claim."""
    named = {ws for a in record.attempts for ws in (*a.created_ids, *a.released_ids)}
    named |= {a.candidate_id for a in record.attempts if a.candidate_id}
    named |= {b.workspace_id for b in record.brands if b.workspace_id}
    return named | released_ids(record) | set(record.claims)


def _held(claim: ClaimRecord | None) -> bool:
    return claim is not None and (claim.brand_id is not None or claim.releasing)


def needs_projects(parent_id: str, family: Iterable[FamilyMember], record: Record) -> set[str]:
    """The workspaces whose projects the audit reads: the released ones the family
    lists (they must be empty), and unexplained children of our titles (evidence)."""
    listed = {m.id for m in family if m.id != parent_id}
    bound = {b.workspace_id for b in record.brands if b.workspace_id}
    released = {
        ws
        for ws in released_ids(record) & listed
        if ws not in bound and not _held(record.claims.get(ws))
    }
    known = on_record(record)
    titles = {a.title for a in record.attempts}
    children = {m.id for t in titles for m in same_title(family, t, parent_id)}
    return released | (children - known)


def taken_for(attempt: AttemptRecord, record: Record) -> set[str]:
    """What cannot be this attempt's create's: held by another brand's claim (or
    being emptied), or made by another attempt's create on record."""
    taken = {
        ws
        for ws, claim in record.claims.items()
        if claim.releasing or claim.brand_id not in (None, attempt.brand_id)
    }
    others = (a for a in record.attempts if a.attempt_id != attempt.attempt_id)
    return taken | {ws for a in others for ws in a.created_ids}


def classify(
    parent_id: str, upstream: Upstream, record: Record, parents: Collection[str] = ()
) -> Audit:
    """Every finding under `parent_id` (see the module's docstring); `parents`: every
    configured parent, never acted on whichever family lists it."""
    family = tuple(m for m in upstream.family if m.id not in parents or m.id == parent_id)
    scope = _Scope(parent_id, frozenset({parent_id, *parents}), family, upstream, record)
    findings = [*scope.parent_on_record(), *scope.bound(), *scope.released(), *scope.owed()]
    findings += scope.unexplained()
    return Audit(parent_id, tuple(findings), scope.clean)


@dataclass
class _Scope:
    parent_id: str
    never: frozenset[str]  # the parent and every configured parent
    family: tuple[FamilyMember, ...]
    upstream: Upstream
    record: Record
    clean: dict[str, int] = field(
        default_factory=lambda: {"bound_ready": 0, "bound_settling": 0, "released_empty": 0}
    )

    def parent_on_record(self) -> list[Finding]:
        named = on_record(self.record) & self.never
        why = "a parent is on record as a workspace: never acted on"
        return [Finding(Kind.PARENT_ON_RECORD, self.parent_id, ws, why) for ws in sorted(named)]

    def bound(self) -> list[Finding]:
        listed = {m.id: m.status for m in self.family}
        holders: dict[str, list[BrandRecord]] = {}
        for brand in self.record.brands:
            here = brand.parent_id == self.parent_id
            if here and brand.workspace_id and brand.workspace_id not in self.never:
                holders.setdefault(brand.workspace_id, []).append(brand)
        found: list[Finding] = []
        for ws, brands in sorted(holders.items()):
            names = tuple(sorted(b.brand_id for b in brands))
            claim = self.record.claims.get(ws)
            holder = claim.brand_id if claim else None
            if len(brands) > 1 or (holder is not None and holder not in names):
                why = f"bound to {', '.join(names)}; claim held by {holder or 'nobody'}"
                found.append(Finding(Kind.CLAIMED_TWICE, self.parent_id, ws, why, brand_ids=names))
            status = listed[ws] if ws in listed else self.upstream.statuses.get(ws)
            status_class = None if status is None else classify_status(status)
            brand = brands[0]
            if status_class is None:
                act = Action.PROVISION if brand.active and len(brands) == 1 else Action.NONE
                why = "bound, gone upstream"
                found.append(Finding(Kind.BOUND_MISSING, self.parent_id, ws, why, brand.title,
                                     names, action=act))  # fmt: skip
            elif status_class.is_terminal:
                found.append(Finding(Kind.BOUND_TERMINAL, self.parent_id, ws,
                                     "bound, terminal upstream", brand.title, names,
                                     status=status))  # fmt: skip
            elif status_class is StatusClass.READY:
                self.clean["bound_ready"] += 1
            else:
                self.clean["bound_settling"] += 1
        return found

    def released(self) -> list[Finding]:
        listed = {m.id: m for m in self.family}
        bound = {b.workspace_id for b in self.record.brands if b.workspace_id}
        found: list[Finding] = []
        for ws in sorted(released_ids(self.record) - self.never - bound):
            if ws not in listed or _held(self.record.claims.get(ws)):
                continue  # gone upstream, or taken on again (adopted): not ours to judge
            projects = self.upstream.projects.get(ws)
            if projects:
                member = listed[ws]
                found.append(Finding(Kind.RELEASED_NOT_EMPTY, self.parent_id, ws,
                                     f"released, {projects} projects upstream", member.title,
                                     status=member.status, projects=projects))  # fmt: skip
            else:
                self.clean["released_empty"] += 1
        return found

    def owed(self) -> list[Finding]:
        found: list[Finding] = []
        for a in self.record.attempts:
            for ws in () if a.pending else a.owed:
                if ws not in self.never:
                    why = f"attempt {a.state}; its release of {ws} is owed"
                    found.append(Finding(Kind.RELEASE_OWED, self.parent_id, ws, why, a.title,
                                         (a.brand_id,), a.attempt_id,
                                         action=Action.RELEASE))  # fmt: skip
        return found

    def unexplained(self) -> list[Finding]:
        known = on_record(self.record)
        found: list[Finding] = []
        for title in sorted({a.title for a in self.record.attempts}):
            children = [m for m in same_title(self.family, title, self.parent_id)
                        if m.id not in known]  # fmt: skip
            if not children:
                continue
            attempts = [a for a in self.record.attempts if a.title == title and a.orphan_search]
            made = {
                a.attempt_id: made_by_our_creates(
                    self.family, title, self.parent_id, a.creates, taken_for(a, self.record)
                )
                for a in attempts
                if not a.pending
            }
            found += [self.child(member, title, attempts, made) for member in children]
        return found

    def child(
        self, member: FamilyMember, title: str, attempts: list[AttemptRecord], made: dict[str, Made]
    ) -> Finding:
        foreign = Finding(Kind.FOREIGN, self.parent_id, member.id, "same title, nothing on "
                          "record: someone else's", title, status=member.status,
                          projects=self.upstream.projects.get(member.id))  # fmt: skip
        busy = [a for a in attempts if a.pending]
        if busy:
            ids = ", ".join(a.attempt_id for a in busy)
            why = f"attempt {ids} has a create of this title unresolved: its hop decides"
            brands = tuple(sorted({a.brand_id for a in busy}))
            return replace(foreign, kind=Kind.IN_FLIGHT, detail=why, brand_ids=brands,
                           attempt_id=busy[0].attempt_id)  # fmt: skip
        credited = [a for a in attempts if member.id in made[a.attempt_id].ours]
        if len(credited) == 1:
            a = credited[0]
            why = f"made by attempt {a.attempt_id}'s unresolved create, not on record"
            return replace(foreign, kind=Kind.ORPHAN, detail=why, brand_ids=(a.brand_id,),
                           attempt_id=a.attempt_id, action=Action.RELEASE)  # fmt: skip
        if credited:
            why = f"credited to several attempts: {', '.join(a.attempt_id for a in credited)}"
            brands = tuple(sorted({a.brand_id for a in credited}))
            return replace(foreign, kind=Kind.UNCLEAR, detail=why, brand_ids=brands)
        if not classify_status(member.status).is_terminal:
            for a in attempts:
                new = {m.id for m in unaccounted((member,), title, self.parent_id, a.creates)}
                if made[a.attempt_id].unclear and member.id in new:
                    why = f"one of several new workspaces after attempt {a.attempt_id}'s create"
                    return replace(foreign, kind=Kind.UNCLEAR, detail=why,
                                   brand_ids=(a.brand_id,), attempt_id=a.attempt_id)  # fmt: skip
        return foreign
