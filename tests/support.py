"""Helpers shared by the engine tests."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from domain.outcomes import HopOutcome, Outcome
from domain.ports import Clock, FamilyMember, Gateway, TransientGatewayError
from infrastructure.eventstore import open_event_store
from infrastructure.service import EngineSettings, ProvisioningService


class ManualClock:
    """The tests' one clock: it moves when the test says `advance`.

    - `now()` is a datetime, what the service and the health checks read: the real
      time plus what was advanced, or `start` plus it (time standing still) when given;
    - calling it gives seconds on a monotonic scale that starts at `seconds`, what a
      pace, a token bucket or a family watch reads.
    """

    def __init__(self, start: datetime | None = None, *, seconds: float = 0.0) -> None:
        self.start = start
        self.offset = timedelta()
        self.seconds = seconds

    def now(self) -> datetime:
        return (self.start or datetime.now(UTC)) + self.offset

    def __call__(self) -> float:
        return self.seconds

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)
        self.seconds += seconds


def new_service(
    gateway: Gateway | None = None,
    clock: Clock | None = None,
    settings: EngineSettings | None = None,
    *,
    url: str = "memory://",
    **options: Any,
) -> ProvisioningService:
    """The service on a fresh event store (in memory unless `url` names one), for a
    test that makes several or one per Hypothesis example; a test that needs one
    takes the `service` fixture (tests/conftest.py). Without a gateway, what the
    test does must not call one."""
    return ProvisioningService(open_event_store(url), gateway, clock, settings, **options)  # type: ignore[arg-type]


def as_stored_before(stored: StoredEvent, *new_fields: str) -> StoredEvent:
    """A stored event as a version before `new_fields` (and `class_version`) existed
    wrote it: what an upcaster must read."""
    state: dict[str, Any] = json.loads(stored.state)
    for name in (*new_fields, "class_version"):
        state.pop(name, None)
    return StoredEvent(
        stored.originator_id, stored.originator_version, stored.topic, json.dumps(state).encode()
    )


def drive(
    service: ProvisioningService,
    attempt_id: UUID,
    advance: Callable[[float], None] | None = None,
    max_hops: int = 100,
) -> list[HopOutcome]:
    """Run hops as the worker would, following each scheduled (or deferred) next hop."""
    outcomes: list[HopOutcome] = []
    hop = 0
    for _ in range(max_hops):
        outcome = service.run_hop(attempt_id, hop)
        outcomes.append(outcome)
        if outcome.outcome not in (Outcome.SCHEDULED, Outcome.DEFERRED):
            return outcomes
        assert outcome.next_hop is not None
        if advance is not None and outcome.delay_s is not None:
            advance(outcome.delay_s)
        hop = outcome.next_hop
    raise AssertionError(f"attempt {attempt_id} did not end in {max_hops} hops")


class Intercepting:
    """A gateway that passes every call to a real one, with chosen calls replaced.

    Used only where the fake gateway has no knob for a behaviour (a create that
    answers the parent's id, a status that flips for one workspace).
    """

    def __init__(self, inner: Gateway) -> None:
        self.inner = inner
        self.create_answer: Callable[[str, str], str] | None = None
        self.status_answer: dict[str, Callable[[], str]] = {}
        self.family_down = False  # family listings fail as an outage would

    def create_child(self, parent_id: str, title: str) -> str:
        if self.create_answer is not None:
            return self.create_answer(parent_id, title)
        return self.inner.create_child(parent_id, title)

    def status(self, workspace_id: str) -> str:
        override = self.status_answer.get(workspace_id)
        return override() if override else self.inner.status(workspace_id)

    def family(self, parent_id: str, title: str | None = None) -> list[FamilyMember]:
        if self.family_down:
            raise TransientGatewayError("family: HTTP 503 (intercepted)")
        # The listing agrees with the overridden statuses, as the real gateway's would.
        members = self.inner.family(parent_id, title)
        return [FamilyMember(m.id, m.title, self._listed_status(m)) for m in members]

    def _listed_status(self, member: FamilyMember) -> str:
        override = self.status_answer.get(member.id)
        if override is None:
            return member.status
        try:
            return override()
        except Exception:
            return member.status

    def list_projects(self, workspace_id: str) -> list[str]:
        return self.inner.list_projects(workspace_id)

    def delete_project(self, workspace_id: str, project_id: str) -> None:
        self.inner.delete_project(workspace_id, project_id)


def rabbitmqctl(*args: str, timeout: float = 60.0) -> str:
    """Run the local RabbitMQ's rabbitmqctl; raises when it is missing or fails."""
    exe = shutil.which("rabbitmqctl")
    if exe is None:
        raise FileNotFoundError("rabbitmqctl is not on PATH (vhosts, users, closing connections)")
    done = subprocess.run(
        [exe, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {args[0]} failed: {done.stderr.strip()[-300:]}")
    return done.stdout


class RecordingBroker:
    """What a reconciler sweep would publish, kept instead of sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def publish(self, message: Any, delay_s: float = 0.0) -> None:
        self.sent.append(message)
