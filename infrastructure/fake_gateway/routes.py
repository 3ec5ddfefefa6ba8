"""Routing of the fake gateway: gateway calls (with latency and faults) and the
``/_fake/`` admin endpoints, from a parsed request to a reply."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from infrastructure.fake_gateway.metering import refuses
from infrastructure.fake_gateway.replies import (
    BadRequestError,
    Handler,
    NotFoundError,
    Reply,
    Request,
    error_reply,
)
from infrastructure.fake_gateway.state import FakeState

_WS = r"([^/]+)"
GATEWAY_ROUTES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("POST", re.compile(rf"/v2/workspaces/{_WS}/child"), "create"),
    ("GET", re.compile(rf"/v1/workspaces/{_WS}/status"), "status"),
    ("GET", re.compile(rf"/v1/workspaces/{_WS}/family"), "family"),
    ("GET", re.compile(rf"/v1/workspaces/{_WS}/projects"), "list_projects"),
    ("DELETE", re.compile(rf"/v1/workspaces/{_WS}/projects/{_WS}"), "delete_project"),
)


# The admin calls, one line each, as `provisioner fake-gateway --help` lists them
# (a test holds this table and `_Admin.routes` to the same calls).
ADMIN_CALLS: tuple[tuple[str, str, str], ...] = (
    ("GET", "/_fake/state", "workspaces, creates, calls, faults, throttled, outage"),
    ("POST", "/_fake/reset", "forget all but the parents; keeps the config"),
    ("GET", "/_fake/config", "the knobs in force"),
    ("POST", "/_fake/config", 'set knobs {"zombie_rate": 0.1, ...}; answers them all'),
    ("POST", "/_fake/workspaces", 'seed {"title", "parent", "status", "projects": n, "count": N}'),
    ("POST", "/_fake/workspaces/{id}/projects", 'add a project; answers {"id": P}'),
    ("POST", "/_fake/workspaces/{id}/refuse-deletes", '{"status": 409}: deletes refused; 0 ends'),
    ("POST", "/_fake/scripts", '{"title": "fate"}: fix what creates of that title do'),
    ("POST", "/_fake/outage", '{"seconds": N, "mode": "503" | "refuse"}; 0 ends one'),
)
SEED_MAX = 200_000  # workspaces of one seeding call: `{"count": N}` answers first and last ids
SCRIPT_FATES = (
    "zombie, creation_failed, failed, error, invalid subscription, timeout_after_create, "
    'timeout_without_create, unavailable_without_create (a 503), slow:N (polls); "" clears'
)


class _Admin:
    """The /_fake/ endpoints."""

    def __init__(self, state: FakeState) -> None:
        self.state = state
        self.routes: tuple[tuple[str, re.Pattern[str], Handler], ...] = (
            ("GET", re.compile(r"/_fake/state"), self.get_state),
            ("POST", re.compile(r"/_fake/reset"), self.reset),
            ("POST", re.compile(r"/_fake/config"), self.configure),
            ("GET", re.compile(r"/_fake/config"), self.get_config),
            ("POST", re.compile(r"/_fake/workspaces"), self.seed_workspace),
            ("POST", re.compile(r"/_fake/scripts"), self.script),
            ("POST", re.compile(r"/_fake/outage"), self.outage),
            ("POST", re.compile(rf"/_fake/workspaces/{_WS}/projects"), self.add_project),
            ("POST", re.compile(rf"/_fake/workspaces/{_WS}/refuse-deletes"), self.refuse_deletes),
        )

    def get_state(self, _request: Request, _params: tuple[str, ...]) -> Reply:
        return Reply(200, self.state.snapshot())

    def reset(self, _request: Request, _params: tuple[str, ...]) -> Reply:
        self.state.reset()
        return Reply(200, self.state.snapshot())

    def get_config(self, _request: Request, _params: tuple[str, ...]) -> Reply:
        with self.state.lock:
            return Reply(200, self.state.config.to_dict())

    def configure(self, request: Request, _params: tuple[str, ...]) -> Reply:
        knobs = request.json()
        if not isinstance(knobs, dict):
            return error_reply(400, "config body must be a JSON object of knobs")
        try:
            return Reply(200, self.state.configure(knobs))
        except ValueError as exc:
            return error_reply(400, str(exc))

    def seed_workspace(self, request: Request, _params: tuple[str, ...]) -> Reply:
        body = request.json()
        if not isinstance(body, dict):
            return error_reply(400, "body must be a JSON object")
        title, parent = body.get("title"), body.get("parent")
        status, projects = body.get("status", "created"), body.get("projects", 0)
        if not isinstance(title, str) or not isinstance(status, str):
            return error_reply(400, "title and status must be strings")
        if parent is not None and not isinstance(parent, str):
            return error_reply(400, "parent must be a string or null")
        if isinstance(projects, bool) or not isinstance(projects, int) or projects < 0:
            return error_reply(400, "projects must be a non-negative integer")
        if "count" not in body:  # one: answered with the workspace
            return Reply(200, self.state.seed_workspace(title, parent, status, projects))
        count = body["count"]
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= SEED_MAX:
            return error_reply(400, f"count must be an integer from 1 to {SEED_MAX}")
        return Reply(200, self.state.seed_workspaces(title, parent, status, projects, count))

    def add_project(self, _request: Request, params: tuple[str, ...]) -> Reply:
        return Reply(200, {"id": self.state.add_project(params[0])})

    def refuse_deletes(self, request: Request, params: tuple[str, ...]) -> Reply:
        body = request.json()
        if not isinstance(body, dict) or "status" not in body or set(body) - {"status", "message"}:
            return error_reply(400, 'body must be {"status": 4xx | 0, "message": M}')
        try:
            return Reply(200, self.state.refuse_deletes(params[0], **body))
        except ValueError as exc:
            return error_reply(400, str(exc))

    def script(self, request: Request, _params: tuple[str, ...]) -> Reply:
        body = request.json()
        if not isinstance(body, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in body.items()
        ):
            return error_reply(400, 'body must be {"title": "fate", ...}')
        try:
            scripts: dict[str, str] = {}
            for title, fate in body.items():
                scripts = self.state.script(title, fate)
        except ValueError as exc:
            return error_reply(400, str(exc))
        return Reply(200, scripts)

    def outage(self, request: Request, _params: tuple[str, ...]) -> Reply:
        body = request.json()
        if not isinstance(body, dict) or "seconds" not in body or set(body) - {"seconds", "mode"}:
            return error_reply(400, 'body must be {"seconds": N, "mode": "503" | "refuse"}')
        outage = self.state.start_outage(body["seconds"], body.get("mode", "503"))
        return Reply(200, outage, close_listener=refuses(outage))


def _route(
    routes: Sequence[tuple[str, re.Pattern[str], Any]], request: Request
) -> tuple[Any, tuple[str, ...]] | Reply:
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
        return error_reply(405, f"method {request.method} not allowed on {request.path}")
    return error_reply(404, f"no route for {request.method} {request.path}")


class Dispatcher:
    """Turns a parsed request into a reply, applying latency and faults."""

    def __init__(self, state: FakeState) -> None:
        self.state = state
        self.admin = _Admin(state)
        self.gateway: dict[str, Handler] = {
            "create": state.create,
            "status": state.status,
            "family": state.family,
            "list_projects": state.list_projects,
            "delete_project": state.delete_project,
        }

    def dispatch(self, request: Request) -> Reply:
        try:
            if request.path.startswith("/_fake/"):
                return self._call(self.admin.routes, request)
            return self._gateway_call(request)
        except NotFoundError as exc:
            return error_reply(404, str(exc))
        except BadRequestError as exc:
            return error_reply(exc.status, str(exc))
        except ValueError as exc:  # body that is not JSON
            return error_reply(400, f"malformed request body: {exc}")

    def _call(self, routes: Sequence[tuple[str, re.Pattern[str], Any]], request: Request) -> Reply:
        found = _route(routes, request)
        if isinstance(found, Reply):
            return found
        handler, params = found
        reply: Reply = handler(request, params)
        return reply

    def _gateway_call(self, request: Request) -> Reply:
        found = _route(GATEWAY_ROUTES, request)
        if isinstance(found, Reply):
            return found
        operation, params = found
        latency_s, fault = self.state.begin_call(operation, request)
        if latency_s > 0:
            self.state.stopping.wait(latency_s)
        if fault is not None:
            return fault
        return self.gateway[operation](request, params)
