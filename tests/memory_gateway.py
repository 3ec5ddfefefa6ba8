"""An in-memory gateway implementing the port (`domain.ports.Gateway`), for service
tests without sockets. Answers are scripted per call; the HTTP fake
(`infrastructure.fake_gateway`) stays for the integration tests."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from domain.ports import AmbiguousCreate, FamilyMember, GatewayError, WorkspaceGone


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
    "none" (not made, AmbiguousCreate), or a GatewayError to raise. `fail` scripts a
    GatewayError for the next calls of a method by name."""

    def __init__(self, *parents: str) -> None:
        self.workspaces: dict[str, Workspace] = {p: Workspace(p, "", "parent") for p in parents}
        self.creates: list[str | GatewayError] = []
        self.fail: dict[str, list[GatewayError]] = {}
        self.new_statuses: list[str] = ["created"]
        self.calls: Counter[str] = Counter()
        self._next = 0

    def add(self, parent: str, title: str, *statuses: str, projects: int = 0) -> str:
        self._next += 1
        ws = Workspace(f"ws-{self._next}", parent, title, list(statuses or self.new_statuses))
        ws.projects = [f"p-{self._next}-{n}" for n in range(projects)]
        self.workspaces[ws.id] = ws
        return ws.id

    def children(self, parent: str, title: str) -> list[Workspace]:
        return [w for w in self.workspaces.values() if w.parent == parent and w.title == title]

    def _call(self, name: str) -> None:
        self.calls[name] += 1
        scripted = self.fail.get(name)
        if scripted:
            raise scripted.pop(0)

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
            raise what
        if what == "none":
            raise AmbiguousCreate("timed out before creating")
        workspace_id = self.add(parent_id, title)
        if what == "lost":
            raise AmbiguousCreate("timed out after creating")
        return workspace_id

    def status(self, workspace_id: str) -> str:
        self._call("status")
        return self._workspace(workspace_id).status()

    def family(self, parent_id: str, title: str | None = None) -> list[FamilyMember]:
        self._call("family")
        parent = self._workspace(parent_id)
        members = [parent, *(w for w in self.workspaces.values() if w.parent == parent_id)]
        return [
            FamilyMember(w.id, w.title, w.statuses[0])
            for w in members
            if title is None or w.title == title
        ]

    def list_projects(self, workspace_id: str) -> list[str]:
        self._call("list_projects")
        return list(self._workspace(workspace_id).projects)

    def delete_project(self, workspace_id: str, project_id: str) -> None:
        self._call("delete_project")
        projects = self._workspace(workspace_id).projects
        if project_id in projects:
            projects.remove(project_id)
