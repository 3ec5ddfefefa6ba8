"""The service as a state machine (hypothesis, RuleBasedStateMachine), on the memory
event store and the in-memory gateway: no sockets, no database.

Rules interleave at random what the world does to the service: provision and
deactivate commands (some late), hop deliveries (in any order, duplicated,
stale, ahead of time), gateway faults (creates lost, never made, made late,
answered with the parent's id; 429/5xx/401 on any call; zombies and ready
same-title others; statuses that settle, fail or turn `creation_failed`;
workspaces that vanish or get projects), the reconciler's sweep (overdue hops,
releases, decommissions, deadlines), the clock, and calls that run *inside* a
gateway call of another (a hook of the gateway), which is how two deliveries
race on the same aggregates here.

After every step the promises that hold at all times are checked; at the end
the machine drains (what the relay and the reconciler would do until nothing
is pending) and checks what must hold once everything ended (`teardown`):

- every attempt ended;
- an active brand whose last attempt was promoted is bound to exactly one ready
  workspace, whose claim names it; no workspace is bound to two brands;
- every workspace our creates made is on record (an attempt's `created_ids`),
  and bound, or released with the release recorded, or the candidate of an
  attempt that failed on a terminal status (never usable, docs/architecture.md);
- an attempt made more than one workspace only where its log shows why: a
  create given up unconfirmed (`create_lost`) or a candidate dropped after
  `creation_failed`;
- the parent is never a candidate, claimed, bound, or emptied;
- a deactivated brand holds no workspace once its decommission ran;
- both projections, caught up, equal the state replayed from the log.

What the gateway's contract cannot tell apart is not held against the service, and
is said where the check makes the exception: a same-title workspace of someone
else's that appears while an orphan search of that title may run (a *lookalike*:
no idempotency key), and an id a create answers that was there before (`echo`, a
gateway bug).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

from hypothesis import event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from domain.brand import Brand
from domain.errors import AttemptInProgress, RetryLater, StaleCommand, UnknownBrand
from domain.ids import brand_aggregate_id
from domain.outcomes import HopOutcome
from domain.policies import AttemptState, FailureReason, StatusClass, classify_status
from domain.ports import (
    GatewayError,
    MalformedAnswer,
    RequestRejected,
    TransientGatewayError,
    Unauthorized,
    WorkspaceGone,
)
from domain.waits import Backoff
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import open_event_store
from infrastructure.views.log_source import LogSource
from infrastructure.views.store import PROJECTIONS, SqlViewStore, memory_views_url
from projections.core import catch_up
from tests.memory_gateway import MemoryGateway
from tests.readmodels import mismatches
from tests.strategies import scaled
from tests.support import ManualClock, new_service

PARENT = "parent-1"
BRANDS = ("b1", "b2", "b3")
TITLES = ("Acme", "Bolt")  # the parent is titled "Acme" too: it must never be taken
MAX_REQUEUES = 3
DEADLINE_S = 3600.0
# Commands the service refuses for now or as stale: the worker acks or retries them.
REFUSED = (AttemptInProgress, RetryLater, StaleCommand)

SETTLING = ("not ready", "creating")
FINAL = ("created", "Active", " ready ", "not ready", "creation_failed", "failed", "error")
ERRORS: dict[str, Callable[[], GatewayError]] = {
    "429": lambda: TransientGatewayError("429 too many requests"),
    "503": lambda: TransientGatewayError("503 after retries"),
    "401": lambda: Unauthorized("401"),
    "409": lambda: RequestRejected("409 quota"),
    "garbled": lambda: MalformedAnswer("not JSON"),
    "404": lambda: WorkspaceGone("404"),
}
CREATES = ("ok", "ok", "lost", "none", "late", "lost5xx", "none5xx", "parent", "noid", "echo",
           "429", "503", "401", "409")  # fmt: skip
METHODS = ("create_child", "status", "family", "list_projects", "delete_project")


class ServiceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.gateway = MemoryGateway(PARENT)
        self.gateway.workspaces[PARENT].title = "Acme"
        self.gateway.workspaces[PARENT].projects = ["parent-project"]
        self.clock = ManualClock()
        # Emptied at once on a decommission: the retention window is tested on its own.
        settings_ = EngineSettings(backoff=Backoff(5.0, MAX_REQUEUES), decommission_delay_s=0.0)
        self.app = open_event_store("memory://")
        self.service = ProvisioningService(self.app, self.gateway, self.clock, settings_)
        self.queue: list[tuple[UUID, int]] = []  # hop messages published, not consumed
        self.sent: list[tuple[UUID, int]] = []  # every hop message ever published
        self.attempts: list[UUID] = []
        # Workspaces whose status went bad (or that vanished) after they were ready:
        # the gateway's doing, not ours; a brand bound to one is not "ready".
        self.spoiled: set[str] = set()
        # Others' same-title workspaces that appeared while what one of our creates of
        # that title made may still show up (unconfirmed, or given up: the orphan search
        # runs for an hour): by the gateway's contract (no idempotency key) they look
        # exactly like it, and recovery or the orphan search may take them as ours.
        self.lookalikes: set[str] = set()
        self.lookalike_titles: set[str] = set()  # ... even those that vanished since
        self.depth = 0

    # Commands.

    def _command(self, call: Callable[[], Any], what: str) -> Any:
        try:
            result = call()
        except REFUSED as exc:
            note(f"{what}: {type(exc).__name__}")
            return None
        note(f"{what}: {result}")
        return result

    def _request(self, brand: str, title: str, late: int | None) -> None:
        at = None if late is None else self.clock.now() - timedelta(seconds=late)
        attempt_id = self._command(
            lambda: self.service.request_provisioning(brand, title, PARENT, at),
            f"provision {brand} {title!r} late={late}",
        )
        if attempt_id is not None:
            self.attempts.append(attempt_id)
            self._publish(attempt_id, 0)

    def _deactivate(self, brand: str, late: int | None) -> None:
        at = None if late is None else self.clock.now() - timedelta(seconds=late)
        self._command(lambda: self.service.deactivate(brand, at), f"deactivate {brand}")

    @initialize(brand=st.sampled_from(BRANDS), title=st.sampled_from(TITLES))
    def first_request(self, brand: str, title: str) -> None:
        self._request(brand, title, None)

    @rule(
        brand=st.sampled_from(BRANDS),
        title=st.sampled_from(TITLES),
        late=st.sampled_from([None, None, 0, 2]),
    )
    def request(self, brand: str, title: str, late: int | None) -> None:
        self._request(brand, title, late)

    @rule(brand=st.sampled_from(BRANDS), late=st.sampled_from([None, None, 0, 2]))
    def deactivate(self, brand: str, late: int | None) -> None:
        self._deactivate(brand, late)

    # Deliveries.

    def _publish(self, attempt_id: UUID, hop: int) -> None:
        self.queue.append((attempt_id, hop))
        self.sent.append((attempt_id, hop))

    def _hop(self, attempt_id: UUID, hop: int) -> HopOutcome:
        outcome = self.service.run_hop(attempt_id, hop)
        note(
            f"hop {hop} of {str(attempt_id)[:8]}: {outcome.outcome.value} "
            f"{outcome.stand_down or ''} {outcome.detail} ws={outcome.workspace_id} "
            f"released={outcome.released}"
        )
        if outcome.next_hop is not None:
            self._publish(attempt_id, outcome.next_hop)
        return outcome

    def _deliver(self, pick: int) -> None:
        if self.queue:
            self._hop(*self.queue.pop(pick % len(self.queue)))

    @precondition(lambda self: self.queue)
    @rule(pick=st.integers(min_value=0, max_value=50))
    def deliver(self, pick: int) -> None:
        """The next message, or any other: the queue is not ordered for us."""
        self._deliver(pick)

    @precondition(lambda self: self.sent)
    @rule(pick=st.integers(min_value=0, max_value=50))
    def redeliver(self, pick: int) -> None:
        """A message delivered again (a duplicate, or a stale one long after)."""
        self._hop(*self.sent[pick % len(self.sent)])

    @precondition(lambda self: self.attempts)
    @rule(pick=st.integers(min_value=0, max_value=50), ahead=st.integers(1, 2))
    def deliver_ahead(self, pick: int, ahead: int) -> None:
        """A hop the attempt does not expect yet."""
        attempt_id = self.attempts[pick % len(self.attempts)]
        self._hop(attempt_id, self.service.attempt(attempt_id).expected_hop + ahead)

    # The gateway.

    @rule(what=st.sampled_from(CREATES))
    def script_create(self, what: str) -> None:
        self.gateway.creates.append(ERRORS[what]() if what in ERRORS else what)

    @rule(method=st.sampled_from(METHODS), error=st.sampled_from(sorted(ERRORS)))
    def script_failure(self, method: str, error: str) -> None:
        self.gateway.fail.setdefault(method, []).append(ERRORS[error]())

    @rule(
        prefix=st.lists(st.sampled_from(SETTLING), max_size=2),
        final=st.sampled_from(FINAL),
    )
    def script_new_statuses(self, prefix: list[str], final: str) -> None:
        self.gateway.new_statuses = [*prefix, final]

    @rule(
        title=st.sampled_from(TITLES),
        status=st.sampled_from(FINAL),
        projects=st.integers(0, 1),
    )
    def add_other(self, title: str, status: str, projects: int) -> None:
        """Someone else's same-title workspace: ready (adoptable if empty), a zombie, failed."""
        workspace_id = self.gateway.add(PARENT, title, status, projects=projects)
        searching = (self.service.attempt(a) for a in self.attempts)
        if any(a.title == title and a.orphan_search for a in searching):
            self.lookalikes.add(workspace_id)
            self.lookalike_titles.add(title)

    def _children(self) -> list[str]:
        return sorted(w for w in self.gateway.workspaces if w != PARENT)

    @precondition(lambda self: len(self.gateway.workspaces) > 1)
    @rule(
        pick=st.integers(min_value=0, max_value=50),
        prefix=st.lists(st.sampled_from(SETTLING), max_size=1),
        final=st.sampled_from(FINAL),
    )
    def restatus(self, pick: int, prefix: list[str], final: str) -> None:
        """A workspace's status moves on upstream (settles, fails, turns creation_failed)."""
        children = self._children()
        workspace = self.gateway.workspaces[children[pick % len(children)]]
        if classify_status(workspace.statuses[0]) is StatusClass.READY:
            self.spoiled.add(workspace.id)
        workspace.statuses = [*prefix, final]

    @precondition(lambda self: len(self.gateway.workspaces) > 1)
    @rule(pick=st.integers(min_value=0, max_value=50))
    def vanish(self, pick: int) -> None:
        children = self._children()
        workspace_id = children[pick % len(children)]
        self.spoiled.add(workspace_id)
        self.gateway.remove(workspace_id)

    @precondition(lambda self: len(self.gateway.workspaces) > 1)
    @rule(pick=st.integers(min_value=0, max_value=50))
    def add_project(self, pick: int) -> None:
        """Somebody adds a project to a workspace (the bound one, or a released shell)."""
        children = self._children()
        workspace = self.gateway.workspaces[children[pick % len(children)]]
        workspace.projects.append(f"user-{len(workspace.projects)}-{workspace.id}")

    @rule()
    def reveal(self) -> None:
        note(f"revealed {self.gateway.reveal()}")

    @rule(seconds=st.sampled_from([1, 5, 20, 61, 700]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # Races: a call that runs while another waits on the gateway.

    @rule(
        method=st.sampled_from(("create_child", "status", "family", "list_projects")),
        kind=st.sampled_from(("deliver", "redeliver", "deactivate", "request", "reconcile")),
        brand=st.sampled_from(BRANDS),
        title=st.sampled_from(TITLES),
        pick=st.integers(min_value=0, max_value=50),
    )
    def interleave(self, method: str, kind: str, brand: str, title: str, pick: int) -> None:
        def nested() -> None:
            if self.depth >= 2:
                return
            self.depth += 1
            note(f"inside {method}: {kind}")
            try:
                if kind == "deliver":
                    self._deliver(pick)
                elif kind == "redeliver" and self.sent:
                    self._hop(*self.sent[pick % len(self.sent)])
                elif kind == "deactivate":
                    self._deactivate(brand, None)
                elif kind == "request":
                    self._request(brand, title, None)
                elif kind == "reconcile":
                    self._sweep()
            except GatewayError as exc:  # the nested call's own retry, not the outer's
                note(f"inside {method}: {kind} will be retried ({exc!r})")
            finally:
                self.depth -= 1

        self.gateway.hooks.setdefault(method, []).append(nested)

    # The reconciler.

    def _sweep(self, *, expire: bool = True) -> None:
        now = self.clock.now()
        for attempt_id in list(self.attempts):
            attempt = self.service.attempt(attempt_id)
            if attempt.is_terminal:
                self._retried(lambda a=attempt_id: self.service.release(a), "release")
            elif expire and self.service.expire(attempt_id, now - timedelta(seconds=DEADLINE_S)):
                note(f"expired {str(attempt_id)[:8]}")
            elif attempt.not_before is None or attempt.not_before <= now:
                self._publish(attempt_id, attempt.expected_hop)
        for brand in BRANDS:
            found = self._brand(brand)
            if found is not None and not found.is_active and found.workspace_id is not None:
                self._retried(lambda b=brand: self.service.decommission(b), f"decommission {brand}")

    def _retried(self, call: Callable[[], Any], what: str) -> None:
        """What the worker does with a release or decommission message: a gateway
        failure means the message is tried again later."""
        try:
            note(f"{what}: {call()}")
        except GatewayError as exc:
            note(f"{what}: retried later ({exc!r})")

    @rule()
    def reconcile(self) -> None:
        self._sweep()

    # What holds at every step.

    def _brand(self, brand_id: str) -> Any:
        try:
            return self.service.brand(brand_id)
        except UnknownBrand:
            return None

    def _bound(self) -> dict[str, str]:
        bound = {}
        for brand_id in BRANDS:
            brand = self._brand(brand_id)
            if brand is not None and brand.workspace_id is not None:
                bound[brand_id] = brand.workspace_id
        return bound

    def _unbound(self) -> set[str]:
        """Workspaces some brand's log records as unbound (decommissioned, or dropped)."""
        return {
            e.workspace_id
            for brand_id in BRANDS
            for e in self.app.events.get(brand_aggregate_id(brand_id))
            if isinstance(e, Brand.WorkspaceUnbound)
        }

    @invariant()
    def one_workspace_one_brand_and_the_parent_untouched(self) -> None:
        bound = self._bound()
        assert len(set(bound.values())) == len(bound), f"bound twice: {bound}"
        assert PARENT not in bound.values()
        for brand_id, workspace_id in bound.items():
            claim = self.service.claim(workspace_id)
            assert claim is not None, f"{brand_id} bound to {workspace_id} without a claim"
            assert claim.brand_id == brand_id, f"{workspace_id} bound to {brand_id}: {claim}"
        assert self.service.claim(PARENT) is None
        assert self.gateway.workspaces[PARENT].projects == ["parent-project"]
        for attempt_id in self.attempts:
            attempt = self.service.attempt(attempt_id)
            assert attempt.candidate_id != PARENT
            assert PARENT not in attempt.created_ids

    # The drain, and what holds once everything ended.

    def _drain(self) -> None:
        self.gateway.hooks.clear()
        self.gateway.creates.clear()
        self.gateway.fail.clear()
        note(f"drain: revealed {self.gateway.reveal()}")
        for _ in range(4 * (MAX_REQUEUES + 2)):
            while self.queue:
                # Each hop's delay passes before the next: a hop waiting out a create's
                # grace comes back after it, not at once (which would only spin).
                self.clock.advance(self._hop(*self.queue.pop(0)).delay_s or 0.0)
            if all(self.service.attempt(a).is_terminal for a in self.attempts):
                break
            self.clock.advance(5.0 * 2**MAX_REQUEUES + 61)
            self._sweep(expire=False)
        self.clock.advance(61)
        for _ in range(2):
            self._sweep(expire=False)
        self.queue.clear()

    def teardown(self) -> None:
        self._drain()
        service = self.service
        ended = {a: service.attempt(a) for a in self.attempts}
        for attempt in ended.values():  # what the examples covered (--hypothesis-show-statistics)
            event(f"attempt {attempt.state.value} {attempt.failure_reason or ''}".strip())
            if attempt.create_lost:
                event("attempt with a lost create")
            if attempt.deferrals:
                event("attempt with deferred hops")
            # Only answered "not yet"s spend the settle budget; a deferral never does.
            assert attempt.settle_hops <= attempt.max_hop
            if attempt.failure_reason is FailureReason.EXHAUSTED:
                assert attempt.settle_hops == attempt.max_hop, attempt.id
        event(f"workspaces made: {min(len(self.gateway.made), 5)}")
        pending = [a for a, attempt in ended.items() if not attempt.is_terminal]
        assert pending == [], f"still pending after the drain: {pending}"
        self.one_workspace_one_brand_and_the_parent_untouched()

        bound = self._bound()
        for brand_id in BRANDS:
            brand = self._brand(brand_id)
            if brand is None:
                continue
            if not brand.is_active:
                # Emptied and unbound, or its emptying refused for good, on record.
                if brand.emptying_refused is None:
                    assert brand.workspace_id is None, f"deactivated {brand_id} holds {bound}"
                else:
                    event("decommission refused for good")
                    assert brand.workspace_id is not None
                continue
            current = ended.get(brand.current_attempt_id) if brand.current_attempt_id else None
            if current is not None and current.state is AttemptState.PROMOTED:
                workspace_id = bound.get(brand_id)
                assert workspace_id == current.candidate_id, (brand_id, workspace_id, current)
                if workspace_id not in self.spoiled:
                    status = self.gateway.workspaces[workspace_id].statuses[0]
                    assert classify_status(status) is StatusClass.READY, (workspace_id, status)

        on_record: dict[str, Any] = {}
        for attempt in ended.values():
            for workspace_id in attempt.created_ids:
                echoed = workspace_id in self.gateway.echoed  # a gateway bug, believed
                assert echoed or workspace_id not in on_record, f"{workspace_id} made twice"
                on_record[workspace_id] = attempt
        made = set(self.gateway.made)
        upstream = made & set(self.gateway.workspaces)  # not vanished since
        # A create that showed up only after its grace may have been adopted meanwhile
        # (docs/architecture.md: it may be duplicated): bound, so not left behind.
        lost = upstream - set(on_record) - set(bound.values())
        # Beside a lookalike, what an unconfirmed create made cannot be told from it
        # (the search finds two new workspaces: ambiguous, neither is recorded; or the
        # lookalike came first and was taken for it, even if it vanished since).
        lost = {w for w in lost if self.gateway.workspaces[w].title not in self.lookalike_titles}
        # One somebody put projects in before a search credited it is no longer what a
        # create of ours makes (docs/decisions/029): it is left for a person, as the
        # audit's `unclear` finding, never taken nor emptied.
        lost = {w for w in lost if not self.gateway.workspaces[w].projects}
        assert lost == set(), f"made, neither on record nor bound: {lost}"
        # A create that answers an id that was there before (a gateway bug) is believed.
        believed = made | self.lookalikes | set(self.gateway.echoed)
        assert set(on_record) <= believed, "on record as made; no create made it"
        unbound = self._unbound()
        for workspace_id, attempt in on_record.items():
            kept = workspace_id in bound.values()
            # Emptied and recorded on the attempt, or decommissioned (or dropped when
            # it went bad) and recorded on the brand.
            released = workspace_id in attempt.released_ids or workspace_id in unbound
            unusable = (
                attempt.failure_reason is FailureReason.TERMINAL_STATUS
                and workspace_id == attempt.candidate_id
            )
            assert kept or released or unusable, (
                f"{workspace_id} of {attempt.id} ({attempt.state.value}) is neither bound "
                f"nor released; owed {attempt.owed_releases}"
            )
        for attempt_id, attempt in ended.items():
            history = service.attempt_history(attempt_id)
            dropped = sum(1 for e in history if type(e).__name__ == "CandidateDropped")
            extra = len(attempt.created_ids) - 1 - dropped
            assert extra <= 0 or attempt.create_lost, (
                f"{attempt_id} made {attempt.created_ids} with no ambiguous create on record"
            )

        with SqlViewStore(memory_views_url()) as views:
            views.setup()
            source = LogSource(self.app)
            for projection in PROJECTIONS.values():
                catch_up(projection, source, views)
            assert mismatches(self.app, views, 0) == []


ServiceMachine.TestCase.settings = settings(max_examples=scaled(2), stateful_step_count=50)
TestServiceMachine = ServiceMachine.TestCase


# Examples the property tests found, kept as plain tests.


def test_a_refused_create_leaves_no_baseline_behind_so_others_workspaces_are_never_ours() -> None:
    """A create refused (429) made nothing; a same-title workspace of someone else's
    that appears before the next create is in that create's baseline, so the next
    create's lost answer is recovered as ours alone, and the other's projects stay.
    (The first create's baseline was kept: the other's workspace counted as new, the
    attempt failed `ambiguous`, and the release emptied the other's workspace.)"""
    gateway = MemoryGateway(PARENT)
    clock = ManualClock()
    settings_ = EngineSettings(backoff=Backoff(5.0, MAX_REQUEUES))
    service = new_service(gateway, clock, settings_)
    gateway.creates = [TransientGatewayError("429"), "lost"]
    attempt_id = service.request_provisioning("b1", "Bolt", PARENT)

    first = service.run_hop(attempt_id, 0)
    others = gateway.add(PARENT, "Bolt", "created", projects=1)
    clock.advance(5)
    second = service.run_hop(attempt_id, 1)
    released = service.release(attempt_id)

    assert first.detail == "gateway unavailable: 429"
    assert second.outcome.value == "promoted", second.detail
    assert second.workspace_id == gateway.made[0] != others
    assert released == ()
    assert gateway.workspaces[others].projects == ["p-1-0"]


def test_a_create_answering_an_id_it_made_before_fails_as_a_gateway_bug() -> None:
    """The create answered the id of the shell this attempt made and dropped before:
    failed `gateway_bug` (the hop polled no candidate: AssertionError, retried)."""
    gateway = MemoryGateway(PARENT)
    clock = ManualClock()
    settings_ = EngineSettings(backoff=Backoff(5.0, MAX_REQUEUES))
    service = new_service(gateway, clock, settings_)
    gateway.new_statuses = ["creation_failed"]
    attempt_id = service.request_provisioning("b1", "Acme", PARENT)
    created = service.run_hop(attempt_id, 0)  # polled in the next hop
    clock.advance(5)
    dropped = service.run_hop(attempt_id, 1)
    [shell] = gateway.made
    gateway.create_child = lambda parent, title: shell  # type: ignore[method-assign]
    clock.advance(5)

    again = service.run_hop(attempt_id, 2)

    assert created.workspace_id == shell
    assert dropped.detail == "candidate reported 'creation_failed'; creating again"
    assert again.outcome.value == "failed"
    assert again.detail == f"gateway_bug: create answered {shell}, which existed before"
    attempt = service.attempt(attempt_id)
    assert attempt.released_ids == (shell,)
    assert attempt.created_ids == (shell,)


def test_a_create_answering_the_id_of_a_workspace_listed_before_it_never_empties_it() -> None:
    """The bound workspace reported `creation_failed` and was dropped; the create that
    followed answered its id (a gateway bug): failed `gateway_bug`, and the workspace,
    listed before that create, is not recorded as ours (it was: dropped as a created
    candidate that reported `creation_failed`, it was then owed a release, emptied)."""
    gateway = MemoryGateway(PARENT)
    clock = ManualClock()
    settings_ = EngineSettings(backoff=Backoff(5.0, MAX_REQUEUES))
    service = new_service(gateway, clock, settings_)
    bound = gateway.add(PARENT, "Acme", "created")
    service.run_hop(service.request_provisioning("b1", "Acme", PARENT), 0)  # adopts it
    assert service.brand("b1").workspace_id == bound
    gateway.workspaces[bound].projects = ["the brand's"]
    gateway.workspaces[bound].statuses = ["creation_failed"]
    attempt_id = service.request_provisioning("b1", "Acme", PARENT)
    dropped = service.run_hop(attempt_id, 0)
    gateway.create_child = lambda parent, title: bound  # type: ignore[method-assign]
    clock.advance(5)

    again = service.run_hop(attempt_id, 1)
    service.release(attempt_id)

    assert dropped.detail == "bound workspace reported 'creation_failed'"
    assert again.detail == f"gateway_bug: create answered {bound}, which existed before"
    assert bound not in service.attempt(attempt_id).created_ids
    assert gateway.workspaces[bound].projects == ["the brand's"]
