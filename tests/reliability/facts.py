"""Facts for the checks, read after the run: the event store (each brand, its
attempts and the claims of bound workspaces, replayed), the fake's admin state,
the dead-letter queue, both projections against a replay and a fresh rebuild,
and the captured logs."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any
from urllib.request import urlopen

from eventsourcing.application import project_aggregate

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.ids import brand_aggregate_id, claim_aggregate_id
from infrastructure.broker.dead_letters import DeadLetters
from infrastructure.store.eventstore import ProvisionerApplication, open_event_store
from infrastructure.views.log_source import LogSource
from infrastructure.views.store import PROJECTIONS, SqlViewStore
from tests.readmodels import mismatches
from tests.reliability.checks import AttemptFacts, BrandFacts


def fake_state(url: str) -> dict[str, Any]:
    with urlopen(f"{url}/_fake/state", timeout=30) as answer:
        state: dict[str, Any] = json.loads(answer.read())
        return state


def attempt_facts(app: ProvisionerApplication, attempt_id: Any) -> AttemptFacts:
    events = list(app.events.get(attempt_id))
    attempt: ProvisioningAttempt = project_aggregate(None, events)
    released = tuple(
        e.workspace_id for e in events if isinstance(e, ProvisioningAttempt.CandidateReleased)
    )
    return AttemptFacts(
        attempt_id=str(attempt.id),
        title=attempt.title,
        state=attempt.state.value,
        failure_reason=attempt.failure_reason.value if attempt.failure_reason else None,
        candidate_id=attempt.candidate_id,
        created_ids=tuple(attempt.created_ids),
        released_ids=released,
        events=tuple(type(e).__name__ for e in events),
        failure_message=attempt.last_status if attempt.failure_reason else None,
        deferrals=attempt.deferrals,
        create_times=tuple(
            e.timestamp.timestamp() for e in events if type(e).__name__ == "CreateRequested"
        ),
    )


def brand_facts(app: ProvisionerApplication, brand_id: str) -> BrandFacts | None:
    events = list(app.events.get(brand_aggregate_id(brand_id)))
    if not events:
        return None
    brand: Brand = project_aggregate(None, events)
    attempts = tuple(
        attempt_facts(app, e.attempt_id) for e in events if isinstance(e, Brand.AttemptBegun)
    )
    unbound = tuple(e.workspace_id for e in events if isinstance(e, Brand.WorkspaceUnbound))
    return BrandFacts(brand_id, brand.lifecycle, brand.workspace_id, attempts, unbound)


def claims_of(app: ProvisionerApplication, workspace_ids: set[str]) -> dict[str, str | None]:
    holders: dict[str, str | None] = {}
    for ws in workspace_ids:
        events = list(app.events.get(claim_aggregate_id(ws)))
        holders[ws] = project_aggregate(None, events).brand_id if events else None
    return holders


def dead_letter_bodies(broker_url: str, sent: Sequence[bytes] = ()) -> list[bytes]:
    """The dead letters' bodies. The queue keeps only the start of a long one: it stands
    for the body of `sent` its recorded sha256 is of (else for what is kept)."""
    whole = {hashlib.sha256(body).hexdigest(): body for body in sent}
    with DeadLetters(broker_url) as letters:
        return [whole.get(x.body_sha256, x.body) if x.truncated else x.body
                for x in letters.each()]  # fmt: skip


def projection_rows(url: str) -> dict[str, list[str]]:
    """Every row of both projections, as sorted JSON lines (comparable as they are)."""
    with SqlViewStore(url) as store:
        return {
            name: sorted(json.dumps(row, sort_keys=True, default=str) for row in store.rows(proj))
            for name, proj in PROJECTIONS.items()
        }


def projection_status(url: str) -> list[dict[str, Any]]:
    """`provisioner projections status`: per projection, its position and events behind."""
    app = open_event_store(url, pool_size=1)
    try:
        with SqlViewStore(url) as store:
            return store.status(LogSource(app, store))
    finally:
        app.close()


def replay_problems(app: ProvisionerApplication, url: str) -> list[str]:
    """The projections (caught up by the runner, not here) against the state
    replayed from the log."""
    problems = [
        f"{item['projection']} is {item['behind']} events behind"
        for item in projection_status(url)
        if item["behind"]
    ]
    with SqlViewStore(url) as store:
        problems += mismatches(app, store, 0)
    return problems


def rebuild_problems(before: dict[str, list[str]], after: dict[str, list[str]]) -> list[str]:
    problems = []
    for name, rows in before.items():
        gone = set(rows) - set(after.get(name, []))
        new = set(after.get(name, [])) - set(rows)
        problems += [f"{name}: live row not rebuilt: {row}" for row in sorted(gone)[:20]]
        problems += [f"{name}: rebuilt row not live: {row}" for row in sorted(new)[:20]]
    return problems
