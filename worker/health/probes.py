"""The metrics port: `/metrics` (Prometheus), `/healthz` (liveness), `/readyz`
(readiness); any other path is 404. Served on a daemon thread by every
long-running process, at PROVISIONER_METRICS_HOST:PROVISIONER_METRICS_PORT.

Liveness says only whether the process's own parts still run (a database or
broker outage never restarts a pod); readiness runs the process's health
checks, at most once per `READY_TTL_S` however often it is asked: 200 when every
one passes, 503 otherwise, each check by name as "ok" or "failing" and nothing
more (no host, user or database name). The details (what failed, since when)
need `Authorization: Bearer <PROVISIONER_WEB_TOKEN>`, or `provisioner health`.
Both answer JSON.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import urlsplit
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from infrastructure.failures import ConfigurationError
from infrastructure.redaction import NO_SECRETS, Secrets
from worker.health.metrics import StateCollector
from worker.health.report import checks_for
from worker.health.results import CheckResult, Health, Unhealthy, healthy, report

StartResponse = Callable[[str, list[tuple[str, str]]], Any]

READY_TTL_S = 5.0  # a probe storm runs the checks (new connections) once per this


def _starting() -> str:
    raise Unhealthy("the process is starting (waiting for its database)")


@dataclass
class Probes:
    """What the port answers; `health`, `live` and the state gauges are set once the
    process's parts are built (until then readiness says it is starting)."""

    health: Health = field(default_factory=lambda: Health([("startup", _starting)]))
    live: Callable[[], str | None] = lambda: None  # None: alive; else what stopped
    state: CollectorRegistry | None = None
    token: str | None = field(default=None, repr=False)  # shows /readyz's details
    secrets: Secrets = field(default=NO_SECRETS, repr=False)  # never in those details
    ttl_s: float = READY_TTL_S
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _ran: tuple[float, Health, list[CheckResult]] | None = field(default=None, init=False)

    def watch_state(self, facts: Callable[[], dict[str, Any]]) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StateCollector(facts))
        self.state = registry

    def attach(self, runtime: Any, parts: tuple[str, ...]) -> None:
        """The process's own checks and gauges: its gateway client, its in-process
        store if any, and liveness from its parts' threads."""
        gateway = getattr(runtime, "gateway", None) if "worker" in parts else None
        pace = getattr(runtime, "pace", None) if "worker" in parts else None
        in_process = urlsplit(runtime.settings.database_url).scheme == "memory"
        checks, facts = checks_for(
            runtime.settings,
            parts,
            gateway=gateway,
            app=runtime.app if in_process else None,
            views_url=getattr(runtime, "views_url", None) or None,
            pace=pace.state if pace is not None else None,
            contact=getattr(runtime, "contact", None),
        )
        self.watch_state(facts)
        self.live = lambda: _stopped(runtime.threads)
        self.token = runtime.settings.web_token
        self.secrets = runtime.settings.secrets()
        self.health = Health(checks)

    def results(self) -> list[CheckResult]:
        """The checks' last results, run again once they are `ttl_s` old (one run at a
        time: a request that comes meanwhile waits for it)."""
        with self._lock:
            ran = self._ran
            if ran is None or ran[1] is not self.health or time.monotonic() - ran[0] >= self.ttl_s:
                ran = self._ran = (time.monotonic(), self.health, self.health.run())
            return ran[2]

    def _authorized(self, environ: dict[str, Any]) -> bool:
        given = str(environ.get("HTTP_AUTHORIZATION", "")).encode()
        return self.token is not None and secrets.compare_digest(
            given, f"Bearer {self.token}".encode()
        )

    def __call__(self, environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "/")
        if path not in ("/metrics", "/healthz", "/readyz"):
            return _answer(start, "404 Not Found", {"error": f"no such path: {path}"[:200]})
        if method not in ("GET", "HEAD"):
            return _answer(start, "405 Method Not Allowed", {"error": "GET only"})
        if path == "/metrics":
            body = generate_latest(REGISTRY)
            if self.state is not None:
                body += generate_latest(self.state)
            start("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
            return [body]
        if path == "/healthz":
            stopped = self.live()
            if stopped:
                return _answer(
                    start, "503 Service Unavailable", {"status": "failing", "detail": stopped}
                )
            return _answer(start, "200 OK", {"status": "ok"})
        results = self.results()
        status = "200 OK" if healthy(results) else "503 Service Unavailable"
        if self._authorized(environ):
            return _answer(start, status, self.secrets.scrub_value(report(results)))
        return _answer(start, status, readiness(results))


def readiness(results: list[CheckResult]) -> dict[str, Any]:
    """What anyone may read: each check ok, degraded (ready all the same: an open
    gateway circuit) or failing, by name; the details need the token."""
    return {
        "status": report(results)["status"],
        "checks": {r.name: _word(r) for r in results},
    }


def _word(result: CheckResult) -> str:
    if not result.ok:
        return "failing"
    return "degraded" if result.degraded else "ok"


def _stopped(threads: list[threading.Thread]) -> str | None:
    dead = [t.name for t in threads if not t.is_alive()]
    return f"stopped: {', '.join(dead)}" if dead else None


def _answer(start: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode() + b"\n"
    start(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _V6Server(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes come every few seconds: no access log."""


def serve(host: str, port: int, probes: Probes) -> WSGIServer | None:
    """Serve `probes` at host:port on a daemon thread (port 0: nothing, None)."""
    if not port:
        return None
    server_class = _V6Server if ":" in host else _Server
    try:
        server = make_server(host, port, probes, server_class, handler_class=_Quiet)
    except OSError as exc:  # in use (another process of this host), or not ours to bind
        raise ConfigurationError(
            f"PROVISIONER_METRICS_PORT={port} on {host}: cannot listen ({exc.strerror or exc}); "
            "give each process on this host its own port, or 0 for none"
        ) from None
    threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
    return server
