"""An in-memory gateway implementing the port (`domain.ports.Gateway`), for service
tests without sockets. Answers are scripted per call; the HTTP fake
(`infrastructure.fake_gateway`) stays for the integration tests.

Faults it can play (the property tests drive them at random):
- `creates` scripts the next create calls: "ok" (made and answered), "lost" (made,
  answer lost: AmbiguousCreate), "none" (not made, AmbiguousCreate), "late" (made,
  answer lost, and the workspace shows in the family only after `reveal()`),
  "lost5xx" (made and listed at once, answered 500: an AmbiguousCreate it answered),
  "none5xx" (not made, answered 503: the same),
  "parent" (answers the parent's id, a gateway bug), "noid" (answers an empty id),
  "echo" (answers the id of the newest child there is, made by nobody now),
  or a GatewayError to raise (429, 5xx, 401, 409 ...);
- `fail` scripts a GatewayError for the next calls of a method by name;
- `new_statuses` is the status script of the next workspaces made (the last repeats:
  a zombie is one that stays "not ready", a terminal one ends "failed");
- `add` puts same-title others (ready, zombies, with projects) beside ours;
  `remove` makes a workspace answer 404;
- `hooks` runs a callback inside the next call of a method by name, after its
  effect and before its answer: another delivery, command or release that runs
  while this one waits on the gateway.
What our creates made is listed in `made`, the projects deleted in `deleted`, the ids
"echo" creates answered in `echoed`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from domain.ports import AmbiguousCreate, FamilyMember, GatewayError, WorkspaceGone

PARENT = "parent-1"  # the one parent of the unit tests' `gateway` fixture


@dataclass
class Workspace:
    id: str
    parent: str
    title: str
    statuses: list[str] = field(default_factory=lambda: ["created"])
    projects: list[str] = field(default_factory=list)

    def status(self) -> str:
        """The next scripted status; the last one repeats."""
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]


class MemoryGateway:
    """Parents and their children in a dict. `creates` scripts what the next create
    calls do: "ok" (made and answered), "lost" (made, answer lost: AmbiguousCreate),
    "none" (not made, AmbiguousCreate), "late", "parent", "noid", "echo" (see the module), or
    a GatewayError to raise. `fail` scripts a GatewayError for the next calls of a
    method by name."""

    def __init__(self, *parents: str) -> None:
        self.workspaces: dict[str, Workspace] = {p: Workspace(p, "", "parent") for p in parents}
        self.creates: list[str | GatewayError] = []
        self.fail: dict[str, list[GatewayError]] = {}
        self.new_statuses: list[str] = ["created"]
        self.calls: Counter[str] = Counter()
        self.hooks: dict[str, list[Callable[[], None]]] = {}
        self.made: list[str] = []  # every workspace a create call made, in order
        self.hidden: dict[str, Workspace] = {}  # made by a "late" create, not listed yet
        self.deleted: list[tuple[str, str]] = []  # (workspace, project) deleted
        self.echoed: list[str] = []  # ids "echo" creates answered with
        self._next = 0

    def add(self, parent: str, title: str, *statuses: str, projects: int = 0) -> str:
        ws = self._new(parent, title, statuses, projects)
        self.workspaces[ws.id] = ws
        return ws.id

    def _new(self, parent: str, title: str, statuses: tuple[str, ...], projects: int) -> Workspace:
        self._next += 1
        ws = Workspace(f"ws-{self._next}", parent, title, list(statuses or self.new_statuses))
        ws.projects = [f"p-{self._next}-{n}" for n in range(projects)]
        return ws

    def remove(self, workspace_id: str) -> None:
        """The workspace is gone upstream: every call about it answers 404."""
        self.workspaces.pop(workspace_id, None)
        self.hidden.pop(workspace_id, None)

    def reveal(self) -> list[str]:
        """The workspaces of "late" creates show up in the family at last."""
        shown = list(self.hidden)
        self.workspaces.update(self.hidden)
        self.hidden.clear()
        return shown

    def children(self, parent: str, title: str) -> list[Workspace]:
        return [w for w in self.workspaces.values() if w.parent == parent and w.title == title]

    def _call(self, name: str) -> None:
        self.calls[name] += 1
        scripted = self.fail.get(name)
        if scripted:
            raise scripted.pop(0)

    def _hook(self, name: str) -> None:
        hooks = self.hooks.get(name)
        if hooks:
            hooks.pop(0)()

    def _workspace(self, workspace_id: str) -> Workspace:
        try:
            return self.workspaces[workspace_id]
        except KeyError:
            raise WorkspaceGone(f"workspace {workspace_id} not found") from None

    # The port.

    def create_child(self, parent_id: str, title: str) -> str:
        self._call("create_child")
        self._workspace(parent_id)
        what = self.creates.pop(0) if self.creates else "ok"
        if isinstance(what, GatewayError):
            self._hook("create_child")
            raise what
        if what in ("none", "none5xx"):
            self._hook("create_child")
            if what == "none5xx":
                raise AmbiguousCreate("outcome unknown (HTTP 503)", answered=True)
            raise AmbiguousCreate("timed out before creating")
        if what in ("parent", "noid"):
            self._hook("create_child")
            return parent_id if what == "parent" else ""
        if what == "echo":  # a gateway bug: the id of a child that exists already
            children = [w for w in self.workspaces.values() if w.parent == parent_id]
            self._hook("create_child")
            answer = children[-1].id if children else parent_id
            self.echoed.append(answer)
            return answer
        ws = self._new(parent_id, title, (), 0)
        self.made.append(ws.id)
        if what == "late":
            self.hidden[ws.id] = ws
        else:
            self.workspaces[ws.id] = ws
        self._hook("create_child")
        if what in ("lost", "late"):
            raise AmbiguousCreate("timed out after creating")
        if what == "lost5xx":
            raise AmbiguousCreate("outcome unknown (HTTP 500)", answered=True)
        return ws.id

    def status(self, workspace_id: str) -> str:
        self._call("status")
        status = self._workspace(workspace_id).status()
        self._hook("status")
        return status

    def family(self, parent_id: str, title: str | None = None) -> list[FamilyMember]:
        self._call("family")
        parent = self._workspace(parent_id)
        members = [parent, *(w for w in self.workspaces.values() if w.parent == parent_id)]
        listed = [
            FamilyMember(w.id, w.title, w.statuses[0])
            for w in members
            if title is None or w.title == title
        ]
        self._hook("family")
        return listed

    def list_projects(self, workspace_id: str) -> list[str]:
        self._call("list_projects")
        projects = list(self._workspace(workspace_id).projects)
        self._hook("list_projects")
        return projects

    def delete_project(self, workspace_id: str, project_id: str) -> None:
        self._call("delete_project")
        projects = self._workspace(workspace_id).projects
        if project_id in projects:
            projects.remove(project_id)
            self.deleted.append((workspace_id, project_id))
