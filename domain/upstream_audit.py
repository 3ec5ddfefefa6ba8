"""The upstream audit: the gateway's family of a parent against the log, as a pure
function of plain values (`classify`). Not the audit trail of attempts
(`infrastructure/views/audit.py`): this compares what is upstream with what is on record.

What it classifies, under one parent:

- every workspace on record: bound and ready upstream (clean); released and
  empty (clean); bound but terminal (`bound_terminal`) or missing
  (`bound_missing`) upstream; bound to two brands, or bound to one while
  another's claim holds it (`claimed_twice`); released but holding projects
  (`released_not_empty`); made by our creates and owed a release by an ended
  attempt (`release_owed`);
- every same-title child of a title we provisioned under the parent that nothing
  on record explains, judged by ownership's one model (`domain.ownership`, the
  rule the hop, the orphan search and the releases use): an orphan of ours
  (`orphan`) if exactly one ended attempt's lost create is credited with it
  (ours by inference: new, within that create's window, empty); `unclear` if
  several are, if the rule cannot tell it apart from another new one, or if it
  would be credited but holds projects (a person decides); `in_flight` while a
  pending attempt's create of that title is unresolved (its hop decides);
  `adoptable` when a hop would adopt it (ready, empty, unclaimed); otherwise
  someone else's (`foreign`);
- a workspace owed a release that is on record by inference and holds projects:
  `unclear` (the release would refuse: never emptied on inference alone);
- the parent (and every configured parent): never in a finding to act on; on
  record as bound, created or claimed it is `parent_on_record`.

`foreign`, `adoptable` and `in_flight` are information (`Finding.is_problem` is False); every
other kind is a problem. Only `orphan` and `release_owed` (a release through the
release use case) and `bound_missing` of an active brand (provision again) have
an action: nothing else is ever touched.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

from domain.ownership import (
    Creates,
    Facts,
    Made,
    Owner,
    credit,
    is_parent,
    judge,
    new_children,
    same_title,
    taken_because,
)
from domain.policies import StatusClass, classify_status
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
    ADOPTABLE = "adoptable"  # information: a hop of this title would adopt it
    FOREIGN = "foreign"  # information: someone else's, never touched
    PARENT_NOT_ALLOWED = "parent_not_allowed"  # on record, not in PROVISIONER_PARENT_IDS


INFORMATION = frozenset({Kind.IN_FLIGHT, Kind.ADOPTABLE, Kind.FOREIGN})

# What a person should do about a finding `--fix` does not act on.
ADVICE: dict[Kind, str] = {
    Kind.BOUND_TERMINAL: "the gateway reports the bound workspace terminal: ask its support "
    "to repair it, or `provisioner provision BRAND` to give the brand another",
    Kind.BOUND_MISSING: "the brand is inactive or shares the workspace: nothing to provision; "
    "check the brand with `provisioner status BRAND`",
    Kind.CLAIMED_TWICE: "decide which brand keeps it; `provisioner provision` the other one",
    Kind.RELEASED_NOT_EMPTY: "someone put projects in a workspace we emptied: it is theirs to "
    "keep or to empty by hand; the service never empties it again",
    Kind.UNCLEAR: "look at it in the gateway: if it is the brand's, it is safe to leave; if "
    "it is someone else's, leave it; the service never empties it",
    Kind.PARENT_ON_RECORD: "a gateway bug put a parent on record: nothing is ever done to it",
    Kind.PARENT_NOT_ALLOWED: "add the parent to PROVISIONER_PARENT_IDS to audit it, or leave "
    "it: nothing under it is touched",
    Kind.IN_FLIGHT: "nothing: the pending attempt's hop decides",
    Kind.ADOPTABLE: "nothing: a provision of this title may adopt it",
    Kind.FOREIGN: "nothing: someone else's, never touched",
}


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
    inferred_ids: tuple[str, ...] = ()  # on record by inference (`ProvisioningAttempt`)


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
class ParentRecord:
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
    # When the family was read, and how long a lost create's window lasts (ownership:
    # PROVISIONER_INFERENCE_WINDOW_S, given by the caller).
    read_at: datetime | None = None
    window_s: float = field(kw_only=True)


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

    @property
    def advice(self) -> str | None:
        """What a person should do, when `--fix` has no action for it."""
        return ADVICE.get(self.kind) if self.action is Action.NONE else None


@dataclass(frozen=True, slots=True)
class Audit:
    parent_id: str
    findings: tuple[Finding, ...]
    clean: Mapping[str, int]  # bound_ready, bound_settling, released_empty: counts

    @property
    def problems(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.is_problem)


def released_ids(record: ParentRecord) -> set[str]:
    """Workspaces emptied by a release or a decommission, on record."""
    gone = {ws for a in record.attempts for ws in a.released_ids}
    return gone | {ws for b in record.brands for ws in b.emptied_ids}


def on_record(record: ParentRecord) -> set[str]:
    """Every workspace the log names: bound, made by a create, a candidate, released,
    or with a claim."""
    named = {ws for a in record.attempts for ws in (*a.created_ids, *a.released_ids)}
    named |= {a.candidate_id for a in record.attempts if a.candidate_id}
    named |= {b.workspace_id for b in record.brands if b.workspace_id}
    return named | released_ids(record) | set(record.claims)


def _held(claim: ClaimRecord | None) -> bool:
    return claim is not None and (claim.brand_id is not None or claim.releasing)


def needs_projects(
    parent_id: str, family: Iterable[FamilyMember], record: ParentRecord
) -> set[str]:
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
    inferred = {ws for a in record.attempts for ws in a.owed if ws in a.inferred_ids}
    return released | (children - known) | (inferred & listed)


def taken_for(attempt: AttemptRecord, record: ParentRecord, ids: Iterable[str]) -> dict[str, str]:
    """Why each of `ids` cannot be this attempt's create's (`ownership.taken_because`:
    another brand's claim, an emptying, another attempt's create on record)."""
    others = [a for a in record.attempts if a.attempt_id != attempt.attempt_id]
    taken: dict[str, str] = {}
    for ws in ids:
        claim = record.claims.get(ws)
        holder, releasing = (claim.brand_id, claim.releasing) if claim else (None, False)
        made = any(ws in a.created_ids for a in others)
        why = taken_because(attempt.brand_id, holder, releasing, made)
        if why:
            taken[ws] = why
    return taken


def classify(
    parent_id: str, upstream: Upstream, record: ParentRecord, parents: Collection[str] = ()
) -> Audit:
    """Every finding under `parent_id` (see the module's docstring); `parents`: every
    configured parent, never acted on whichever family lists it."""
    family = tuple(m for m in upstream.family if m.id == parent_id or not is_parent(m.id, parents))
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
    record: ParentRecord
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
                found.append(
                    Finding(
                        Kind.BOUND_MISSING, self.parent_id, ws, why, brand.title, names, action=act
                    )
                )
            elif status_class.is_terminal:
                found.append(
                    Finding(
                        Kind.BOUND_TERMINAL,
                        self.parent_id,
                        ws,
                        "bound, terminal upstream",
                        brand.title,
                        names,
                        status=status,
                    )
                )
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
                by = [a for a in self.record.attempts if ws in a.released_ids]
                brands = {a.brand_id for a in by}
                brands |= {b.brand_id for b in self.record.brands if ws in b.emptied_ids}
                found.append(
                    Finding(
                        Kind.RELEASED_NOT_EMPTY,
                        self.parent_id,
                        ws,
                        f"released, {projects} projects upstream",
                        member.title,
                        tuple(sorted(brands)),
                        by[-1].attempt_id if by else None,
                        status=member.status,
                        projects=projects,
                    )
                )
            else:
                self.clean["released_empty"] += 1
        return found

    def owed(self) -> list[Finding]:
        found: list[Finding] = []
        for a in self.record.attempts:
            for ws in () if a.pending else a.owed:
                if ws in self.never:
                    continue
                projects = self.upstream.projects.get(ws)
                facts = Facts(ws, self.never, credited=True, projects=projects)
                kind, action = Kind.RELEASE_OWED, Action.RELEASE
                why = f"attempt {a.state}; its release of {ws} is owed"
                if ws in a.inferred_ids and (verdict := judge(facts)).owner is Owner.UNCLEAR:
                    # On record by inference and no longer empty: a person decides.
                    kind, action = Kind.UNCLEAR, Action.NONE
                    why = f"owed by attempt {a.attempt_id}, on record by inference; {verdict.why}"
                found.append(
                    Finding(
                        kind,
                        self.parent_id,
                        ws,
                        why,
                        a.title,
                        (a.brand_id,),
                        a.attempt_id,
                        projects=projects,
                        action=action,
                    )
                )
        return found

    def unexplained(self) -> list[Finding]:
        known = on_record(self.record)
        found: list[Finding] = []
        for title in sorted({a.title for a in self.record.attempts}):
            children = [
                m
                for m in same_title(self.family, title, self.parent_id, self.never)
                if m.id not in known
            ]
            if not children:
                continue
            attempts = [a for a in self.record.attempts if a.title == title and a.orphan_search]
            made = {a.attempt_id: self.credit(a, title) for a in attempts if not a.pending}
            found += [self.child(member, title, attempts, made) for member in children]
        return found

    def credit(self, a: AttemptRecord, title: str) -> Made:
        """What ownership credits the ended attempt's lost creates with (`credit`)."""
        at = self.upstream.read_at
        window = at is not None and a.creates.window_open(at, self.upstream.window_s)
        new = new_children(self.family, title, self.parent_id, a.creates, self.never)
        taken = taken_for(a, self.record, (m.id for m in new))
        return credit(
            self.family,
            title,
            self.parent_id,
            a.creates,
            taken=taken,
            projects=self.upstream.projects,
            window_open=window,
            parents=self.never,
        )

    def child(
        self, member: FamilyMember, title: str, attempts: list[AttemptRecord], made: dict[str, Made]
    ) -> Finding:
        projects = self.upstream.projects.get(member.id)
        foreign = Finding(
            Kind.FOREIGN,
            self.parent_id,
            member.id,
            "same title, nothing on record: someone else's",
            title,
            status=member.status,
            projects=projects,
        )
        busy = [a for a in attempts if a.pending]
        if busy:
            ids = ", ".join(a.attempt_id for a in busy)
            why = f"attempt {ids} has a create of this title unresolved: its hop decides"
            brands = tuple(sorted({a.brand_id for a in busy}))
            return replace(
                foreign,
                kind=Kind.IN_FLIGHT,
                detail=why,
                brand_ids=brands,
                attempt_id=busy[0].attempt_id,
            )
        credited = [a for a in attempts if member.id in made[a.attempt_id].ours]
        if len(credited) == 1:
            a = credited[0]
            why = (
                f"made by attempt {a.attempt_id}'s lost create (ours by inference: new "
                "beside it, within its window, empty), not on record"
            )
            return replace(
                foreign,
                kind=Kind.ORPHAN,
                detail=why,
                brand_ids=(a.brand_id,),
                attempt_id=a.attempt_id,
                action=Action.RELEASE,
            )
        if credited:
            why = f"credited to several attempts: {', '.join(a.attempt_id for a in credited)}"
            brands = tuple(sorted({a.brand_id for a in credited}))
            return replace(foreign, kind=Kind.UNCLEAR, detail=why, brand_ids=brands)
        for a in attempts:
            held = dict(made[a.attempt_id].held)
            if member.id in held:
                why = f"attempt {a.attempt_id}'s lost create: {held[member.id]}"
                return replace(
                    foreign,
                    kind=Kind.UNCLEAR,
                    detail=why,
                    brand_ids=(a.brand_id,),
                    attempt_id=a.attempt_id,
                )
        if not classify_status(member.status).is_terminal:
            for a in attempts:
                new = {m.id for m in new_children((member,), title, self.parent_id, a.creates)}
                if made[a.attempt_id].unclear and member.id in new:
                    why = f"one of several new workspaces after attempt {a.attempt_id}'s create"
                    return replace(
                        foreign,
                        kind=Kind.UNCLEAR,
                        detail=why,
                        brand_ids=(a.brand_id,),
                        attempt_id=a.attempt_id,
                    )
        claim = self.record.claims.get(member.id)
        holder = claim.brand_id if claim else None
        facts = Facts(
            member.id,
            self.never,
            taken=holder and f"claimed by brand {holder}",
            same_title=True,
            status=member.status,
            projects=projects,
        )
        verdict = judge(facts)
        if verdict.owner is Owner.ADOPTABLE:
            return replace(foreign, kind=Kind.ADOPTABLE, detail=verdict.why)
        return foreign


# `audit --fix` is a plan, then an apply: what a run would do, checked again before
# it is done.


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One action a fix would take, with what made it right when it was planned."""

    parent_id: str
    workspace_id: str
    kind: str
    action: str
    attempt_id: str | None
    brand_ids: tuple[str, ...]
    title: str | None
    projects: int | None
    why: str

    @classmethod
    def of(cls, finding: Finding) -> PlanStep:
        return cls(
            finding.parent_id,
            finding.workspace_id,
            finding.kind.value,
            finding.action.value,
            finding.attempt_id,
            finding.brand_ids,
            finding.title,
            finding.projects,
            finding.detail,
        )

    @property
    def key(self) -> tuple[object, ...]:
        """What must be the same again for the step to be taken: not the prose."""
        return (
            self.parent_id,
            self.workspace_id,
            self.kind,
            self.action,
            self.attempt_id,
            self.brand_ids,
            self.projects,
        )


def plan(audits: Iterable[Audit]) -> list[PlanStep]:
    """Every finding with an action, as a step."""
    return [PlanStep.of(f) for a in audits for f in a.findings if f.action is not Action.NONE]


def still_true(steps: Iterable[PlanStep], audits: Iterable[Audit]) -> tuple[Audit, ...]:
    """The audits cut to the findings a plan named that hold as planned (same kind,
    action, attempt, brands and project count): only those may be acted on."""
    wanted = {step.key for step in steps}
    return tuple(
        replace(a, findings=tuple(f for f in a.findings if PlanStep.of(f).key in wanted))
        for a in audits
    )
