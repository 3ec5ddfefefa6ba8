"""What the fake gateway knows (workspaces, projects, counts, scripts) and the
gateway calls it answers, as plain requests and replies (replies.py): no HTTP
here. Its metering and faults are in metering.py."""

from __future__ import annotations

import json
import operator
import random
import re
import secrets
import threading
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from infrastructure.fake_gateway.config import FakeConfig, JsonObject
from infrastructure.fake_gateway.metering import Metering, limiter
from infrastructure.fake_gateway.replies import (
    BadRequestError,
    NotFoundError,
    RawJson,
    Reply,
    Request,
    error_reply,
)

__all__ = [
    "FakeState",
]

OPERATIONS = ("create", "status", "family", "list_projects", "delete_project")
NOT_READY = "not ready"
# The terminal statuses a created child can settle into (docs/gateway.md).
TERMINAL_FATES = ("creation_failed", "failed", "error", "invalid subscription")
Fate = Literal["created", "zombie", "creation_failed", "failed", "error", "invalid subscription"]


@dataclass
class Workspace:
    id: str
    title: str
    parent: str | None
    created_at: str
    born: float
    projects: list[str] = field(default_factory=list)
    fixed_status: str | None = None
    fate: Fate = "created"
    settled: bool = False
    not_ready_polls: int = 0
    settle_polls: int | None = None  # a scripted title's own settle time
    resources: JsonObject = field(default_factory=dict)
    refuse_deletes: tuple[int, str] | None = None  # (status, message) of every project delete


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _recase(status: str, mode: str) -> str:
    if mode == "upper":
        return status.upper()
    if mode == "title":
        return status.title()
    return status


# A family listing's entries are encoded as the server encodes a reply body.
_ENCODER = json.JSONEncoder(separators=(",", ":"))
_STRING = json.encoder.encode_basestring_ascii
_FIXED_STATUS = operator.attrgetter("fixed_status")


def _entry(ws: Workspace, status: str) -> bytes:
    """`ws` as a family listing shows it with `status`, JSON-encoded."""
    wid, title = ws.id, ws.title
    if type(wid) is str and type(title) is str and type(status) is str:  # the same, faster
        return b'{"id":%b,"title":%b,"status":%b}' % (
            _STRING(wid).encode(),
            _STRING(title).encode(),
            _STRING(status).encode(),
        )
    return _ENCODER.encode({"id": ws.id, "title": ws.title, "status": status}).encode()


class _Family:
    """The children of one workspace in creation order, their titles, and their
    family listing entries as last encoded, so that a listing costs little more
    than peeking at the children whose status may have changed.

    A child's status changes only if it has no fixed status (it settles with time
    and polls: peeked at on every listing, as before) or if its fixed status is
    changed (a test may set it): the fixed statuses are compared with those the
    entries were encoded from on every listing, a loop in C. Ids, titles and
    parents never change."""

    def __init__(self) -> None:
        self.children: list[Workspace] = []
        self.titles: set[str] = set()
        self.mode = ""  # the status case of `entries` ("": none encoded yet)
        self.fixed: list[str | None] = []  # per encoded child, its fixed status then
        self.loose: list[int] = []  # the encoded children without a fixed status
        self.shown: list[str] = []  # per encoded child, the status in its entry
        self.entries: list[bytes] = []
        self.head = b""  # the parent's entry in `body`
        self.body: bytes | None = None  # the whole listing; None when stale

    def add(self, ws: Workspace) -> None:
        self.children.append(ws)
        self.titles.add(ws.title)

    def listing(self, head: bytes, mode: str, peek: Callable[[Workspace], str]) -> bytes:
        """The listing, JSON-encoded: `head` (the parent's entry), then the children
        with their statuses as `peek` gives them now, re-cased by `mode`."""
        children = self.children
        fixed = list(map(_FIXED_STATUS, children))
        if mode != self.mode:  # every entry to encode again
            self.mode, self.body = mode, None
            self.fixed, self.loose, self.shown, self.entries = [], [], [], []
        known = len(self.entries)
        seen = fixed if known == len(fixed) else fixed[:known]
        again = self.loose
        if seen != self.fixed:
            again = [i for i, was in enumerate(self.fixed) if seen[i] is None or seen[i] != was]
            self.loose = [i for i in range(known) if seen[i] is None]
        for i in again:
            status = _recase(peek(children[i]), mode)
            if status != self.shown[i]:
                self.shown[i], self.entries[i] = status, _entry(children[i], status)
                self.body = None
        if known < len(children):  # children added since: encode them
            added = children[known:]
            shown = [_recase(peek(ws), mode) for ws in added]
            self.shown.extend(shown)
            self.entries.extend(map(_entry, added, shown))
            self.loose.extend(i for i in range(known, len(fixed)) if fixed[i] is None)
            self.body = None
        self.fixed = fixed
        if self.body is None or head != self.head:
            self.head, self.body = head, b"".join((b"[", head, b",", b",".join(self.entries), b"]"))
        return self.body


# What a workspace's project deletes may be answered instead (0: deleted again).
_REFUSALS = frozenset({0, *range(400, 500)}) - {404, 429}
_SCRIPT = re.compile(
    r"|zombie|creation_failed|failed|error|invalid subscription"
    r"|timeout_after_create|timeout_without_create|unavailable_without_create|slow:\d{1,6}"
)


class FakeState(Metering):
    """Everything the fake knows, guarded by one lock."""

    def __init__(
        self, config: FakeConfig, parents: Sequence[str], *, id_prefix: str | None = None
    ) -> None:
        self.lock = threading.Lock()
        # Ids of one start never meet those of another: a random prefix per start
        # (`id_prefix` None), or the one given ("": none, the seed's ids alone).
        self.id_prefix = secrets.token_hex(4) if id_prefix is None else id_prefix
        self.stopping = threading.Event()
        self.config = config
        self.rng = random.Random(config.seed)  # noqa: S311 - reproducible fake, not crypto
        self._issued: set[str] = set()
        self.workspaces: dict[str, Workspace] = {}  # added by `_keep` alone
        self._families: dict[str, _Family] = {}  # per parent id, its children
        self.creates: dict[str, int] = {}
        self.dropped: dict[str, int] = {}  # per title: creates timed out with nothing made
        self.calls: dict[str, int] = dict.fromkeys(OPERATIONS, 0)
        self.faults: dict[str, int] = {}
        self.scripts: dict[str, str] = {}
        self.bucket = limiter(config.rate_limit, config.burst, config.rate_window)
        self.throttled = 0  # calls answered 429 by the bucket (throttle_rate counts in faults)
        self.outage = None  # the current or last one
        self.outage_calls = 0
        self.parent_ids = tuple(parents)
        for parent in self.parent_ids:
            self._add_parent(parent)

    # ---- helpers (caller holds the lock)

    def _new_id(self, prefix: str) -> str:
        while True:
            run = f"{self.id_prefix}-" if self.id_prefix else ""
            candidate = f"{prefix}-{run}{self.rng.getrandbits(48):012x}"
            if candidate not in self._issued:
                self._issued.add(candidate)
                return candidate

    def _add_parent(self, parent_id: str) -> None:
        self._issued.add(parent_id)
        ws = Workspace(
            parent_id,
            f"Organisation {parent_id}",
            None,
            _now_iso(),
            time.monotonic(),
            fixed_status="active",
        )
        ws.projects.append(self._new_id("prj"))
        self._keep(ws)

    def _keep(self, ws: Workspace) -> None:
        self.workspaces[ws.id] = ws
        self._index(ws)

    def _index(self, ws: Workspace) -> None:
        if ws.parent is None:
            return
        family = self._families.get(ws.parent)
        if family is None:
            family = self._families[ws.parent] = _Family()
        family.add(ws)

    def _get(self, workspace_id: str) -> Workspace:
        try:
            return self.workspaces[workspace_id]
        except KeyError:
            raise NotFoundError(f"workspace {workspace_id} not found") from None

    def _seed(self, title: str, parent: str | None, status: str, projects: int) -> Workspace:
        if parent is not None:
            self._get(parent)
        ws = Workspace(
            self._new_id("ws"), title, parent, _now_iso(), time.monotonic(), fixed_status=status
        )
        ws.projects.extend(self._new_id("prj") for _ in range(projects))
        self._keep(ws)
        return ws

    def _settles_now(self, ws: Workspace) -> bool:
        cfg = self.config
        aged = time.monotonic() - ws.born >= cfg.settle_s
        polls = cfg.settle_polls if ws.settle_polls is None else ws.settle_polls
        return ws.fate != "zombie" and aged and ws.not_ready_polls >= polls

    def _peek(self, ws: Workspace) -> str:
        """The status a poll would answer now, without counting as a poll."""
        if ws.fixed_status is not None:
            return ws.fixed_status
        if not ws.settled and self._settles_now(ws):
            ws.settled = True
        return ws.fate if ws.settled else NOT_READY

    def _poll(self, ws: Workspace) -> str:
        status = self._peek(ws)
        if ws.fixed_status is None and not ws.settled:
            ws.not_ready_polls += 1
        return status

    def _show(self, ws: Workspace) -> JsonObject:
        return {
            "id": ws.id,
            "title": ws.title,
            "parent": ws.parent,
            "status": self._peek(ws),
            "projects": list(ws.projects),
            "created_at": ws.created_at,
            "resources": dict(ws.resources),
            "refuse_deletes": _show_refusal(ws.refuse_deletes),
        }

    # ---- admin operations (take the lock)

    def snapshot(self) -> JsonObject:
        with self.lock:
            return {
                "id_prefix": self.id_prefix,
                "workspaces": [self._show(ws) for ws in self.workspaces.values()],
                "creates": dict(self.creates),
                "creates_dropped": dict(self.dropped),
                "calls": dict(self.calls),
                "calls_total": sum(self.calls.values()),
                "faults": dict(self.faults),
                "rate_limit": {
                    "rate": self.config.rate_limit,
                    "burst": self.config.burst,
                    "window": self.config.rate_window,
                },
                "throttled": self.throttled,
                "outage": self._show_outage(),
                "outage_calls": self.outage_calls,
            }

    def reset(self) -> None:
        with self.lock:
            self.workspaces = {
                wid: ws for wid, ws in self.workspaces.items() if wid in self.parent_ids
            }
            self._families = {}
            for ws in self.workspaces.values():
                self._index(ws)
            for parent in self.workspaces.values():
                parent.refuse_deletes = None
            self.creates.clear()
            self.dropped.clear()
            self.scripts.clear()
            self.calls = dict.fromkeys(OPERATIONS, 0)
            self.faults.clear()
            self.bucket.refill()
            self.throttled = self.outage_calls = 0
            self.outage = None

    def configure(self, knobs: typing.Mapping[str, object]) -> JsonObject:
        with self.lock:
            self.config.update(knobs)
            if "seed" in knobs:
                self.rng.seed(self.config.seed)
            if {"rate_limit", "burst", "rate_window"} & set(knobs):
                cfg = self.config
                self.bucket = limiter(cfg.rate_limit, cfg.burst, cfg.rate_window)
            return self.config.to_dict()

    def script(self, title: str, fate: str) -> dict[str, str]:
        """Fix what creates of this title do, instead of drawing it at random."""
        if not _SCRIPT.fullmatch(fate):
            raise ValueError(
                f"fate must be one of zombie, {', '.join(TERMINAL_FATES)}, timeout_after_create, "
                f"timeout_without_create, unavailable_without_create, slow:N or '', got {fate!r}"
            )
        with self.lock:
            if fate:
                self.scripts[title] = fate
            else:
                self.scripts.pop(title, None)
            return dict(self.scripts)

    def seed_workspace(
        self, title: str, parent: str | None, status: str, projects: int
    ) -> JsonObject:
        with self.lock:
            return self._show(self._seed(title, parent, status, projects))

    def seed_workspaces(
        self, title: str, parent: str | None, status: str, projects: int, count: int
    ) -> JsonObject:
        """`count` alike workspaces at once (a large family for a benchmark or a test)."""
        with self.lock:
            made = [self._seed(title, parent, status, projects) for _ in range(count)]
            return {"count": count, "first": made[0].id, "last": made[-1].id}

    def add_project(self, workspace_id: str) -> str:
        with self.lock:
            ws = self._get(workspace_id)
            project = self._new_id("prj")
            ws.projects.append(project)
            return project

    def refuse_deletes(self, workspace_id: str, status: object, message: object = "") -> JsonObject:
        """Answer every project delete in the workspace `status` (a 4xx but 404 and 429,
        which mean gone and try later) and delete nothing, until set to 0."""
        if type(status) is not int or status not in _REFUSALS or not isinstance(message, str):
            raise ValueError(f"status must be a 4xx but 404 and 429, or 0, got {status!r}")
        with self.lock:
            ws = self._get(workspace_id)
            refusal = message or f"project deletes refused in workspace {ws.id}"
            ws.refuse_deletes = (status, refusal) if status else None
            return self._show(ws)

    # ---- gateway operations

    def begin_call(self, operation: str, request: Request) -> tuple[float, Reply | None]:
        """Count the call, check the outage and the rate limit, then draw its faults;
        return (latency in s, fault reply or None)."""
        with self.lock:
            self.calls[operation] += 1
            if operation == "create":
                self._count_create(request)
            fault = self._refusal() or self._draw_fault(request)
            return self.config.latency_ms / 1000.0, fault

    def _count_create(self, request: Request) -> None:
        try:
            title = _title_of(request.json())
        except ValueError:  # not JSON, or no title: nothing to count it under
            return
        self.creates[title] = self.creates.get(title, 0) + 1

    def create(self, request: Request, params: tuple[str, ...]) -> Reply:
        body = request.json()
        with self.lock:
            parent = self._get(params[0])
            title = _title_of(body)
            resources = _resources_of(body)
            self._seed_same_title_others(parent.id, title)
            cfg = self.config
            script = self.scripts.get(title, "")
            if script == "unavailable_without_create":  # answered 503: nothing made
                self.dropped[title] = self.dropped.get(title, 0) + 1
                return Reply(503, {"error": "service unavailable"})
            if script:
                after = script == "timeout_after_create"
                without = script == "timeout_without_create"
            else:
                after = self._chance(cfg.create_timeout_after_create_rate)
                without = not after and self._chance(cfg.create_timeout_without_create_rate)
            answer: object = None
            if without:
                self.dropped[title] = self.dropped.get(title, 0) + 1
            else:
                ws = self._create_child(parent.id, title, resources, script)
                answer = {"id": ws.id, "status": _recase(NOT_READY, cfg.status_case)}
            if after or without:
                self._fault(
                    "create_timeout_after_create" if after else "create_timeout_without_create"
                )
                return Reply(200, answer, timeout=True, hold_s=cfg.hang_s, answer_after_hold=after)
            return Reply(200, answer)

    def _seed_same_title_others(self, parent: str, title: str) -> None:
        count = self.config.same_title_others
        if count <= 0:
            return
        family = self._families.get(parent)
        if family is not None and title in family.titles:
            return
        for _ in range(count):
            self._seed(title, parent, "created", 1)
            self._fault("same_title_other")

    def _create_child(
        self, parent: str, title: str, resources: JsonObject, script: str = ""
    ) -> Workspace:
        ws = Workspace(self._new_id("ws"), title, parent, _now_iso(), time.monotonic())
        ws.resources = resources
        if script:
            if script == "zombie":
                ws.fate = "zombie"
            elif script in TERMINAL_FATES:
                ws.fate = typing.cast(Fate, script)
            elif script.startswith("slow:"):
                ws.settle_polls = int(script.split(":", 1)[1])
        elif self._chance(self.config.zombie_rate):
            ws.fate = "zombie"
        elif self._chance(self.config.terminal_rate):
            ws.fate = "creation_failed"
        if ws.fate != "created":
            self._fault("zombie" if ws.fate == "zombie" else f"terminal:{ws.fate}")
        self._keep(ws)
        return ws

    def status(self, _request: Request, params: tuple[str, ...]) -> Reply:
        with self.lock:
            status = self._poll(self._get(params[0]))
            return Reply(200, {"status": _recase(status, self.config.status_case)})

    def family(self, _request: Request, params: tuple[str, ...]) -> Reply:
        with self.lock:
            parent = self._get(params[0])
            mode = self.config.status_case
            head = _entry(parent, _recase(self._peek(parent), mode))
            family = self._families.get(parent.id)
            if family is None:
                return Reply(200, RawJson(b"[" + head + b"]"))
            return Reply(200, RawJson(family.listing(head, mode, self._peek)))

    def list_projects(self, request: Request, params: tuple[str, ...]) -> Reply:
        if request.query.get("type") != ["ai"]:
            return error_reply(400, "query parameter type=ai is required")
        with self.lock:
            ws = self._get(params[0])
            return Reply(200, {"items": [{"id": project} for project in ws.projects]})

    def delete_project(self, _request: Request, params: tuple[str, ...]) -> Reply:
        workspace_id, project_id = params
        with self.lock:
            ws = self._get(workspace_id)
            if ws.refuse_deletes is not None:  # before the project is looked for: nothing done
                self._fault("delete_refused")
                return error_reply(*ws.refuse_deletes)
            if project_id not in ws.projects:
                raise NotFoundError(f"project {project_id} not found")
            ws.projects.remove(project_id)
            return Reply(204)


def _show_refusal(refusal: tuple[int, str] | None) -> JsonObject | None:
    return None if refusal is None else {"status": refusal[0], "message": refusal[1]}


def _title_of(body: object) -> str:
    title = body.get("title") if isinstance(body, dict) else None
    if not isinstance(title, str) or not title.strip():
        raise BadRequestError(422, "title is required")
    return title


def _resources_of(body: object) -> JsonObject:
    resources = body.get("resources", {}) if isinstance(body, dict) else {}
    if resources is None:
        return {}
    if not isinstance(resources, dict):
        raise BadRequestError(422, "resources must be an object")
    return resources
