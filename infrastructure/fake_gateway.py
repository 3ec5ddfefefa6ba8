"""A fake of the SaaS workspace gateway: a real HTTP server on loopback.

It speaks the calls of the gateway contract (see ``GATEWAY.md``) so that the
demo, the tests, the benchmarks and the reliability suite all exercise the real
HTTP adapter, and it adds admin endpoints under ``/_fake/`` to read, reset and
reconfigure it. Standard library only.

Gateway calls (need ``Authorization: Bearer <non-empty>``, else 401)::

    POST   /v2/workspaces/{parent}/child          {"title": T, "resources": {...}}
    GET    /v1/workspaces/{id}/status             {"status": S}
    GET    /v1/workspaces/{parent}/family         [{"id","title","status"}, ...] parent first
    GET    /v1/workspaces/{id}/projects?type=ai   {"items": [{"id": P}, ...]}
    DELETE /v1/workspaces/{id}/projects/{pid}     204, 404 when gone

Admin calls (JSON in and out, no auth, no faults, not counted)::

    GET  /_fake/state                     workspaces, creates per title, calls per operation
    POST /_fake/reset                     forget everything but the configured parents
    POST /_fake/config                    set knobs (a subset), answer the whole config
    POST /_fake/workspaces                seed {"title","parent","status","projects": n}
    POST /_fake/workspaces/{id}/projects  add a project, answer {"id": P}
    POST /_fake/scripts                   {"title": "fate"}: fix what creates of that
                                          title do (zombie, creation_failed,
                                          timeout_after_create, timeout_without_create,
                                          slow:N polls; "" clears); for demos and tests

Behaviour worth knowing:

* A created child answers ``not ready`` until it settles: after ``settle_polls``
  status polls answered ``not ready`` AND ``settle_s`` seconds since creation.
  It then becomes ``created`` (or ``creation_failed`` if it was drawn terminal
  at creation time); a zombie stays ``not ready`` forever. The family listing
  and the admin state show what a poll would answer now, without counting as one.
* Seeded workspaces (admin, ``same_title_others``) and the parents keep the
  status they were given. ``status_case`` re-cases the status strings of gateway
  answers only; the admin state always shows them as stored.
* A create "timeout" either closes the connection unanswered (``hang_s`` = 0)
  or holds the request ``hang_s`` seconds (past the client's read timeout), then
  sends the real answer (timeout after create) or closes unanswered (timeout
  without create). Every create received is counted in ``creates``, including
  those that time out or are refused.
* ``same_title_others`` = n: on a create of title T under a parent that has no
  child titled T yet, n ready children titled T with one project each are
  seeded first. They stand for same-title workspaces of OTHER brands.
* Random draws come from one ``random.Random(seed)`` under the state lock, and
  only for knobs whose rate is strictly between 0 and 1, so a fake started with
  the same seed and fed the same calls in the same order behaves the same.
  Ids are never reused within one fake's lifetime, even across resets.
* ``POST /_fake/reset`` keeps the configuration and the parents given at start
  (with their projects untouched); workspaces seeded with ``parent`` null are
  dropped like any other.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import re
import signal
import socket
import socketserver
import sys
import threading
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any, Literal, Self
from urllib.parse import parse_qs, urlsplit

JsonObject = dict[str, Any]

STATUS_CASES = ("lower", "upper", "title")
OPERATIONS = ("create", "status", "family", "list_projects", "delete_project")
_RATE_KNOBS = frozenset(
    {
        "create_timeout_after_create_rate",
        "create_timeout_without_create_rate",
        "zombie_rate",
        "terminal_rate",
        "throttle_rate",
        "server_error_rate",
        "unauthorized_rate",
    }
)
NOT_READY = "not ready"
_MAX_HEADERS = 100
_MAX_LINE = 65536


# --------------------------------------------------------------------------- config


@dataclass
class FakeConfig:
    """The knobs of the fake; every field is JSON-serialisable."""

    seed: int = 0
    settle_polls: int = 0
    settle_s: float = 0.0
    latency_ms: float = 0.0
    create_timeout_after_create_rate: float = 0.0
    create_timeout_without_create_rate: float = 0.0
    zombie_rate: float = 0.0
    terminal_rate: float = 0.0
    throttle_rate: float = 0.0
    server_error_rate: float = 0.0
    unauthorized_rate: float = 0.0
    hang_s: float = 0.0
    same_title_others: int = 0
    status_case: str = "lower"

    def __post_init__(self) -> None:
        self.update(asdict(self))

    def update(self, knobs: typing.Mapping[str, object]) -> None:
        """Validate every given knob, then set them all; nothing is set on error.

        Raises InvalidKnobError (a ValueError) naming the unknown or bad knob.
        """
        checked = {name: _check_knob(name, value) for name, value in knobs.items()}
        for name, value in checked.items():
            setattr(self, name, value)

    def to_dict(self) -> JsonObject:
        """The whole configuration as a JSON-ready dict."""
        return asdict(self)


KNOB_NAMES: tuple[str, ...] = tuple(f.name for f in fields(FakeConfig))
_KNOB_TYPES: dict[str, type] = {
    name: hint for name, hint in typing.get_type_hints(FakeConfig).items() if name in KNOB_NAMES
}


class InvalidKnobError(ValueError):
    """An unknown knob, or a value of the wrong type or range."""


def _check_knob(name: str, value: object) -> object:
    """Return the knob's value coerced to its type, or raise InvalidKnobError."""
    if name not in _KNOB_TYPES:
        raise InvalidKnobError(f"unknown knob {name!r} (known: {', '.join(KNOB_NAMES)})")
    kind = _KNOB_TYPES[name]
    if kind is str:
        if value not in STATUS_CASES:
            raise InvalidKnobError(
                f"{name} must be one of {', '.join(STATUS_CASES)}, got {value!r}"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidKnobError(f"{name} must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidKnobError(f"{name} must be finite, got {value!r}")
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise InvalidKnobError(f"{name} must be an integer, got {value!r}")
    try:
        number = int(value) if kind is int else float(value)
    except OverflowError:
        raise InvalidKnobError(f"{name} is out of range, got {value!r}") from None
    if name != "seed" and number < 0:
        raise InvalidKnobError(f"{name} must not be negative, got {value!r}")
    if name in _RATE_KNOBS and number > 1:
        raise InvalidKnobError(f"{name} is a rate between 0 and 1, got {value!r}")
    return number


# --------------------------------------------------------------------------- state


@dataclass
class _Workspace:
    id: str
    title: str
    parent: str | None
    created_at: str
    born: float
    projects: list[str] = field(default_factory=list)
    fixed_status: str | None = None
    fate: Literal["created", "creation_failed", "zombie"] = "created"
    settled: bool = False
    not_ready_polls: int = 0
    settle_polls: int | None = None  # a scripted title's own settle time
    resources: JsonObject = field(default_factory=dict)


@dataclass
class _Reply:
    """What to do with a request: answer it, or play a timeout."""

    status: int = 200
    body: object = None
    timeout: bool = False
    hold_s: float = 0.0
    answer_after_hold: bool = False


@dataclass
class _Request:
    method: str
    path: str
    query: dict[str, list[str]]
    authorization: str
    body: bytes

    def json(self) -> object:
        if not self.body:
            return {}
        return json.loads(self.body)


class _NotFoundError(LookupError):
    """A workspace or project the fake does not know."""


class _BadRequestError(ValueError):
    """A request the fake refuses, with its status code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> _Reply:
    return _Reply(status, {"error": message})


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _recase(status: str, mode: str) -> str:
    if mode == "upper":
        return status.upper()
    if mode == "title":
        return status.title()
    return status


Handler = Callable[[_Request, tuple[str, ...]], _Reply]


_SCRIPT = re.compile(
    r"|zombie|creation_failed|timeout_after_create|timeout_without_create|slow:\d{1,6}"
)


class _FakeState:
    """Everything the fake knows, guarded by one lock."""

    def __init__(self, config: FakeConfig, parents: Sequence[str]) -> None:
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.config = config
        self.rng = random.Random(config.seed)  # noqa: S311 - reproducible fake, not crypto
        self._issued: set[str] = set()
        self.workspaces: dict[str, _Workspace] = {}
        self.creates: dict[str, int] = {}
        self.calls: dict[str, int] = dict.fromkeys(OPERATIONS, 0)
        self.scripts: dict[str, str] = {}
        self.parent_ids = tuple(parents)
        for parent in self.parent_ids:
            self._add_parent(parent)

    # ---- helpers (caller holds the lock)

    def _new_id(self, prefix: str) -> str:
        while True:
            candidate = f"{prefix}-{self.rng.getrandbits(48):012x}"
            if candidate not in self._issued:
                self._issued.add(candidate)
                return candidate

    def _chance(self, rate: float) -> bool:
        if rate <= 0:
            return False
        if rate >= 1:
            return True
        return self.rng.random() < rate

    def _add_parent(self, parent_id: str) -> None:
        self._issued.add(parent_id)
        ws = _Workspace(
            parent_id,
            f"Organisation {parent_id}",
            None,
            _now_iso(),
            time.monotonic(),
            fixed_status="active",
        )
        ws.projects.append(self._new_id("prj"))
        self.workspaces[parent_id] = ws

    def _get(self, workspace_id: str) -> _Workspace:
        try:
            return self.workspaces[workspace_id]
        except KeyError:
            raise _NotFoundError(f"workspace {workspace_id} not found") from None

    def _seed(self, title: str, parent: str | None, status: str, projects: int) -> _Workspace:
        if parent is not None:
            self._get(parent)
        ws = _Workspace(
            self._new_id("ws"), title, parent, _now_iso(), time.monotonic(), fixed_status=status
        )
        ws.projects.extend(self._new_id("prj") for _ in range(projects))
        self.workspaces[ws.id] = ws
        return ws

    def _settles_now(self, ws: _Workspace) -> bool:
        cfg = self.config
        aged = time.monotonic() - ws.born >= cfg.settle_s
        polls = cfg.settle_polls if ws.settle_polls is None else ws.settle_polls
        return ws.fate != "zombie" and aged and ws.not_ready_polls >= polls

    def _peek(self, ws: _Workspace) -> str:
        """The status a poll would answer now, without counting as a poll."""
        if ws.fixed_status is not None:
            return ws.fixed_status
        if not ws.settled and self._settles_now(ws):
            ws.settled = True
        return ws.fate if ws.settled else NOT_READY

    def _poll(self, ws: _Workspace) -> str:
        status = self._peek(ws)
        if ws.fixed_status is None and not ws.settled:
            ws.not_ready_polls += 1
        return status

    def _show(self, ws: _Workspace) -> JsonObject:
        return {
            "id": ws.id,
            "title": ws.title,
            "parent": ws.parent,
            "status": self._peek(ws),
            "projects": list(ws.projects),
            "created_at": ws.created_at,
            "resources": dict(ws.resources),
        }

    # ---- admin operations (take the lock)

    def snapshot(self) -> JsonObject:
        with self.lock:
            return {
                "workspaces": [self._show(ws) for ws in self.workspaces.values()],
                "creates": dict(self.creates),
                "calls": dict(self.calls),
            }

    def reset(self) -> None:
        with self.lock:
            self.workspaces = {
                wid: ws for wid, ws in self.workspaces.items() if wid in self.parent_ids
            }
            self.creates.clear()
            self.scripts.clear()
            self.calls = dict.fromkeys(OPERATIONS, 0)

    def configure(self, knobs: typing.Mapping[str, object]) -> JsonObject:
        with self.lock:
            self.config.update(knobs)
            if "seed" in knobs:
                self.rng.seed(self.config.seed)
            return self.config.to_dict()

    def script(self, title: str, fate: str) -> dict[str, str]:
        """Fix what creates of this title do, instead of drawing it at random."""
        if not _SCRIPT.fullmatch(fate):
            raise ValueError(
                f"fate must be one of zombie, creation_failed, timeout_after_create, "
                f"timeout_without_create, slow:N or '' (to clear), got {fate!r}"
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

    def add_project(self, workspace_id: str) -> str:
        with self.lock:
            ws = self._get(workspace_id)
            project = self._new_id("prj")
            ws.projects.append(project)
            return project

    # ---- gateway operations

    def begin_call(self, operation: str, request: _Request) -> tuple[float, _Reply | None]:
        """Count the call, draw its faults; return (latency in s, fault reply or None)."""
        with self.lock:
            self.calls[operation] += 1
            if operation == "create":
                self._count_create(request)
            fault = self._draw_fault(request)
            return self.config.latency_ms / 1000.0, fault

    def _count_create(self, request: _Request) -> None:
        try:
            title = _title_of(request.json())
        except ValueError:  # not JSON, or no title: nothing to count it under
            return
        self.creates[title] = self.creates.get(title, 0) + 1

    def _draw_fault(self, request: _Request) -> _Reply | None:
        scheme, _, token = request.authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _error(401, "missing or malformed bearer token")
        cfg = self.config
        if self._chance(cfg.unauthorized_rate):
            return _error(401, "invalid credentials")
        if request.method == "GET" and self._chance(cfg.throttle_rate):
            return _error(429, "too many requests")
        if request.method == "GET" and self._chance(cfg.server_error_rate):
            return _error(503, "service unavailable")
        return None

    def create(self, request: _Request, params: tuple[str, ...]) -> _Reply:
        body = request.json()
        with self.lock:
            parent = self._get(params[0])
            title = _title_of(body)
            resources = _resources_of(body)
            self._seed_same_title_others(parent.id, title)
            cfg = self.config
            script = self.scripts.get(title, "")
            if script:
                after = script == "timeout_after_create"
                without = script == "timeout_without_create"
            else:
                after = self._chance(cfg.create_timeout_after_create_rate)
                without = not after and self._chance(cfg.create_timeout_without_create_rate)
            answer: object = None
            if not without:
                ws = self._create_child(parent.id, title, resources, script)
                answer = {"id": ws.id, "status": _recase(NOT_READY, cfg.status_case)}
            if after or without:
                return _Reply(200, answer, timeout=True, hold_s=cfg.hang_s, answer_after_hold=after)
            return _Reply(200, answer)

    def _seed_same_title_others(self, parent: str, title: str) -> None:
        count = self.config.same_title_others
        if count <= 0:
            return
        if any(ws.parent == parent and ws.title == title for ws in self.workspaces.values()):
            return
        for _ in range(count):
            self._seed(title, parent, "created", 1)

    def _create_child(
        self, parent: str, title: str, resources: JsonObject, script: str = ""
    ) -> _Workspace:
        ws = _Workspace(self._new_id("ws"), title, parent, _now_iso(), time.monotonic())
        ws.resources = resources
        if script:
            if script in ("zombie", "creation_failed"):
                ws.fate = "zombie" if script == "zombie" else "creation_failed"
            elif script.startswith("slow:"):
                ws.settle_polls = int(script.split(":", 1)[1])
        elif self._chance(self.config.zombie_rate):
            ws.fate = "zombie"
        elif self._chance(self.config.terminal_rate):
            ws.fate = "creation_failed"
        self.workspaces[ws.id] = ws
        return ws

    def status(self, _request: _Request, params: tuple[str, ...]) -> _Reply:
        with self.lock:
            status = self._poll(self._get(params[0]))
            return _Reply(200, {"status": _recase(status, self.config.status_case)})

    def family(self, _request: _Request, params: tuple[str, ...]) -> _Reply:
        with self.lock:
            parent = self._get(params[0])
            members = [parent, *(ws for ws in self.workspaces.values() if ws.parent == parent.id)]
            mode = self.config.status_case
            listing = [
                {"id": ws.id, "title": ws.title, "status": _recase(self._peek(ws), mode)}
                for ws in members
            ]
            return _Reply(200, listing)

    def list_projects(self, request: _Request, params: tuple[str, ...]) -> _Reply:
        if request.query.get("type") != ["ai"]:
            return _error(400, "query parameter type=ai is required")
        with self.lock:
            ws = self._get(params[0])
            return _Reply(200, {"items": [{"id": project} for project in ws.projects]})

    def delete_project(self, _request: _Request, params: tuple[str, ...]) -> _Reply:
        workspace_id, project_id = params
        with self.lock:
            ws = self._get(workspace_id)
            if project_id not in ws.projects:
                raise _NotFoundError(f"project {project_id} not found")
            ws.projects.remove(project_id)
            return _Reply(204)


def _title_of(body: object) -> str:
    title = body.get("title") if isinstance(body, dict) else None
    if not isinstance(title, str) or not title.strip():
        raise _BadRequestError(422, "title is required")
    return title


def _resources_of(body: object) -> JsonObject:
    resources = body.get("resources", {}) if isinstance(body, dict) else {}
    if resources is None:
        return {}
    if not isinstance(resources, dict):
        raise _BadRequestError(422, "resources must be an object")
    return resources


# --------------------------------------------------------------------------- routing

_WS = r"([^/]+)"
_GATEWAY_ROUTES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("POST", re.compile(rf"/v2/workspaces/{_WS}/child"), "create"),
    ("GET", re.compile(rf"/v1/workspaces/{_WS}/status"), "status"),
    ("GET", re.compile(rf"/v1/workspaces/{_WS}/family"), "family"),
    ("GET", re.compile(rf"/v1/workspaces/{_WS}/projects"), "list_projects"),
    ("DELETE", re.compile(rf"/v1/workspaces/{_WS}/projects/{_WS}"), "delete_project"),
)


class _Admin:
    """The /_fake/ endpoints."""

    def __init__(self, state: _FakeState) -> None:
        self.state = state
        self.routes: tuple[tuple[str, re.Pattern[str], Handler], ...] = (
            ("GET", re.compile(r"/_fake/state"), self.get_state),
            ("POST", re.compile(r"/_fake/reset"), self.reset),
            ("POST", re.compile(r"/_fake/config"), self.configure),
            ("GET", re.compile(r"/_fake/config"), self.get_config),
            ("POST", re.compile(r"/_fake/workspaces"), self.seed_workspace),
            ("POST", re.compile(r"/_fake/scripts"), self.script),
            ("POST", re.compile(rf"/_fake/workspaces/{_WS}/projects"), self.add_project),
        )

    def get_state(self, _request: _Request, _params: tuple[str, ...]) -> _Reply:
        return _Reply(200, self.state.snapshot())

    def reset(self, _request: _Request, _params: tuple[str, ...]) -> _Reply:
        self.state.reset()
        return _Reply(200, self.state.snapshot())

    def get_config(self, _request: _Request, _params: tuple[str, ...]) -> _Reply:
        with self.state.lock:
            return _Reply(200, self.state.config.to_dict())

    def configure(self, request: _Request, _params: tuple[str, ...]) -> _Reply:
        knobs = request.json()
        if not isinstance(knobs, dict):
            return _error(400, "config body must be a JSON object of knobs")
        try:
            return _Reply(200, self.state.configure(knobs))
        except ValueError as exc:
            return _error(400, str(exc))

    def seed_workspace(self, request: _Request, _params: tuple[str, ...]) -> _Reply:
        body = request.json()
        if not isinstance(body, dict):
            return _error(400, "body must be a JSON object")
        title, parent = body.get("title"), body.get("parent")
        status, projects = body.get("status", "created"), body.get("projects", 0)
        if not isinstance(title, str) or not isinstance(status, str):
            return _error(400, "title and status must be strings")
        if parent is not None and not isinstance(parent, str):
            return _error(400, "parent must be a string or null")
        if isinstance(projects, bool) or not isinstance(projects, int) or projects < 0:
            return _error(400, "projects must be a non-negative integer")
        return _Reply(200, self.state.seed_workspace(title, parent, status, projects))

    def add_project(self, _request: _Request, params: tuple[str, ...]) -> _Reply:
        return _Reply(200, {"id": self.state.add_project(params[0])})

    def script(self, request: _Request, _params: tuple[str, ...]) -> _Reply:
        body = request.json()
        if not isinstance(body, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in body.items()
        ):
            return _error(400, 'body must be {"title": "fate", ...}')
        try:
            scripts: dict[str, str] = {}
            for title, fate in body.items():
                scripts = self.state.script(title, fate)
        except ValueError as exc:
            return _error(400, str(exc))
        return _Reply(200, scripts)


def _route(
    routes: Sequence[tuple[str, re.Pattern[str], Any]], request: _Request
) -> tuple[Any, tuple[str, ...]] | _Reply:
    """Find the route's target and path parameters, or a 404/405 reply."""
    path_known = False
    for method, pattern, target in routes:
        match = pattern.fullmatch(request.path)
        if match is None:
            continue
        if method == request.method:
            return target, match.groups()
        path_known = True
    if path_known:
        return _error(405, f"method {request.method} not allowed on {request.path}")
    return _error(404, f"no route for {request.method} {request.path}")


class _Dispatcher:
    """Turns a parsed request into a reply, applying latency and faults."""

    def __init__(self, state: _FakeState) -> None:
        self.state = state
        self.admin = _Admin(state)
        self.gateway: dict[str, Handler] = {
            "create": state.create,
            "status": state.status,
            "family": state.family,
            "list_projects": state.list_projects,
            "delete_project": state.delete_project,
        }

    def dispatch(self, request: _Request) -> _Reply:
        try:
            if request.path.startswith("/_fake/"):
                return self._call(self.admin.routes, request)
            return self._gateway_call(request)
        except _NotFoundError as exc:
            return _error(404, str(exc))
        except _BadRequestError as exc:
            return _error(exc.status, str(exc))
        except ValueError as exc:  # body that is not JSON
            return _error(400, f"malformed request body: {exc}")

    def _call(
        self, routes: Sequence[tuple[str, re.Pattern[str], Any]], request: _Request
    ) -> _Reply:
        found = _route(routes, request)
        if isinstance(found, _Reply):
            return found
        handler, params = found
        reply: _Reply = handler(request, params)
        return reply

    def _gateway_call(self, request: _Request) -> _Reply:
        found = _route(_GATEWAY_ROUTES, request)
        if isinstance(found, _Reply):
            return found
        operation, params = found
        latency_s, fault = self.state.begin_call(operation, request)
        if latency_s > 0:
            self.state.stopping.wait(latency_s)
        if fault is not None:
            return fault
        return self.gateway[operation](request, params)


# --------------------------------------------------------------------------- HTTP


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], dispatcher: _Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _RequestHandler)

    def server_bind(self) -> None:
        """Bind without ``socket.getfqdn`` (a DNS lookup the fake has no use for)."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def track(self, connection: socket.socket, *, add: bool) -> None:
        with self.connections_lock:
            if add:
                self.connections.add(connection)
            else:
                self.connections.discard(connection)

    def drop_connections(self) -> None:
        """Shut down every open keep-alive connection so its thread ends."""
        with self.connections_lock:
            open_connections = list(self.connections)
        for connection in open_connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # the client went away; nothing to report
        super().handle_error(request, client_address)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "fake-gateway/1"
    server: _Server
    fields: dict[str, str]
    raw_requestline: bytes  # set by handle_one_request; not in typeshed

    def parse_request(self) -> bool:
        """Parse the request line and headers, without the stdlib's email parser.

        ``email.parser`` cost about 40 % of a whole call; the fake only needs a
        few headers, read into ``self.fields`` (lower-cased names).
        """
        self.command, self.request_version, self.close_connection = "", "HTTP/0.9", True
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if len(words) != 3 or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            self.send_error(400, "bad request line")
            return False
        self.command, self.path, self.request_version = words
        fields = self._read_fields()
        if fields is None:
            self.send_error(431, "header section too large or malformed")
            return False
        self.fields = fields
        connection = fields.get("connection", "").lower()
        http10 = self.request_version == "HTTP/1.0"
        self.close_connection = connection == "close" or (http10 and connection != "keep-alive")
        return True

    def _read_fields(self) -> dict[str, str] | None:
        fields: dict[str, str] = {}
        for _ in range(_MAX_HEADERS):
            line = self.rfile.readline(_MAX_LINE + 1)
            if len(line) > _MAX_LINE:
                return None
            if line in (b"\r\n", b"\n", b""):
                return fields
            name, colon, value = str(line, "iso-8859-1").partition(":")
            if not colon:
                return None
            fields[name.strip().lower()] = value.strip()
        return None

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, add=True)

    def finish(self) -> None:
        self.server.track(self.connection, add=False)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: the fake serves thousands of calls in a benchmark."""

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def _serve(self) -> None:
        request = self._read_request()
        if request is None:
            return
        reply = self.server.dispatcher.dispatch(request)
        if reply.timeout:
            self._play_timeout(reply)
        else:
            self._send(reply.status, reply.body)

    def _read_request(self) -> _Request | None:
        if "chunked" in self.fields.get("transfer-encoding", "").lower():
            self.close_connection = True
            self._send(411, {"error": "send a Content-Length"})
            return None
        try:
            length = int(self.fields.get("content-length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self._send(400, {"error": "bad Content-Length"})
            return None
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        return _Request(
            self.command,
            parts.path,
            parse_qs(parts.query),
            self.fields.get("authorization", ""),
            body,
        )

    def _play_timeout(self, reply: _Reply) -> None:
        if reply.hold_s > 0:
            self.server.dispatcher.state.stopping.wait(reply.hold_s)
            if reply.answer_after_hold:
                self._send(reply.status, reply.body)
                return
        self.close_connection = True  # close unanswered: nothing is written

    def _send(self, status: int, body: object) -> None:
        """Write status line, headers and body in ONE write (no Nagle stalls)."""
        head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
        payload = b""
        if status != 204:
            payload = json.dumps(body, separators=(",", ":")).encode()
            head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        if self.close_connection:
            head.append("Connection: close")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload
        try:
            self.wfile.write(data)
        except OSError:
            self.close_connection = True


# --------------------------------------------------------------------------- public


class FakeGateway:
    """The fake gateway: start it, point the adapter at ``url``, inspect ``state()``."""

    def __init__(
        self,
        config: FakeConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        parents: Sequence[str] = ("org-parent",),
    ) -> None:
        self._state = _FakeState(config if config is not None else FakeConfig(), parents)
        self._address = (host, port)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle

    def start(self) -> Self:
        """Bind and serve in a daemon thread; return self."""
        if self._server is not None:
            return self
        self._state.stopping.clear()
        self._server = _Server(self._address, _Dispatcher(self._state))
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-gateway",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end held requests and open connections, free the port."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._state.stopping.set()
        server.shutdown()
        server.drop_connections()
        server.server_close()
        thread.join()
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:43117`` (only once started)."""
        if self._server is None:
            raise RuntimeError("the fake gateway is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # ---- admin, in process

    @property
    def parents(self) -> tuple[str, ...]:
        return self._state.parent_ids

    def configure(self, **knobs: object) -> JsonObject:
        """Set knobs (ValueError on an unknown knob or bad value); return the whole config."""
        return self._state.configure(knobs)

    def reset(self) -> None:
        """Forget every workspace but the parents, and the call counts; keep the config."""
        self._state.reset()

    def state(self) -> JsonObject:
        """The same document as ``GET /_fake/state``."""
        return self._state.snapshot()

    def seed_workspace(
        self, title: str, parent: str | None, status: str = "created", projects: int = 0
    ) -> JsonObject:
        """Add a workspace with a fixed status; ``parent=None`` adds a top-level parent."""
        try:
            return self._state.seed_workspace(title, parent, status, projects)
        except _NotFoundError as exc:
            raise KeyError(str(exc)) from None

    def add_project(self, workspace_id: str) -> str:
        """Add a project to a workspace; return its id (KeyError if unknown)."""
        try:
            return self._state.add_project(workspace_id)
        except _NotFoundError as exc:
            raise KeyError(str(exc)) from None

    def script(self, title: str, fate: str) -> dict[str, str]:
        """Fix the fate of creates titled ``title``: zombie, creation_failed,
        timeout_after_create, timeout_without_create, slow:N ('' clears it)."""
        return self._state.script(title, fate)


# --------------------------------------------------------------------------- CLI


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_arg_parser() -> argparse.ArgumentParser:
    """The command-line parser: host, port, parents and one flag per knob."""
    parser = argparse.ArgumentParser(
        prog="python -m infrastructure.fake_gateway", description="Serve the fake gateway."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089, help="0 picks a free port")
    parser.add_argument(
        "--parent",
        action="append",
        dest="parents",
        metavar="ID",
        help="a parent workspace id (repeatable; default org-parent)",
    )
    defaults = FakeConfig()
    for name in KNOB_NAMES:
        kind = _KNOB_TYPES[name]
        extra: dict[str, Any] = {"choices": STATUS_CASES} if kind is str else {}
        parser.add_argument(
            _flag(name),
            dest=name,
            type=kind,
            default=None,
            help=f"default {getattr(defaults, name)!r}",
            **extra,
        )
    return parser


def config_from_args(args: argparse.Namespace) -> FakeConfig:
    """A FakeConfig holding the knobs given on the command line."""
    config = FakeConfig()
    config.update(
        {name: getattr(args, name) for name in KNOB_NAMES if getattr(args, name) is not None}
    )
    return config


def _on_signal(done: threading.Event) -> Callable[[int, FrameType | None], None]:
    def handler(_signum: int, _frame: FrameType | None) -> None:
        done.set()

    return handler


def main(argv: list[str] | None = None) -> int:
    """Serve the fake until SIGINT or SIGTERM; print the listening URL first."""
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    parents = tuple(args.parents) if args.parents else ("org-parent",)
    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal(done))
    with FakeGateway(config, host=args.host, port=args.port, parents=parents) as fake:
        print(f"fake gateway listening on {fake.url}", flush=True)
        while not done.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
