"""Projections equal the state replayed from the event log.

`project` applies events to a projection as the runner does, with no database;
`catch_up_all` catches every projection up with the log into a store.
`assert_projections_match` catches the projections up, then replays every Brand
and ProvisioningAttempt that has an event after `after` (straight from the
event store, through the aggregates) and compares each with its row.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from eventsourcing.utils import get_topic

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.policies import AttemptState, FailureReason, Provenance
from infrastructure.store.eventstore import ProvisionerApplication
from infrastructure.views.log_source import LogSource
from infrastructure.views.store import PROJECTIONS, SqlViewStore
from projections.brand_workspaces import brand_status
from projections.core import RowCache, catch_up

TERMINAL_EVENTS = (
    ProvisioningAttempt.Promoted,
    ProvisioningAttempt.Failed,
    ProvisioningAttempt.Cancelled,
    ProvisioningAttempt.Superseded,
)


def project(projection: Any, events: list[Any]) -> list[dict[str, Any]]:
    """What the runner does with a batch: the projection's topics only, in order."""
    rows = RowCache(projection.key, getattr(projection, "index", None))
    for event in events:
        if get_topic(type(event)) in projection.topics:
            projection.apply(event, rows)
    return rows.changed()


def catch_up_all(app: ProvisionerApplication, store: SqlViewStore) -> None:
    """Every projection caught up with the event log, as the projections runner does."""
    for projection in PROJECTIONS.values():
        catch_up(projection, LogSource(app), store)


def touched(app: ProvisionerApplication, after: int) -> tuple[set[UUID], set[UUID]]:
    brands: set[UUID] = set()
    attempts: set[UUID] = set()
    start = after + 1
    while notes := app.recorder.select_notifications(start, 1000):
        for note in notes:
            if ":Brand." in note.topic:
                brands.add(UUID(str(note.originator_id)))
            elif ":ProvisioningAttempt." in note.topic:
                attempts.add(UUID(str(note.originator_id)))
        start = notes[-1].id + 1
    return brands, attempts


def expected_brand_row(app: ProvisionerApplication, brand_id: UUID) -> dict[str, Any]:
    brand: Brand = app.repository.get(brand_id)
    state = reason = None
    if brand.current_attempt_id is not None:
        attempt: ProvisioningAttempt = app.repository.get(brand.current_attempt_id)
        state = attempt.state.value
        reason = attempt.failure_reason.value if attempt.failure_reason else None
    return {
        "id": str(brand.id),
        "brand_id": brand.brand_id,
        "title": brand.title,
        "lifecycle": brand.lifecycle,
        "status": brand_status(brand.lifecycle, state, brand.workspace_id, reason),
        "workspace_id": brand.workspace_id,
        "attempt_id": str(brand.current_attempt_id) if brand.current_attempt_id else None,
        "attempt_state": state,
        "failure_reason": reason,
        "purge_at": brand.purge_at,
        "emptying_refused": brand.emptying_refused,
    }


def expected_attempt_row(app: ProvisionerApplication, attempt_id: UUID) -> dict[str, Any]:
    attempt: ProvisioningAttempt = app.repository.get(attempt_id)
    events = list(app.events.get(attempt_id))
    finished = [e.timestamp for e in events if isinstance(e, TERMINAL_EVENTS)]
    hops = [0]
    for e in events:
        hop = getattr(e, "hop", None)
        if hop is not None:
            hops.append(hop if isinstance(e, ProvisioningAttempt.HopScheduled) else hop + 1)
    pending = attempt.state is AttemptState.PENDING
    return {
        "attempt_id": str(attempt.id),
        "brand_id": attempt.brand_id,
        "title": attempt.title,
        "state": attempt.state.value,
        "hops_used": max(hops),
        "next_hop": attempt.expected_hop,
        "candidate_id": attempt.candidate_id,
        "provenance": attempt.provenance.value if attempt.provenance else None,
        "failure_reason": attempt.failure_reason.value if attempt.failure_reason else None,
        "last_error": attempt.last_status or None,
        "started_at": attempt.created_on,
        "finished_at": finished[0] if finished else None,
        "next_hop_due": (attempt.not_before or attempt.created_on) if pending else None,
        "created_ids": list(attempt.created_ids),
        "released_ids": list(attempt.released_ids),
        "release_owed": len(attempt.owed_releases),
        "released": len(attempt.released_ids),
        "create_unresolved": int(attempt.create_unresolved),
        "create_lost": int(attempt.create_lost),
        "updated_at": attempt.modified_on,
    }


def mismatches(app: ProvisionerApplication, store: SqlViewStore, after: int) -> list[str]:
    brands, attempts = touched(app, after)
    problems = []
    bw, at = PROJECTIONS["brand_workspaces"], PROJECTIONS["attempts"]
    for brand_id in brands:
        [row] = store.rows(bw, "id = ?", [str(brand_id)]) or [None]
        want = expected_brand_row(app, brand_id)
        got = {k: row[k] for k in want} if row else None
        if got != want:
            problems.append(f"brand_workspaces {brand_id}: {got} != {want}")
    for attempt_id in attempts:
        [row] = store.rows(at, "attempt_id = ?", [str(attempt_id)]) or [None]
        want = expected_attempt_row(app, attempt_id)
        if row != want:
            problems.append(f"attempts {attempt_id}: {row} != {want}")
    return problems


def assert_projections_match(
    app: ProvisionerApplication, store: SqlViewStore, after: int = 0, *, tries: int = 3
) -> None:
    """Catch up and compare; a writer still finishing gets a few short retries."""
    source = LogSource(app)
    for attempt in range(tries):
        for projection in PROJECTIONS.values():
            catch_up(projection, source, store)
        problems = mismatches(app, store, after)
        if not problems:
            return
        if attempt < tries - 1:
            time.sleep(0.3)
    raise AssertionError("projections differ from the replayed state:\n" + "\n".join(problems))


FATES = ("promoted", "failed", "cancelled", "pending")


def seed_histories(
    app: ProvisionerApplication, count: int, *, parent: str = "p-seed", per_save: int = 100
) -> list[str]:
    """Save `count` brands with one finished-or-pending attempt each, made with the
    domain's own commands (no gateway): promoted, failed and released, cancelled by
    a deactivation, or pending with a hop scheduled. Returns the brand ids."""
    now = datetime.now(UTC)
    pending: list[Any] = []
    brand_ids = []
    for i in range(count):
        brand_id = f"seed-{uuid4().hex[:12]}"
        title = f"Seed {brand_id}"
        brand = Brand.register(brand_id, title, parent)
        attempt = ProvisioningAttempt.start(brand_id, title, parent, None, max_hop=5)
        brand.begin_attempt(attempt.id, title, parent, now)
        attempt.request_create(0, [], now)
        workspace_id = f"ws-{uuid4().hex[:12]}"
        attempt.accept_candidate(workspace_id, Provenance.CREATED, 0)
        fate = FATES[i % len(FATES)]
        if fate == "promoted":
            attempt.promote(0)
            brand.bind(workspace_id, attempt.id)
        elif fate == "failed":
            attempt.fail(FailureReason.EXHAUSTED, "status stayed creating", 0)
            attempt.record_release(workspace_id, 0)
        elif fate == "cancelled":
            brand.deactivate(now + timedelta(microseconds=1))
            attempt.cancel("brand deactivated")
        else:
            attempt.schedule_hop(1, now + timedelta(seconds=5), "creating")
        pending += [brand, attempt]
        brand_ids.append(brand_id)
        if len(pending) >= per_save:
            app.save(*pending)
            pending.clear()
    if pending:
        app.save(*pending)
    return brand_ids


def live_rows(store: SqlViewStore) -> dict[str, list[dict[str, Any]]]:
    """Every row of every projection's live copy, in key order."""
    return {
        name: store.rows(projection, order=projection.key)
        for name, projection in PROJECTIONS.items()
    }
