"""Family reads shared by the hops of one process, never stale (docs/gateway.md,
"Shared family reads").

Every hop that adopts or recovers lists its parent's family, and the gateway has
no narrower read than the whole listing: a rollout of N brands into one parent
moves O(N^2) bytes. `SharedFamilyReads` wraps a `domain.ports.Gateway` and makes
the hop threads of one process share those reads, per parent:

- a caller that finds no read of the parent in flight starts one at once;
- a caller that finds one in flight does not take its answer (it began before
  the caller asked, so it may miss a workspace made just before): it joins the
  next read, which starts when the one in flight ends and serves every caller
  that joined it meanwhile, whatever their titles.

So every answer comes from a read that began after its caller asked: as fresh
as the caller's own read would have been. At most two reads of a parent are
alive at once (one in flight, one gathering callers), and a parent's reads never
overlap. The next read is made by one of its own callers (no thread of its
own); the others wait on a condition, at most `wait_s`, then raise
`TransientGatewayError` (the hop defers). A failure of a read is raised to every
caller it served.

One read serves several titles: through the inner gateway's `family_titled`
when it has one (`HttpGateway`: the listing is read whole, only those titles'
entries decoded), else through `family(parent)` filtered here. Every other call
goes through unchanged.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from domain.ports import FamilyMember, Gateway, TransientGatewayError

__all__ = ["SharedFamilyReads"]

WAIT_S = 120.0  # the longest a caller waits for a read it joined


@runtime_checkable
class TitledFamily(Protocol):
    """A gateway that reads a family once for several titles (`HttpGateway`)."""

    def family_titled(
        self, parent_id: str, titles: frozenset[str] | None
    ) -> list[FamilyMember]: ...


@dataclass(eq=False)
class _Read:
    """One read of a parent's family and the callers it serves."""

    titles: set[str | None] = field(default_factory=set)  # None: a caller wants all
    callers: int = 0
    started: bool = False
    done: bool = False
    members: list[FamilyMember] = field(default_factory=list)
    error: BaseException | None = None

    def wanted(self) -> frozenset[str] | None:
        return None if None in self.titles else frozenset(t for t in self.titles if t is not None)

    def answer(self, title: str | None) -> list[FamilyMember]:
        if self.error is not None:
            raise _copy(self.error)
        if title is None:
            return list(self.members)
        return [m for m in self.members if m.title == title]


@dataclass(eq=False)
class _Parent:
    running: _Read | None = None  # in flight, or promoted and about to be started
    next: _Read | None = None  # gathering callers; never started


class SharedFamilyReads:
    """`domain.ports.Gateway` over `gateway`, whose family reads are shared per parent
    by the threads of this process. Thread-safe. `on_ask("read" | "joined")`: told of
    each family call, whether it made a read or was served by one another caller
    made (a metric in worker/health/metrics.py)."""

    def __init__(
        self,
        gateway: Gateway,
        *,
        wait_s: float = WAIT_S,
        on_ask: Callable[[str], None] | None = None,
    ) -> None:
        if wait_s <= 0:
            raise ValueError("wait_s must be > 0")
        self._gateway = gateway
        self._wait_s = wait_s
        self._on_ask = on_ask
        self._changed = threading.Condition()
        self._parents: dict[str, _Parent] = {}

    # -- the port: the family shared, every other call as it is -----------------

    def family(self, parent_id: str, title: str | None = None) -> list[FamilyMember]:
        read, lead = self._join(parent_id, title)
        if not lead:
            lead = self._await(parent_id, read)
        if lead:
            self._perform(parent_id, read)
        if self._on_ask is not None:
            self._on_ask("read" if lead else "joined")
        return read.answer(title)

    def create_child(self, parent_id: str, title: str) -> str:
        return self._gateway.create_child(parent_id, title)

    def status(self, workspace_id: str) -> str:
        return self._gateway.status(workspace_id)

    def list_projects(self, workspace_id: str) -> list[str]:
        return self._gateway.list_projects(workspace_id)

    def delete_project(self, workspace_id: str, project_id: str) -> None:
        self._gateway.delete_project(workspace_id, project_id)

    def queued(self, parent_id: str) -> int:
        """Callers waiting for the parent's next read (not yet started)."""
        with self._changed:
            parent = self._parents.get(parent_id)
            return parent.next.callers if parent is not None and parent.next else 0

    # -- sharing ----------------------------------------------------------------

    def _join(self, parent_id: str, title: str | None) -> tuple[_Read, bool]:
        """The read this caller is served by, and whether it makes it now: a new one
        when none is in flight, else the next one (never one already started)."""
        with self._changed:
            parent = self._parents.setdefault(parent_id, _Parent())
            if parent.running is None:
                read = parent.running = _Read(started=True)
                lead = True
            else:
                read = parent.next = parent.next or _Read()
                lead = False
            read.titles.add(title)
            read.callers += 1
            return read, lead

    def _await(self, parent_id: str, read: _Read) -> bool:
        """Wait until `read` is done (False), or is due and this caller makes it (True).
        Past `wait_s`, leave it and raise `TransientGatewayError`."""
        deadline = time.monotonic() + self._wait_s
        with self._changed:
            while True:
                if read.done:
                    return False
                parent = self._parents.get(parent_id)
                if parent is not None and parent.running is read and not read.started:
                    read.started = True
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    self._leave(parent_id, read)
                    raise TransientGatewayError(
                        f"family: no shared read of the family came back in {self._wait_s:g} s"
                    )
                try:
                    self._changed.wait(left)
                except BaseException:  # whatever ends the wait, the read is left
                    self._leave(parent_id, read)
                    raise

    def _leave(self, parent_id: str, read: _Read) -> None:
        """A caller gives up on a read not yet started; a read no one waits for is
        dropped, and one already due is handed on as a read made would be (else no
        one would ever start it, and every later caller of the parent would wait for
        it). Under the lock."""
        read.callers -= 1
        parent = self._parents.get(parent_id)
        if read.callers > 0 or parent is None:
            return
        if parent.next is read:
            parent.next = None
        elif parent.running is read and not read.started:
            parent.running, parent.next = parent.next, None
            if parent.running is None:
                del self._parents[parent_id]
            self._changed.notify_all()

    def _perform(self, parent_id: str, read: _Read) -> None:
        """Make the read, publish what it found (or its failure), and hand the parent
        over to the next read, whose callers are woken (one of them makes it)."""
        try:
            read.members = self._read(parent_id, read.wanted())
        except BaseException as exc:  # noqa: BLE001 - raised to every caller of this read
            read.error = exc
        with self._changed:
            read.done = True
            parent = self._parents[parent_id]
            parent.running, parent.next = parent.next, None
            if parent.running is None:
                del self._parents[parent_id]
            self._changed.notify_all()

    def _read(self, parent_id: str, titles: frozenset[str] | None) -> list[FamilyMember]:
        inner = self._gateway
        if titles is not None and len(titles) == 1:
            (title,) = titles
            return inner.family(parent_id, title)
        if isinstance(inner, TitledFamily):
            return inner.family_titled(parent_id, titles)
        members = inner.family(parent_id)
        return members if titles is None else [m for m in members if m.title in titles]


def _copy(error: BaseException) -> BaseException:
    """The failure for one more caller: a copy (its attributes kept, `retry_after_s`
    among them), so that threads raising it at once do not share one traceback."""
    try:
        return copy.copy(error)
    except Exception:  # noqa: BLE001 - an exception that cannot be copied is raised as it is
        return error
