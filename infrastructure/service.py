"""The provisioning service: the use cases, over the event store and the gateway.

Request path (fast, no gateway calls):
    request_provisioning(brand_id, title, parent, requested_at=None) -> attempt id
    deactivate(brand_id, requested_at=None)

Both are ordered by `requested_at` (the producer's time; default: now): a
command older than the last one the brand applied, a redelivery of it, or the
loser of a tie with it (a deactivate wins a tie) is recorded as ignored and
raises `StaleCommand`; a newer provision for another title or parent supersedes
the pending attempt; a provision while the brand's workspace is being emptied,
or while a deactivated brand is still bound under another parent, raises
`RetryLater` (nothing recorded).

Off the request path (what the worker runs, one short step at a time):
    run_hop(attempt_id, hop) -> HopOutcome
    release(attempt_id)        the owed release of an attempt that ended unpromoted
    decommission(brand_id)     empty, unbind and unclaim a deactivated brand's workspace

Every state change is ONE `Application.save` of all the aggregates it touches.
A writer that loses a race gets `IntegrityError`, reloads and decides again
(at most `max_rounds` times per call). Gateway calls never happen while a
database transaction is open. A database failure propagates unchanged: the
attempt is untouched and the caller retries the whole step later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import IntegrityError, StoredEvent

from domain.attempt import ProvisioningAttempt
from domain.brand import DEACTIVATE, PROVISION, Brand
from domain.claim import WorkspaceClaim
from domain.errors import (
    AlreadyClaimed,
    AttemptInProgress,
    BrandDeactivated,
    CommandRefused,
    InvalidRequest,
    ProvisionerError,
    StaleCommand,
    UnknownAttempt,
    UnknownBrand,
)
from domain.ids import brand_aggregate_id, claim_aggregate_id, slot_aggregate_id
from domain.outcomes import HopOutcome, Outcome, StandDown
from domain.policies import (
    AttemptState,
    Backoff,
    FailureReason,
    Provenance,
    StatusClass,
    adoption_shortlist,
    classify_status,
    new_since,
    same_title,
)
from domain.ports import (
    AmbiguousCreate,
    Clock,
    FamilyMember,
    Gateway,
    GatewayError,
    MalformedAnswer,
    RequestRejected,
    TransientGatewayError,
    Unauthorized,
    WorkspaceGone,
)
from domain.slot import TitleSlot
from infrastructure.eventstore import ProvisionerApplication

log = logging.getLogger("provisioner.engine")

MAX_ID_CHARS = 200
FACTS_KEPT = 50_000  # attempts whose brand, parent and title a service remembers
STAND_DOWN_BY_STATE = {
    AttemptState.PROMOTED: StandDown.REDELIVERY_OF_PROMOTED,
    AttemptState.CANCELLED: StandDown.CANCELLED,
    AttemptState.SUPERSEDED: StandDown.SUPERSEDED,
    AttemptState.FAILED: StandDown.FAILED,
}


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    backoff: Backoff = field(default_factory=Backoff)
    stale_after_s: float = 600.0
    # How long an unconfirmed create may still turn up in the family listing;
    # until then no second create of that title is made under that parent.
    create_grace_s: float = 60.0
    max_rounds: int = 6


@dataclass(frozen=True, slots=True)
class Deactivation:
    brand_id: str
    already_deactivated: bool
    cancelled_attempt_id: UUID | None
    workspace_id: str | None


class ContentionError(RuntimeError):
    """Too many concurrent writers on one aggregate; retry the step later."""


MIN_SECRET_CHARS = 8


def _require_text(name: str, value: object, secrets: tuple[str, ...] = ()) -> str:
    """`value`, checked; a text holding one of `secrets` (the gateway token) is refused
    without echoing it, so it is never stored in an event or logged."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"{name} must be a non-empty string")
    if any(secret and secret in value for secret in secrets):
        raise InvalidRequest(f"{name} contains the gateway token: refused, not stored")
    if value != value.strip() or any(ord(c) < 32 for c in value):
        raise InvalidRequest(f"{name} must not have surrounding spaces or control characters")
    if len(value) > MAX_ID_CHARS:
        raise InvalidRequest(f"{name} must be at most {MAX_ID_CHARS} characters")
    return value


def _require_aware(requested_at: datetime | None) -> None:
    if requested_at is not None and requested_at.utcoffset() is None:
        raise InvalidRequest("requested_at must carry a UTC offset")


class ProvisioningService:
    def __init__(
        self,
        app: ProvisionerApplication,
        gateway: Gateway,
        clock: Clock | None = None,
        settings: EngineSettings | None = None,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.gateway = gateway
        # Texts that must never reach an event or a log line (the gateway token);
        # one shorter than MIN_SECRET_CHARS would refuse ordinary ids, so it is not
        # looked for (a real bearer token is far longer).
        self.secrets = tuple(s for s in secrets if len(s) >= MIN_SECRET_CHARS)
        self.clock: Clock = clock or SystemClock()
        self.settings = settings or EngineSettings()
        # What an attempt started with (brand, parent, title) never changes: once
        # known here, a hop reads the attempt, its title slot and its brand in
        # one query instead of two. Bounded: forgotten wholesale when full.
        self._facts: dict[UUID, tuple[str, str, str]] = {}

    # Reads.

    def load(self, *aggregate_ids: UUID) -> list[object | None]:
        """The current state of each aggregate (None if it has no events).

        Without a cache or snapshots (this project configures neither) the events
        are read and applied here, several aggregates in one query when the
        recorder offers it (`select_events_of` on PostgreSQL); otherwise through
        the repository. Same state either way: an aggregate is its events applied
        in order.
        """
        repository = self.app.repository
        if repository.cache is not None or repository.snapshot_store is not None:
            return [self._get(aggregate_id) for aggregate_id in aggregate_ids]
        select_many = getattr(self.app.recorder, "select_events_of", None)
        if select_many is None:
            return [self._get(aggregate_id) for aggregate_id in aggregate_ids]
        by_id: dict[object, list[StoredEvent]] = {}
        for stored in select_many(aggregate_ids):
            # Keyed as UUIDs whatever the driver returns (or the caller passed).
            by_id.setdefault(UUID(str(stored.originator_id)), []).append(stored)
        to_domain_event = self.app.mapper.to_domain_event
        found: list[object | None] = []
        for aggregate_id in aggregate_ids:
            aggregate: Any = None
            for stored in by_id.get(UUID(str(aggregate_id)), ()):
                event: Any = to_domain_event(stored)
                aggregate = event.mutate(aggregate)
            found.append(aggregate)
        return found

    def _get(self, aggregate_id: UUID) -> object | None:
        try:
            aggregate: object = self.app.repository.get(aggregate_id)
        except AggregateNotFoundError:
            return None
        return aggregate

    def brand(self, brand_id: str) -> Brand:
        (brand,) = self.load(brand_aggregate_id(brand_id))
        return self._as_brand(brand, brand_id)

    @staticmethod
    def _as_brand(brand: object | None, brand_id: str) -> Brand:
        if brand is None:
            raise UnknownBrand(f"no brand {brand_id!r} is registered")
        assert isinstance(brand, Brand)
        return brand

    def attempt(self, attempt_id: UUID) -> ProvisioningAttempt:
        (attempt,) = self.load(attempt_id)
        return self._as_attempt(attempt, attempt_id)

    def _as_attempt(self, attempt: object | None, attempt_id: UUID) -> ProvisioningAttempt:
        if attempt is None:
            raise UnknownAttempt(f"no attempt {attempt_id} exists")
        if not isinstance(attempt, ProvisioningAttempt):
            raise UnknownAttempt(f"{attempt_id} is not a provisioning attempt")
        self._remember(attempt)
        return attempt

    def _remember(self, attempt: ProvisioningAttempt) -> None:
        if attempt.id not in self._facts:
            if len(self._facts) >= FACTS_KEPT:
                self._facts.clear()
            self._facts[attempt.id] = (
                attempt.brand_id,
                attempt.parent_workspace_id,
                attempt.title,
            )

    def attempt_in_context(
        self, attempt_id: UUID
    ) -> tuple[ProvisioningAttempt, tuple[TitleSlot, Brand] | None]:
        """The attempt and, when its facts are known here, its title slot and its
        brand read in the same query (else None: read them when needed)."""
        facts = self._facts.get(attempt_id)
        if facts is None:
            return self.attempt(attempt_id), None
        brand_id, parent, title = facts
        attempt, slot, brand = self.load(
            attempt_id, slot_aggregate_id(parent, title), brand_aggregate_id(brand_id)
        )
        return self._as_attempt(attempt, attempt_id), (
            self._as_slot(slot, parent, title),
            self._as_brand(brand, brand_id),
        )

    def attempt_history(self, attempt_id: UUID) -> list[Aggregate.Event]:
        """The attempt's events, oldest first: its audit trail."""
        return [
            event for event in self.app.events.get(attempt_id) if isinstance(event, Aggregate.Event)
        ]

    def slot(self, parent_workspace_id: str, title: str) -> TitleSlot:
        """The title slot, opened (unsaved) if it does not exist yet."""
        (slot,) = self.load(slot_aggregate_id(parent_workspace_id, title))
        return self._as_slot(slot, parent_workspace_id, title)

    @staticmethod
    def _as_slot(slot: object | None, parent_workspace_id: str, title: str) -> TitleSlot:
        if slot is None:
            return TitleSlot.open(parent_workspace_id, title)
        assert isinstance(slot, TitleSlot)
        return slot

    def slot_and_brand(self, attempt: ProvisioningAttempt) -> tuple[TitleSlot, Brand]:
        """The attempt's title slot and its brand, in one read."""
        parent, title = attempt.parent_workspace_id, attempt.title
        slot, brand = self.load(
            slot_aggregate_id(parent, title), brand_aggregate_id(attempt.brand_id)
        )
        return self._as_slot(slot, parent, title), self._as_brand(brand, attempt.brand_id)

    def claim(self, workspace_id: str) -> WorkspaceClaim | None:
        (claim,) = self.load(claim_aggregate_id(workspace_id))
        if claim is None:
            return None
        assert isinstance(claim, WorkspaceClaim)
        return claim

    # Request path.

    def request_provisioning(
        self,
        brand_id: str,
        title: str,
        parent_workspace_id: str,
        requested_at: datetime | None = None,
    ) -> UUID:
        """Begin an attempt for the brand; registers or reactivates the brand as needed.

        A pending attempt for another title or parent is superseded; one for the
        same title and parent serves the request (AttemptInProgress, the time
        noted). Raises StaleCommand (after recording it) if the command is stale
        (see `Brand.stale_because`), RetryLater while its workspace is being
        emptied or a deactivated brand is still bound under another parent.
        """
        _require_text("brand_id", brand_id, self.secrets)
        _require_text("title", title, self.secrets)
        _require_text("parent_workspace_id", parent_workspace_id, self.secrets)
        _require_aware(requested_at)
        for _ in range(self.settings.max_rounds):
            try:
                return self._begin_attempt(brand_id, title, parent_workspace_id, requested_at)
            except IntegrityError:
                log.info("request raced another writer; deciding again brand=%s", brand_id)
        raise ContentionError(f"brand {brand_id} is being changed concurrently; retry")

    def _begin_attempt(
        self,
        brand_id: str,
        title: str,
        parent_workspace_id: str,
        requested_at: datetime | None,
    ) -> UUID:
        try:
            brand = self.brand(brand_id)
        except UnknownBrand:
            brand = Brand.register(brand_id, title, parent_workspace_id)
        at = brand.command_time(requested_at, self.clock.now())
        self._refuse_if_stale(brand, PROVISION, at, title, parent_workspace_id)
        brand.check_provision_possible(parent_workspace_id)
        if not brand.is_active:
            brand.reactivate()
        touched: list[Aggregate] = [brand]
        old = self.attempt(brand.current_attempt_id) if brand.current_attempt_id else None
        if old is not None and not old.is_terminal:
            served = (old.title, old.parent_workspace_id) == (title, parent_workspace_id)
            if served and not old.is_stale(self.clock.now(), self.settings.stale_after_s):
                brand.note_provision(old.id, at)  # the pending attempt serves it
                self.app.save(brand)
                retry_at = old.modified_on + timedelta(seconds=self.settings.stale_after_s)
                raise AttemptInProgress(
                    f"brand {brand_id} already has attempt {old.id} pending (hop "
                    f"{old.expected_hop}) for this title and parent; wait for it, or retry "
                    f"after {retry_at.isoformat(timespec='seconds')} when it counts as stale"
                )
            # Another title or parent (the newer command wins), or a stale attempt:
            # superseded in the same save; what it created is released after it.
            touched.append(old)
        same_parent = parent_workspace_id == brand.parent_workspace_id
        new = ProvisioningAttempt.start(
            brand_id=brand_id,
            title=title,
            parent_workspace_id=parent_workspace_id,
            existing_workspace_id=brand.workspace_id if same_parent else None,
            max_hop=self.settings.backoff.max_requeues,
        )
        if old is not None and not old.is_terminal:
            old.supersede(new.id)
        brand.begin_attempt(new.id, title, parent_workspace_id, at)
        self.app.save(*touched, new)
        self._remember(new)
        log.info(
            "attempt started brand=%s attempt=%s superseded=%s",
            brand_id,
            new.id,
            old.id if old is not None and old.state is AttemptState.SUPERSEDED else None,
        )
        return new.id

    def _refuse_if_stale(
        self, brand: Brand, command: str, at: datetime, title: str = "", parent: str = ""
    ) -> None:
        """Record a stale command on the brand and raise StaleCommand; else nothing."""
        reason = brand.ignore_if_stale(command, at, title, parent)
        if reason is None:
            return
        self.app.save(brand)  # IntegrityError: the caller decides again
        log.info("stale command ignored brand=%s command=%s: %s", brand.brand_id, command, reason)
        raise StaleCommand(f"brand {brand.brand_id}: {reason}; ignored")

    def deactivate(self, brand_id: str, requested_at: datetime | None = None) -> Deactivation:
        """Record the deactivation and cancel a pending attempt, in one save.

        A brand never seen is recorded as deactivated (a tombstone). Raises
        StaleCommand (after recording it) if the command is stale (older than the
        last command applied, or a redelivery of it; a deactivate at the same time
        as a provision wins the tie and applies).
        """
        _require_text("brand_id", brand_id, self.secrets)
        _require_aware(requested_at)
        for _ in range(self.settings.max_rounds):
            try:
                return self._deactivate(brand_id, requested_at)
            except IntegrityError:
                continue
        raise ContentionError(f"brand {brand_id} is being changed concurrently; retry")

    def _deactivate(self, brand_id: str, requested_at: datetime | None) -> Deactivation:
        (found,) = self.load(brand_aggregate_id(brand_id))
        if found is None:
            tomb = Brand.tombstone(brand_id, requested_at or self.clock.now())
            self.app.save(tomb)
            log.info("unknown brand recorded as deactivated brand=%s", brand_id)
            return Deactivation(brand_id, False, None, None)
        brand = self._as_brand(found, brand_id)
        at = brand.command_time(requested_at, self.clock.now())
        self._refuse_if_stale(brand, DEACTIVATE, at)
        already = not brand.is_active
        brand.deactivate(at)
        touched: list[Aggregate] = [brand]
        cancelled: UUID | None = None
        if not already and brand.current_attempt_id is not None:
            current = self.attempt(brand.current_attempt_id)
            if not current.is_terminal:
                current.cancel("brand deactivated")
                touched.append(current)
                cancelled = current.id
        self.app.save(*touched)
        log.info("brand deactivated brand=%s cancelled=%s", brand_id, cancelled)
        return Deactivation(brand_id, already, cancelled, brand.workspace_id)

    # Off the request path.

    def run_hop(self, attempt_id: UUID, hop: int) -> HopOutcome:
        outcome = _Hop(self, attempt_id, hop).run()
        log.info(
            "hop done brand=%s attempt=%s hop=%d outcome=%s%s workspace=%s detail=%s",
            outcome.brand_id,
            outcome.attempt_id,
            outcome.hop,
            outcome.outcome.value,
            f"({outcome.stand_down.value})" if outcome.stand_down else "",
            outcome.workspace_id,
            outcome.detail,
        )
        return outcome

    def release(self, attempt_id: UUID) -> tuple[str, ...]:
        """Perform what an attempt that ended unpromoted still owes; safe to repeat."""
        for _ in range(self.settings.max_rounds):
            attempt = self.attempt(attempt_id)
            if not attempt.is_terminal:
                return ()
            try:
                return self._settle(attempt)
            except IntegrityError:
                continue
        raise ContentionError(f"attempt {attempt_id} is being changed concurrently; retry")

    def expire(self, attempt_id: UUID, started_before: datetime) -> bool:
        """Fail a pending attempt that started before `started_before`: its deadline.

        The reconciler's last resort, for an attempt whose hops cannot run (its
        message dead-lettered again and again). Saved like any failure, version
        checked: a hop that commits first wins, one that commits later finds the
        attempt failed and stands down. What it owes is released by the release
        message the relay publishes for every `Failed`. Returns whether it failed it.
        """
        for _ in range(self.settings.max_rounds):
            attempt = self.attempt(attempt_id)
            if attempt.is_terminal or attempt.created_on >= started_before:
                return False
            age_s = (self.clock.now() - attempt.created_on).total_seconds()
            attempt.fail(
                FailureReason.DEADLINE,
                f"still pending {age_s:.0f} s after it started (hop {attempt.expected_hop})",
                attempt.expected_hop,
            )
            try:
                self.app.save(attempt)
            except IntegrityError:
                continue
            log.warning("attempt failed at its deadline attempt=%s", attempt_id)
            return True
        raise ContentionError(f"attempt {attempt_id} is being changed concurrently; retry")

    def decommission(self, brand_id: str) -> int | None:
        """Empty a deactivated brand's workspace, then unbind it and release its claim.

        Returns the number of projects deleted, or None when there was nothing
        to do (brand active again, or no workspace bound). Safe to repeat.
        """
        for _ in range(self.settings.max_rounds):
            brand = self.brand(brand_id)
            if brand.is_active or brand.workspace_id is None:
                return None
            workspace_id = brand.workspace_id
            if brand.decommissioning != workspace_id:
                # On record before any delete: a reactivation now waits for us.
                brand.start_decommission()
                try:
                    self.app.save(brand)
                except IntegrityError:
                    continue
            deleted = self.empty_workspace(workspace_id)
            brand.unbind("decommissioned", deleted)
            touched: list[Aggregate] = [brand]
            claim = self.claim(workspace_id)
            if claim is not None and claim.brand_id == brand_id:
                claim.release("decommissioned")
                touched.append(claim)
            try:
                self.app.save(*touched)
            except IntegrityError:
                continue
            log.info(
                "workspace decommissioned brand=%s workspace=%s projects_deleted=%d",
                brand_id,
                workspace_id,
                deleted,
            )
            return deleted
        raise ContentionError(f"brand {brand_id} is being changed concurrently; retry")

    # Shared steps.

    def empty_workspace(self, workspace_id: str) -> int:
        """Delete every project of the workspace (404 = already gone); never the workspace."""
        try:
            project_ids = self.gateway.list_projects(workspace_id)
        except WorkspaceGone:
            return 0
        for project_id in project_ids:
            self.gateway.delete_project(workspace_id, project_id)
        return len(project_ids)

    def claimed_by_other(self, workspace_id: str, brand_id: str) -> bool:
        claim = self.claim(workspace_id)
        return claim is not None and claim.held_by_other_than(brand_id)

    def taken_elsewhere(self, workspace_id: str, attempt: ProvisioningAttempt) -> bool:
        """Cannot be what the attempt's unresolved create made: another brand holds it,
        or another attempt has it on record as made by its own create.

        The second covers a shell that attempt created and released (unclaimed
        now) and the workspace of the brand's own next attempt (claimed by the
        same brand): both are new to an older create's baseline, and counted as
        candidates they would make the search ambiguous for good, so the orphan
        would never be recorded. The attempts the claim ever named are read.
        """
        claim: Any = None
        named: set[UUID] = set()
        for domain_event in self.app.events.get(claim_aggregate_id(workspace_id)):
            event: Any = domain_event
            claim = event.mutate(claim)
            by = getattr(event, "attempt_id", None)
            if isinstance(by, UUID) and by != attempt.id:
                named.add(by)
        if claim is None:
            return False
        assert isinstance(claim, WorkspaceClaim)
        if claim.held_by_other_than(attempt.brand_id):
            return True
        return bool(named) and any(
            isinstance(other, ProvisioningAttempt) and workspace_id in other.created_ids
            for other in self.load(*named)
        )

    def claim_for(self, workspace_id: str, brand_id: str, attempt_id: UUID) -> WorkspaceClaim:
        """The claim, opened if new, with the brand's claim pending on it."""
        claim = self.claim(workspace_id) or WorkspaceClaim.open(workspace_id)
        claim.claim(brand_id, attempt_id)
        return claim

    def adopted_claim_to_release(
        self,
        attempt: ProvisioningAttempt,
        lookup: Callable[[str], WorkspaceClaim | None] | None = None,
    ) -> WorkspaceClaim | None:
        """An adopted candidate's claim goes back when the attempt ends unpromoted."""
        if attempt.provenance is not Provenance.ADOPTED or attempt.candidate_id is None:
            return None
        claim = (lookup or self.claim)(attempt.candidate_id)
        if claim is None or claim.attempt_id != attempt.id:
            return None
        claim.release(f"attempt {attempt.state.value}")
        return claim

    def release_workspace(self, attempt: ProvisioningAttempt, workspace_id: str) -> bool:
        """Empty one workspace the attempt owes a release of, and record it.

        The claim is marked `Releasing` in its own version-checked save before
        any delete, so nobody adopts the workspace while it is being emptied. If
        a later attempt already holds the claim, the workspace was handed over:
        that is recorded and nothing is deleted. Returns True if it was emptied.
        """
        claim = self.claim(workspace_id)
        if (
            claim is not None
            and claim.releasing_by != attempt.id
            and claim.attempt_id not in (None, attempt.id)
        ):
            assert claim.attempt_id is not None
            attempt.record_hand_over(workspace_id, claim.attempt_id)
            self.app.save(attempt)
            return False
        claim = claim or WorkspaceClaim.open(workspace_id)
        if claim.releasing_by != attempt.id:
            claim.begin_release(attempt.brand_id, attempt.id)
            self.app.save(claim)
        deleted = self.empty_workspace(workspace_id)
        attempt.record_release(workspace_id, deleted)
        claim.release("emptied")
        self.app.save(attempt, claim)
        log.info(
            "released brand=%s attempt=%s workspace=%s projects_deleted=%d",
            attempt.brand_id,
            attempt.id,
            workspace_id,
            deleted,
        )
        return True

    def _settle(self, attempt: ProvisioningAttempt) -> tuple[str, ...]:
        """What an ended attempt still owes: releases, an unresolved create, claims, slot."""
        released = [ws for ws in attempt.owed_releases if self.release_workspace(attempt, ws)]
        if attempt.create_unresolved and attempt.state is not AttemptState.PROMOTED:
            found = self._find_orphan(attempt)
            if found is not None:
                orphan, slot = found
                attempt.record_created(orphan, attempt.expected_hop)
                slot.note_adoption(attempt.id, orphan)
                self.app.save(attempt, slot)
                if self.release_workspace(attempt, orphan):
                    released.append(orphan)
        touched: list[Aggregate] = []
        if attempt.state is not AttemptState.PROMOTED:
            claim = self.adopted_claim_to_release(attempt)
            if claim is not None:
                touched.append(claim)
        slot = self.slot(attempt.parent_workspace_id, attempt.title)
        if slot.holder == attempt.id and not attempt.create_unresolved:
            slot.free(attempt.id)
            touched.append(slot)
        if touched:
            self.app.save(*touched)
        return tuple(released)

    def _find_orphan(self, attempt: ProvisioningAttempt) -> tuple[str, TitleSlot] | None:
        """The workspace an unresolved create made, if the family shows exactly one,
        with the title slot as read before the family.

        Not while another attempt holds the slot afresh: its create of the same
        title may be in flight and would look like ours. Saved with the slot
        bumped, so a reservation taken after this read makes the save conflict.
        """
        slot = self.slot(attempt.parent_workspace_id, attempt.title)
        if slot.busy_for(attempt.id, self.clock.now(), self.settings.create_grace_s):
            return None
        family = self.gateway.family(attempt.parent_workspace_id, attempt.title)
        new = [
            m.id
            for m in new_since(
                family, attempt.title, attempt.parent_workspace_id, attempt.create_known_ids
            )
            if not self.taken_elsewhere(m.id, attempt)
        ]
        return (new[0], slot) if len(new) == 1 else None


class _Hop:
    """One run of one hop of one attempt (DESIGN §5), with its per-run memory."""

    def __init__(self, service: ProvisioningService, attempt_id: UUID, hop: int) -> None:
        self.svc = service
        self.attempt_id = attempt_id
        self.hop = hop
        # A workspace this run created and has not yet seen recorded: it must
        # end up the attempt's candidate or a recorded surplus, never forgotten.
        self.created: str | None = None
        self._family: list[FamilyMember] | None = None
        self._claim_read_needed = False
        self.released: list[str] = []
        # Aggregates changed alongside a just-accepted candidate (its claim, the
        # title slot): saved with the attempt's next save, which records the
        # candidate and the first poll's outcome in one transaction.
        self.pending: list[Aggregate] = []
        # The title slot as this run last saved it: no need to read it back.
        self._saved_slot: TitleSlot | None = None
        # The brand as read together with the title slot (one query instead of
        # two); a promotion saves it version-checked, so a brand that changed
        # meanwhile makes that save conflict and the next round reads afresh.
        self._brand: Brand | None = None
        # The title slot and the brand, read with the attempt (when its facts
        # were known): versions as of the start of this round.
        self._context: tuple[TitleSlot, Brand] | None = None

    @property
    def now(self) -> datetime:
        return self.svc.clock.now()

    def _save(self, attempt: ProvisioningAttempt, *others: Aggregate) -> None:
        self.svc.app.save(attempt, *self.pending, *others)
        self.pending = []
        if self.created in attempt.created_ids:
            self.created = None  # on record at last

    def _claim(self, workspace_id: str) -> WorkspaceClaim | None:
        """The workspace's claim: the copy already changed in this run, else a read."""
        for aggregate in self.pending:
            if isinstance(aggregate, WorkspaceClaim) and aggregate.workspace_id == workspace_id:
                return aggregate
        return self.svc.claim(workspace_id)

    def _slot(self, attempt: ProvisioningAttempt) -> TitleSlot:
        """The title slot: the copy already changed in this run, else the one read
        with the attempt at the start of this round, else a fresh read."""
        for aggregate in self.pending:
            if isinstance(aggregate, TitleSlot):
                return aggregate
        if self._saved_slot is not None:
            return self._saved_slot
        if self._context is not None:
            return self._context[0]
        return self.svc.slot(attempt.parent_workspace_id, attempt.title)

    def run(self) -> HopOutcome:
        for _ in range(self.svc.settings.max_rounds):
            attempt, self._context = self.svc.attempt_in_context(self.attempt_id)
            if self._context is not None:
                self._brand = self._context[1]
            try:
                return self._step(attempt)
            except IntegrityError:
                log.info(
                    "hop raced another writer; deciding again attempt=%s hop=%d",
                    self.attempt_id,
                    self.hop,
                )
                self._family = None
                self.pending = []
                self._saved_slot = None
                self._brand = None
        raise ContentionError(f"attempt {self.attempt_id} is contended; retry the hop later")

    def _step(self, attempt: ProvisioningAttempt) -> HopOutcome:
        placed_late = self.created is not None
        if placed_late:
            self._record_created(attempt)
            self._save(attempt)
        self._release_owed(attempt)
        gate = self._gate(attempt)
        if gate is not None and placed_late and gate.outcome is Outcome.DUPLICATE:
            # Our create is on record; a concurrent delivery already moved the attempt on.
            return self._stood_down(attempt, StandDown.CONCURRENT_DELIVERY, "next hop polls")
        if gate is not None:
            return gate
        if attempt.candidate_id is None:
            outcome = self._acquire(attempt)
            if outcome is not None:
                return outcome
        return self._poll(attempt)

    def _release_owed(self, attempt: ProvisioningAttempt) -> None:
        """Empty what the attempt owes (a surplus, or an ended attempt's candidate)."""
        try:
            if attempt.is_terminal:
                self.released.extend(self.svc._settle(attempt))
            else:
                for workspace_id in attempt.owed_releases:
                    if self.svc.release_workspace(attempt, workspace_id):
                        self.released.append(workspace_id)
        except GatewayError as exc:
            log.warning("release deferred attempt=%s: %s", attempt.id, exc)

    # Gate: terminal, duplicate and out-of-order deliveries.

    def _gate(self, attempt: ProvisioningAttempt) -> HopOutcome | None:
        if attempt.is_terminal:
            return self._stood_down(
                attempt, STAND_DOWN_BY_STATE[attempt.state], f"attempt is {attempt.state.value}"
            )
        if self.hop < attempt.expected_hop:
            return self._outcome(
                attempt,
                Outcome.DUPLICATE,
                f"hop {self.hop} already done; attempt expects hop {attempt.expected_hop}",
                stand_down=StandDown.STALE_HOP,
            )
        if self.hop > attempt.expected_hop:
            return self._stood_down(
                attempt, StandDown.FUTURE_HOP, f"attempt expects hop {attempt.expected_hop}"
            )
        return None

    # Create or adopt.

    def _family_of(self, attempt: ProvisioningAttempt) -> list[FamilyMember]:
        if self._family is None:
            self._family = self.svc.gateway.family(attempt.parent_workspace_id, attempt.title)
        return self._family

    def _acquire(self, attempt: ProvisioningAttempt) -> HopOutcome | None:
        """Give the attempt a candidate; None when it has one, else the hop's outcome."""
        try:
            if attempt.create_unresolved:
                outcome = self._recover_create(attempt)
                if outcome is not None or attempt.candidate_id is not None:
                    return outcome
            return self._adopt_or_create(attempt)
        except Unauthorized as exc:
            return self._fail(attempt, FailureReason.UNAUTHORIZED, f"gateway refused: {exc}")
        except WorkspaceGone as exc:
            return self._fail(attempt, FailureReason.REJECTED, f"parent workspace not found: {exc}")
        except GatewayError as exc:  # transient, malformed, refused read: try next hop
            return self._settling(attempt, f"gateway unavailable: {exc}")

    def _recover_create(self, attempt: ProvisioningAttempt) -> HopOutcome | None:
        """A create was requested and not recorded: find what it made, by the family.

        The title slot is read first. If another attempt holds it afresh (our
        reservation lapsed and it took over), its create of the same title may be
        in flight and would look like ours: wait. Otherwise what is new and not
        taken elsewhere (`taken_elsewhere`) is ours; the acceptance is saved with
        the slot bumped, so a reservation taken after our read makes it conflict
        and decide again.
        """
        slot = self._slot(attempt)
        if slot.busy_for(attempt.id, self.now, self.svc.settings.create_grace_s):
            return self._settling(attempt, f"another create titled {attempt.title!r} in flight")
        family = self._family_of(attempt)
        new = [
            m
            for m in new_since(
                family, attempt.title, attempt.parent_workspace_id, attempt.create_known_ids
            )
            if not self.svc.taken_elsewhere(m.id, attempt)
        ]
        if len(new) == 1:
            if slot.holder != attempt.id:  # no Freed to save: bump it another way
                slot.note_adoption(attempt.id, new[0].id)
            self._accept(attempt, new[0].id, Provenance.CREATED, slot)
            return None
        if len(new) > 1:
            return self._fail(
                attempt,
                FailureReason.AMBIGUOUS,
                f"{len(new)} new workspaces titled {attempt.title!r} after an unconfirmed create",
            )
        assert attempt.create_requested_at is not None
        waited = (self.now - attempt.create_requested_at).total_seconds()
        if attempt.create_requested_hop == self.hop or waited <= self.svc.settings.create_grace_s:
            # It may still appear: never create a second time meanwhile.
            return self._settling(attempt, "create unconfirmed; not in the family yet")
        return None  # long enough: that create did not happen; adopt or create afresh

    def _adopt_or_create(self, attempt: ProvisioningAttempt) -> HopOutcome | None:
        # The slot is read before the family, so an adoption that raced a
        # same-title create conflicts on the slot's version and decides again.
        slot, self._brand = self._context or self.svc.slot_and_brand(attempt)
        self._context = (slot, self._brand)
        grace = self.svc.settings.create_grace_s
        if slot.busy_for(attempt.id, self.now, grace):
            return self._settling(attempt, f"another create titled {attempt.title!r} in flight")
        family = self._family_of(attempt)
        eligible = [
            m
            for m in adoption_shortlist(family, attempt.title, attempt.parent_workspace_id)
            if not self.svc.claimed_by_other(m.id, attempt.brand_id) and self._is_empty(m.id)
        ]
        if len(eligible) == 1:
            slot.note_adoption(attempt.id, eligible[0].id)
            self._accept(attempt, eligible[0].id, Provenance.ADOPTED, slot)
            return None
        if len(eligible) > 1:
            return self._fail(
                attempt,
                FailureReason.AMBIGUOUS,
                f"{len(eligible)} adoptable workspaces titled {attempt.title!r}: "
                + ", ".join(sorted(m.id for m in eligible)),
            )
        return self._create(attempt, family, slot)

    def _is_empty(self, workspace_id: str) -> bool:
        try:
            return not self.svc.gateway.list_projects(workspace_id)
        except WorkspaceGone:
            return False

    def _create(
        self, attempt: ProvisioningAttempt, family: list[FamilyMember], slot: TitleSlot
    ) -> HopOutcome | None:
        known = [m.id for m in same_title(family, attempt.title, attempt.parent_workspace_id)]
        attempt.request_create(self.hop, known, self.now)
        slot.reserve(attempt.id, self.now, self.svc.settings.create_grace_s)
        try:
            self.svc.app.save(attempt, slot)
            self._saved_slot = slot
        except IntegrityError:
            again = self.svc.attempt(attempt.id)
            if again.create_requested_hop == self.hop and again.candidate_id is None:
                return self._stood_down(
                    again, StandDown.CONCURRENT_DELIVERY, "another delivery is creating"
                )
            raise
        parent = attempt.parent_workspace_id
        try:
            workspace_id = self.svc.gateway.create_child(parent, attempt.title)
        except AmbiguousCreate:
            log.warning("create unconfirmed attempt=%s hop=%d", attempt.id, self.hop)
            self._family = None
            return self._recover_create(attempt)
        except RequestRejected as exc:  # refused outright: nothing was made
            attempt.record_create_refused(self.hop, str(exc))
            return self._fail(attempt, FailureReason.REJECTED, f"create rejected: {exc}")
        except Unauthorized as exc:
            attempt.record_create_refused(self.hop, str(exc))
            return self._fail(attempt, FailureReason.UNAUTHORIZED, f"gateway refused: {exc}")
        except TransientGatewayError as exc:  # throttled (429) or never sent
            attempt.record_create_refused(self.hop, str(exc))
            return self._settling(attempt, f"gateway unavailable: {exc}")
        except MalformedAnswer as exc:
            return self._fail(attempt, FailureReason.GATEWAY_BUG, f"create answer: {exc}")
        if not workspace_id or workspace_id == parent:
            what = "the parent's id" if workspace_id else "no id"
            return self._fail(attempt, FailureReason.GATEWAY_BUG, f"create answered {what}")
        self.created = workspace_id
        return self._record_created(attempt)

    def _accept(
        self,
        attempt: ProvisioningAttempt,
        workspace_id: str,
        prov: Provenance,
        slot: TitleSlot | None = None,
    ) -> None:
        try:
            claim = self.svc.claim_for(workspace_id, attempt.brand_id, attempt.id)
        except AlreadyClaimed as exc:
            raise IntegrityError(str(exc)) from None  # decide again from fresh state
        attempt.accept_candidate(workspace_id, prov, self.hop)
        slot = slot or self._slot(attempt)
        slot.free(attempt.id)
        self.pending += [claim, slot]

    def _record_created(self, attempt: ProvisioningAttempt) -> HopOutcome | None:
        """Put what this run created on record: as the candidate, else as a surplus.

        The events are saved with the attempt's next save (right after the first
        poll on the fresh path). A surplus (the attempt moved on meanwhile) is owed
        a release, which the next step performs. Returns an outcome only when the
        attempt failed here.
        """
        workspace_id = self.created
        assert workspace_id is not None
        if workspace_id in attempt.created_ids:
            return None
        takes_candidate = attempt.candidate_id is None and attempt.state is not (
            AttemptState.PROMOTED
        )
        touched: list[Aggregate] = []
        if takes_candidate:
            try:
                touched.append(self._fresh_claim(workspace_id, attempt))
            except AlreadyClaimed as exc:
                # A "new" id that another brand already holds: a gateway bug. It is
                # not ours to release; never bind it.
                self.created = None
                log.error(  # noqa: TRY400 - an expected condition; a traceback adds nothing
                    "create answered a claimed workspace attempt=%s: %s", attempt.id, exc
                )
                return self._fail(attempt, FailureReason.GATEWAY_BUG, f"create answered {exc}")
        slot = self._slot(attempt)
        slot.free(attempt.id)
        attempt.record_created(workspace_id, self.hop)
        self.pending += [slot, *touched]
        if not takes_candidate:
            log.warning(
                "a create lost its race; releasing it attempt=%s workspace=%s",
                attempt.id,
                workspace_id,
            )
        return None

    def _fresh_claim(self, workspace_id: str, attempt: ProvisioningAttempt) -> WorkspaceClaim:
        """The claim of a workspace we just created: on the first try it cannot exist
        yet, so it is opened without a read; if it does exist, the save conflicts and
        the next round reads it."""
        if self._claim_read_needed:
            return self.svc.claim_for(workspace_id, attempt.brand_id, attempt.id)
        self._claim_read_needed = True
        claim = WorkspaceClaim.open(workspace_id)
        claim.claim(attempt.brand_id, attempt.id)
        return claim

    # Poll.

    def _poll(self, attempt: ProvisioningAttempt) -> HopOutcome:
        workspace_id = attempt.candidate_id
        assert workspace_id is not None
        try:
            raw = self.svc.gateway.status(workspace_id)
            status_class = classify_status(raw)
        except WorkspaceGone:
            raw, status_class = "gone (404)", StatusClass.TERMINAL
        except Unauthorized as exc:
            return self._fail(attempt, FailureReason.UNAUTHORIZED, f"gateway refused: {exc}")
        except GatewayError as exc:  # transient or malformed: still settling
            raw, status_class = f"unknown ({exc})", StatusClass.SETTLING
        if status_class is StatusClass.READY:
            return self._promote(attempt)
        if status_class is StatusClass.SETTLING:
            return self._settling(attempt, raw)
        if attempt.provenance is Provenance.EXISTING:
            return self._drop_existing(attempt, raw)
        return self._fail(
            attempt,
            FailureReason.TERMINAL_STATUS,
            f"workspace {workspace_id} reported status {raw!r}",
        )

    def _promote(self, attempt: ProvisioningAttempt) -> HopOutcome:
        workspace_id = attempt.candidate_id
        assert workspace_id is not None
        brand = self._brand or self.svc.brand(attempt.brand_id)
        try:
            brand.bind(workspace_id, attempt.id)
        except (BrandDeactivated, CommandRefused) as exc:
            # The brand moved on (deactivated, newer attempt) in a save that also
            # ended this attempt: re-read and stand down through the gate.
            raise IntegrityError(str(exc)) from None
        attempt.promote(self.hop)
        self._save(attempt, brand)
        return self._outcome(attempt, Outcome.PROMOTED, "ready", workspace_id=workspace_id)

    def _drop_existing(self, attempt: ProvisioningAttempt, raw: str) -> HopOutcome:
        """The bound workspace went terminal: unbind it; the next hop creates or adopts."""
        brand = self.svc.brand(attempt.brand_id)
        touched: list[Aggregate] = [brand]
        brand.unbind(f"status {raw!r}")
        claim = self.svc.claim(attempt.candidate_id or "")
        if claim is not None and claim.brand_id == attempt.brand_id:
            claim.release("bound workspace went terminal")
            touched.append(claim)
        attempt.drop_candidate(raw, self.hop)
        return self._settling(attempt, f"bound workspace reported {raw!r}", touched)

    # Endings.

    def _settling(
        self, attempt: ProvisioningAttempt, status: str, touched: list[Aggregate] | None = None
    ) -> HopOutcome:
        touched = touched or []
        backoff = self.svc.settings.backoff
        if self.hop < attempt.max_hop and backoff.can_requeue(self.hop):
            delay = backoff.delay_after(self.hop)
            not_before = self.now + timedelta(seconds=delay)
            attempt.schedule_hop(self.hop + 1, not_before, status)
            self._save(attempt, *touched)
            return self._outcome(
                attempt, Outcome.SCHEDULED, status, next_hop=self.hop + 1, delay_s=delay
            )
        return self._fail(
            attempt,
            FailureReason.EXHAUSTED,
            f"not confirmed after {self.hop + 1} hops; last: {status}",
            touched,
        )

    def _fail(
        self,
        attempt: ProvisioningAttempt,
        reason: FailureReason,
        message: str,
        touched: list[Aggregate] | None = None,
    ) -> HopOutcome:
        """Fail the attempt, then perform the release it owes.

        `Failed` is saved first (version-checked, with the candidate's claim
        marked `Releasing`): a concurrent delivery that promoted meanwhile makes
        this save conflict, so a promoted workspace is never emptied.
        """
        touched = list(touched or [])
        attempt.fail(reason, message, self.hop)
        for workspace_id in attempt.owed_releases:
            claim = self._claim(workspace_id)
            if claim is not None and claim.attempt_id == attempt.id:
                claim.begin_release(attempt.brand_id, attempt.id)
                touched.append(claim)
        claim = self.svc.adopted_claim_to_release(attempt, self._claim)
        if claim is not None:
            touched.append(claim)
        touched = [t for t in touched if t not in self.pending]
        slot = self._slot(attempt)
        if slot.holder == attempt.id and not attempt.create_unresolved:
            slot.free(attempt.id)
            if slot not in self.pending:
                touched.append(slot)
        self._save(attempt, *touched)
        self._release_owed(attempt)
        return self._outcome(attempt, Outcome.FAILED, f"{reason.value}: {message}")

    def _stood_down(self, attempt: ProvisioningAttempt, why: StandDown, detail: str) -> HopOutcome:
        return self._outcome(attempt, Outcome.STOOD_DOWN, detail, stand_down=why)

    def _outcome(
        self,
        attempt: ProvisioningAttempt,
        outcome: Outcome,
        detail: str,
        *,
        workspace_id: str | None = None,
        next_hop: int | None = None,
        delay_s: float | None = None,
        stand_down: StandDown | None = None,
    ) -> HopOutcome:
        return HopOutcome(
            outcome=outcome,
            attempt_id=attempt.id,
            brand_id=attempt.brand_id,
            hop=self.hop,
            detail=detail,
            workspace_id=workspace_id or attempt.candidate_id,
            next_hop=next_hop,
            delay_s=delay_s,
            stand_down=stand_down,
            released=tuple(self.released),
        )


__all__ = [
    "ContentionError",
    "Deactivation",
    "EngineSettings",
    "ProvisionerError",
    "ProvisioningService",
    "SystemClock",
]
