"""Family reads shared by a process's hops, never stale (infrastructure/gateway/family_reads.py):
threads against a fake gateway port whose reads the test starts and ends by hand.

No assertion depends on timing: the test waits for a read to start, or for a caller
to be queued, on the fake's condition or the wrapper's own count; only the timeout
test gives up, and what it checks is the outcome, not the time."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import REGISTRY

from domain.ports import FamilyMember, GatewayError, TransientGatewayError, WorkspaceGone
from infrastructure.gateway.family_reads import SharedFamilyReads
from worker.health import metrics

P = "org-1"


class GatedGateway:
    """The gateway port's family over a list of members. Each read copies the list when
    it starts (the stalest a real read may be), then waits until the test ends it
    (`end(n)`, with a failure to raise or none) unless `gated` is False."""

    def __init__(self, *, gated: bool = True) -> None:
        self.members = [FamilyMember(P, "Organisation", "active")]
        self.gated = gated
        self.pause = 0.0  # seconds an ungated read takes, for reads to overlap
        self.asked: list[frozenset[str] | None] = []  # each read's titles, in order
        self._ends: list[threading.Event] = []
        self._errors: dict[int, GatewayError] = {}
        self._changed = threading.Condition()
        self.created: list[tuple[str, str]] = []

    def add(self, workspace_id: str, title: str) -> None:
        with self._changed:
            self.members = [*self.members, FamilyMember(workspace_id, title, "created")]

    def family(self, parent_id: str, title: str | None = None) -> list[FamilyMember]:
        return self._read(None if title is None else frozenset((title,)))

    def _read(self, titles: frozenset[str] | None) -> list[FamilyMember]:
        with self._changed:
            n = len(self.asked)
            self.asked.append(titles)
            seen = list(self.members)
            end = threading.Event()
            self._ends.append(end)
            self._changed.notify_all()
        if self.gated:
            end.wait()
        time.sleep(self.pause)
        with self._changed:
            error = self._errors.get(n)
        if error is not None:
            raise error
        return [m for m in seen if titles is None or m.title in titles]

    def started(self, reads: int) -> None:
        """Until `reads` reads have started."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.asked) >= reads)

    def end(self, n: int, error: GatewayError | None = None) -> None:
        """End read `n` (0-based), raising `error` if given."""
        with self._changed:
            if error is not None:
                self._errors[n] = error
            end = self._ends[n]
        end.set()

    def create_child(self, parent_id: str, title: str) -> str:
        self.created.append((parent_id, title))
        return "ws-new"

    def status(self, workspace_id: str) -> str:
        return "created"

    def list_projects(self, workspace_id: str) -> list[str]:
        return ["prj-1"]

    def delete_project(self, workspace_id: str, project_id: str) -> None:
        raise WorkspaceGone("gone")


class TitledGateway(GatedGateway):
    """One that reads once for several titles, as `HttpGateway.family_titled`."""

    def family_titled(self, parent_id: str, titles: frozenset[str] | None) -> list[FamilyMember]:
        return self._read(titles)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=32) as executor:
        yield executor


def queued(shared: SharedFamilyReads, callers: int) -> None:
    """Until `callers` callers wait for the parent's next read."""
    while shared.queued(P) < callers:
        time.sleep(0.001)


def ids(members: list[FamilyMember]) -> set[str]:
    return {m.id for m in members}


def test_a_caller_alone_reads_at_once_with_its_title() -> None:
    gateway = GatedGateway(gated=False)
    gateway.add("ws-a", "A")
    gateway.add("ws-b", "B")
    shared = SharedFamilyReads(gateway)
    assert ids(shared.family(P, "A")) == {"ws-a"}
    assert ids(shared.family(P)) == {P, "ws-a", "ws-b"}
    assert gateway.asked == [frozenset({"A"}), None]


def test_a_caller_asking_during_a_read_gets_the_next_one_and_sees_what_came_before(
    pool: ThreadPoolExecutor,
) -> None:
    gateway = GatedGateway()
    shared = SharedFamilyReads(gateway)
    first = pool.submit(shared.family, P, "A")
    gateway.started(1)
    gateway.add("ws-a", "A")  # made after the read in flight began, before B asks
    second = pool.submit(shared.family, P, "A")
    queued(shared, 1)
    gateway.end(0)
    assert first.result() == []  # its read began before ws-a existed
    gateway.started(2)  # the next read starts only when the one in flight has ended
    gateway.end(1)
    assert ids(second.result()) == {"ws-a"}
    assert len(gateway.asked) == 2


def test_one_read_serves_every_caller_that_asked_while_another_was_in_flight(
    pool: ThreadPoolExecutor,
) -> None:
    gateway = TitledGateway()
    for title in "ABCD":
        gateway.add(f"ws-{title.lower()}", title)
    shared = SharedFamilyReads(gateway)
    first = pool.submit(shared.family, P, "A")
    gateway.started(1)
    later = {title: pool.submit(shared.family, P, title) for title in ("B", "C", "D", "B")}
    queued(shared, 4)
    gateway.end(0)
    gateway.started(2)
    gateway.end(1)
    assert ids(first.result()) == {"ws-a"}
    assert {t: ids(f.result()) for t, f in later.items()} == {
        "B": {"ws-b"},
        "C": {"ws-c"},
        "D": {"ws-d"},
    }
    assert gateway.asked == [frozenset({"A"}), frozenset({"B", "C", "D"})]  # two reads in all


def test_callers_of_several_titles_without_a_titled_read_share_the_whole_listing(
    pool: ThreadPoolExecutor,
) -> None:
    gateway = GatedGateway()
    gateway.add("ws-b", "B")
    gateway.add("ws-c", "C")
    shared = SharedFamilyReads(gateway)
    first = pool.submit(shared.family, P, "A")
    gateway.started(1)
    b, c, everyone = (pool.submit(shared.family, P, t) for t in ("B", "C", None))
    queued(shared, 3)
    gateway.end(0)
    gateway.started(2)
    gateway.end(1)
    assert (ids(b.result()), ids(c.result())) == ({"ws-b"}, {"ws-c"})
    assert ids(everyone.result()) == {P, "ws-b", "ws-c"}
    assert first.result() == []
    assert gateway.asked == [frozenset({"A"}), None]


def test_a_failed_read_is_raised_to_every_caller_it_served(pool: ThreadPoolExecutor) -> None:
    gateway = TitledGateway()
    shared = SharedFamilyReads(gateway)
    first = pool.submit(shared.family, P, "A")
    gateway.started(1)
    waiters = [pool.submit(shared.family, P, t) for t in ("B", "C", "C")]
    queued(shared, 3)
    gateway.end(0)
    gateway.started(2)
    gateway.end(1, TransientGatewayError("family: HTTP 503 after 3 attempt(s)", retry_after_s=7))
    assert first.result() == []
    for waiter in waiters:
        with pytest.raises(TransientGatewayError, match="HTTP 503") as raised:
            waiter.result()
        assert raised.value.retry_after_s == 7
    assert len({id(w.exception()) for w in waiters}) == 3  # each raises its own copy


def test_a_failure_of_the_read_in_flight_does_not_reach_those_waiting_for_the_next(
    pool: ThreadPoolExecutor,
) -> None:
    gateway = GatedGateway()
    gateway.add("ws-b", "B")
    shared = SharedFamilyReads(gateway)
    first = pool.submit(shared.family, P, "A")
    gateway.started(1)
    second = pool.submit(shared.family, P, "B")
    queued(shared, 1)
    gateway.end(0, WorkspaceGone("family: workspace not found (HTTP 404)"))
    gateway.started(2)
    gateway.end(1)
    with pytest.raises(WorkspaceGone):
        first.result()
    assert ids(second.result()) == {"ws-b"}


def test_a_caller_waits_at_most_wait_s_then_defers_and_no_read_is_made_for_it(
    pool: ThreadPoolExecutor,
) -> None:
    gateway = GatedGateway()
    shared = SharedFamilyReads(gateway, wait_s=0.05)
    first = pool.submit(shared.family, P, "A")
    gateway.started(1)
    with pytest.raises(TransientGatewayError, match="no shared read"):
        shared.family(P, "B")  # the read in flight never ends while it waits
    assert shared.queued(P) == 0
    gateway.end(0)
    assert first.result() == []
    gateway.gated = False
    assert shared.family(P, "A") == []  # a fresh read: the parent is free again
    assert len(gateway.asked) == 2


class InterruptedWait(threading.Condition):
    """A condition whose next wait, once armed, raises after it wakes: whatever may end a
    caller's wait other than its timeout."""

    armed = False

    def wait(self, timeout: float | None = None) -> bool:
        woken = super().wait(timeout)
        if self.armed:
            self.armed = False
            raise RuntimeError("the wait was interrupted")
        return woken


def test_a_caller_whose_wait_ends_otherwise_leaves_the_read_to_the_next_callers(
    pool: ThreadPoolExecutor,
) -> None:
    gateway = GatedGateway()
    shared = SharedFamilyReads(gateway, wait_s=2.0)
    condition = shared._changed = InterruptedWait()
    first = pool.submit(shared.family, P, "A")
    gateway.started(1)
    second = pool.submit(shared.family, P, "B")  # waits for the next read, alone
    queued(shared, 1)
    condition.armed = True
    gateway.end(0)  # the next read is due: its only caller's wait raises as it wakes
    assert first.result() == []
    with pytest.raises(RuntimeError, match="interrupted"):
        second.result()
    gateway.gated = False
    assert shared.family(P, "C") == []  # read at once: the parent was handed on
    assert len(gateway.asked) == 2


def test_reads_of_different_parents_do_not_wait_for_each_other(pool: ThreadPoolExecutor) -> None:
    gateway = GatedGateway()
    shared = SharedFamilyReads(gateway)
    first = pool.submit(shared.family, P, "A")
    gateway.started(1)
    other = pool.submit(shared.family, "org-2", "A")
    gateway.started(2)  # started while the first parent's read is in flight
    gateway.end(1)
    gateway.end(0)
    assert other.result() == first.result() == []


def test_every_caller_sees_the_workspace_it_made_before_it_asked(
    pool: ThreadPoolExecutor,
) -> None:
    """Freshness, under whatever interleaving the threads fall into: each caller makes
    a workspace, then asks; its answer always lists it."""
    gateway = TitledGateway(gated=False)
    gateway.pause = 0.002
    shared = SharedFamilyReads(gateway)
    rng = random.Random(7)

    def hop(n: int, title: str) -> bool:
        time.sleep(rng.random() / 1000)
        gateway.add(f"ws-{n}", title)
        return f"ws-{n}" in ids(shared.family(P, title))

    calls = [pool.submit(hop, n, rng.choice("ABC")) for n in range(400)]
    assert all(call.result() for call in calls)
    assert len(gateway.asked) <= 400


def test_the_other_calls_go_to_the_gateway_unchanged() -> None:
    gateway = GatedGateway(gated=False)
    shared = SharedFamilyReads(gateway)
    assert shared.create_child(P, "A") == "ws-new"
    assert gateway.created == [(P, "A")]
    assert shared.status("ws-1") == "created"
    assert shared.list_projects("ws-1") == ["prj-1"]
    with pytest.raises(WorkspaceGone):
        shared.delete_project("ws-1", "prj-1")


def test_asks_are_counted_as_reads_or_joined(pool: ThreadPoolExecutor) -> None:
    gateway = GatedGateway()
    served: list[str] = []
    shared = SharedFamilyReads(gateway, on_ask=served.append)
    first = pool.submit(shared.family, P, "A")
    gateway.started(1)
    later = [pool.submit(shared.family, P, "A") for _ in range(3)]
    queued(shared, 3)
    gateway.end(0)
    gateway.started(2)
    gateway.end(1)
    for call in [first, *later]:
        call.result()
    assert sorted(served) == ["joined", "joined", "read", "read"]
    sample = ("provisioner_gateway_family_asks_total", {"served": "joined"})
    before = REGISTRY.get_sample_value(*sample) or 0.0
    metrics.observe_family_ask("joined")
    assert REGISTRY.get_sample_value(*sample) == before + 1
