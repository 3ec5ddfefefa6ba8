"""Helpers shared by the tests: one clock, the service outside its fixture, a
recording broker and the fakes of a delivery, and the engine's drivers."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from eventsourcing.persistence import StoredEvent

from domain.outcomes import HopOutcome, Outcome
from domain.pacing import PaceRules
from domain.ports import Clock, FamilyMember, Gateway, TransientGatewayError
from infrastructure.broker import messages
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.outages import Outage
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import ProvisionerApplication, open_event_store
from worker.consumer import WorkerStats
from worker.delivery import Settler
from worker.retry_policy import DeadLetter


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


def pace_rules(**given: Any) -> PaceRules:
    """The pace's rules for a test: what it gives, else a burst of 10, a probe every
    10 s and a Retry-After held 300 s at most (a process's come from its settings,
    `Settings.pace()`)."""
    return PaceRules(**{"burst": 10, "probe_every_s": 10.0, "retry_after_max_s": 300.0, **given})


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


def as_stored_before(stored: StoredEvent, *new_fields: str, version: int = 1) -> StoredEvent:
    """A stored event as `version` of its class, before `new_fields` existed, wrote it
    (an event without them, as it is): what an upcaster must read."""
    state: dict[str, Any] = json.loads(stored.state)
    if not any(name in state for name in new_fields):
        return stored
    for name in new_fields:
        state.pop(name, None)
    state.pop("class_version", None)
    if version > 1:
        state["class_version"] = version
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


def event_names(app: ProvisionerApplication, aggregate_id: UUID) -> list[str]:
    """The names of an aggregate's events, oldest first."""
    return [type(e).__name__ for e in app.events.get(aggregate_id)]


def creates(fake: FakeGateway, title: str) -> int:
    """How many creates of this title reached the fake gateway."""
    return int(fake.state()["creates"].get(title, 0))


def upstream(fake: FakeGateway, title: str) -> list[dict[str, Any]]:
    """The fake gateway's workspaces of this title, as its admin state lists them."""
    return [w for w in fake.state()["workspaces"] if w["title"] == title]


def upstream_workspace(fake: FakeGateway, workspace_id: str) -> dict[str, Any]:
    """The fake gateway's one workspace of this id."""
    [workspace] = [w for w in fake.state()["workspaces"] if w["id"] == workspace_id]
    return workspace


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


def words(text: str) -> str:
    """The text as read across folded lines and table rules: words, single-spaced."""
    return " ".join(re.sub(r"[│─]", " ", text).split())


def rabbitmqctl(*args: str, timeout: float = 60.0, stdin: str | None = None) -> str:
    """Run the local RabbitMQ's rabbitmqctl (`stdin` its input, as add_user reads a
    password); raises when it is missing or fails."""
    exe = shutil.which("rabbitmqctl")
    if exe is None:
        raise FileNotFoundError("rabbitmqctl is not on PATH (vhosts, users, closing connections)")
    done = subprocess.run(
        [exe, *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {args[0]} failed: {done.stderr.strip()[-300:]}")
    return done.stdout


class RecordingBroker:
    """The tests' one broker that sends nothing: what a worker's settling or a
    reconciler's sweep publishes is kept instead.

    `published` holds (message, delay, headers) in order, `sent` the messages
    alone; `dead` the dead letters (body, reason, errors, source) and `kept` what
    each kept of the original's properties. `fail_publish` and `fail_dead` refuse
    that many first calls, as a broker that nacks or has no dead-letter queue bound.
    """

    def __init__(self, *, fail_publish: int = 0, fail_dead: int = 0) -> None:
        self.published: list[tuple[messages.Message, float, dict[str, Any] | None]] = []
        self.dead: list[tuple[bytes, str, dict[str, Any], str]] = []
        self.kept: list[dict[str, Any]] = []
        self.fail_publish = fail_publish
        self.fail_dead = fail_dead

    @property
    def sent(self) -> list[messages.Message]:
        return [message for message, _, _ in self.published]

    def publish(
        self, message: messages.Message, delay_s: float = 0.0, headers: dict[str, Any] | None = None
    ) -> None:
        if self.fail_publish:
            self.fail_publish -= 1
            raise RuntimeError("the broker refused (nacked) a message")
        self.published.append((message, delay_s, headers))

    def publish_dead(
        self,
        body: bytes,
        reason: str,
        errors: dict[str, Any],
        source: str,
        kept: Mapping[str, Any] | None = None,
    ) -> None:
        self.kept.append(dict(kept or {}))
        if self.fail_dead:
            self.fail_dead -= 1
            raise RuntimeError("no queue bound for provisioning/dead")
        json.dumps(errors, default=str)  # the errors travel as JSON in a header
        self.dead.append((body, reason, errors, source))


# The worker's side of a delivery, with no broker: a message as kombu hands it over,
# and the settler that acks, re-publishes or dead-letters it onto a RecordingBroker.

GOOD = messages.hop(uuid4(), 0).encode()


class FakeMessage:
    """The parts of a kombu message the worker uses."""

    def __init__(
        self,
        body: Any = GOOD,
        headers: Any = None,
        *,
        content_type: Any = "application/json",
        content_encoding: Any = "utf-8",
        errors: list[Any] | None = None,
        ack_error: Exception | None = None,
    ) -> None:
        self.body = body
        self.headers = headers if headers is not None else {}
        self.content_type = content_type
        self.content_encoding = content_encoding
        self.delivery_info = {"routing_key": "work"}
        self.errors = errors or []
        self.ack_error = ack_error
        self.state = "RECEIVED"

    @property
    def acknowledged(self) -> bool:
        return self.state != "RECEIVED"

    def ack(self) -> None:
        if self.ack_error is not None:
            raise self.ack_error
        self.state = "ACK"

    def reject(self, requeue: bool = False) -> None:
        self.state = "REQUEUED" if requeue else "REJECTED"

    def requeue(self) -> None:
        self.state = "REQUEUED"


class BrokerDown(ConnectionError):
    pass


def settler(
    publisher: Any,
    delays: tuple[float, ...] = (1.0, 5.0),
    *,
    connection_errors: tuple[type[BaseException], ...] = (BrokerDown,),
    **options: Any,
) -> Settler:
    """A worker's settler onto `publisher` (a RecordingBroker, or a real broker):
    retried `delays` apart, `connection_errors` taken for a lost connection; `options`
    as Settler takes them (the producers' `scopes`, the `secrets` to hide)."""
    return Settler(
        publisher,
        stats=WorkerStats(),
        retry_delays_s=delays,
        connection_errors=connection_errors,
        database=Outage(logging.getLogger("test"), "worker", "db", announce_start=False),
        dead_letter=DeadLetter,
        **options,
    )


def finished(result: str | BaseException) -> Future[str]:
    future: Future[str] = Future()
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
    return future
