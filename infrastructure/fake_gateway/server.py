"""The fake gateway's HTTP server (the standard library's `http.server`) and
`FakeGateway`, which starts and stops it and offers the admin calls in process.

A refuse outage closes the listening socket, so that clients see a connection
refused, and binds the same port again when it ends: the serving thread does
both (no other thread touches the listening socket) and keeps running."""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from infrastructure.fake_gateway.config import FakeConfig, JsonObject
from infrastructure.fake_gateway.metering import refuses
from infrastructure.fake_gateway.replies import NotFoundError, RawJson, Reply, Request
from infrastructure.fake_gateway.routes import Dispatcher
from infrastructure.fake_gateway.state import FakeState


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        self.refuse_lock = threading.Lock()  # one refusal at a time
        self.refusing = threading.Event()  # asked to close the listening socket
        self.closed = threading.Event()  # the listening socket is closed
        super().__init__(address, _RequestHandler)

    def serve(self) -> None:
        """Serve until the fake stops; sit out refuse outages with the port closed."""
        state = self.dispatcher.state
        while not state.stopping.is_set():
            self.serve_forever(poll_interval=0.05)
            if not self.refusing.is_set():
                continue
            self.socket.close()
            self.closed.set()
            while (left := state.refusing_s()) > 0 and not state.stopping.wait(min(left, 0.05)):
                pass
            self._listen_again()

    def refuse(self, spare: socket.socket | None = None) -> None:
        """Close the listening socket (connections are refused from now on) and
        drop every open connection but ``spare``; return once it is closed."""
        stopping = self.dispatcher.state.stopping
        with self.refuse_lock:
            if self.closed.is_set():
                return
            self.refusing.set()
            self.shutdown()  # serve_forever returns, and polls the socket no more
            while not self.closed.wait(0.05) and not stopping.is_set():
                pass
        self.drop_connections(spare)

    def _listen_again(self) -> None:
        """Bind the same port again (SO_REUSEADDR, as at start), unless stopping."""
        stopping = self.dispatcher.state.stopping
        with self.refuse_lock:
            while not stopping.is_set():
                self.socket = socket.socket(self.address_family, self.socket_type)
                try:
                    self.server_bind()
                    self.server_activate()
                    break
                except OSError:  # the port is taken meanwhile: try again shortly
                    self.socket.close()
                    stopping.wait(0.05)
            self.refusing.clear()
            self.closed.clear()

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

    def drop_connections(self, spare: socket.socket | None = None) -> None:
        """Shut down every open keep-alive connection but ``spare`` so its thread ends."""
        with self.connections_lock:
            open_connections = [c for c in self.connections if c is not spare]
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
        if reply.close_listener:  # before answering: the next connect must be refused
            self.close_connection = True
            self.server.refuse(spare=self.connection)
        if reply.timeout:
            self._play_timeout(reply)
        else:
            self._send(reply.status, reply.body, reply.headers)

    def _read_request(self) -> Request | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            self._send(411, {"error": "send a Content-Length"})
            return None
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self._send(400, {"error": "bad Content-Length"})
            return None
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        return Request(
            self.command,
            parts.path,
            parse_qs(parts.query),
            self.headers.get("Authorization", ""),
            body,
        )

    def _play_timeout(self, reply: Reply) -> None:
        if reply.hold_s > 0:
            self.server.dispatcher.state.stopping.wait(reply.hold_s)
            if reply.answer_after_hold:
                self._send(reply.status, reply.body)
                return
        self.close_connection = True  # close unanswered: nothing is written

    def _send(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
        if status == 204:
            payload = b""
        elif isinstance(body, RawJson):
            payload = body.data
        else:
            payload = json.dumps(body, separators=(",", ":")).encode()
        try:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if status != 204:
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            self.close_connection = True


class FakeGateway:
    """The fake gateway: start it, point the adapter at ``url``, inspect ``state()``."""

    def __init__(
        self,
        config: FakeConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        parents: Sequence[str] = ("org-parent",),
        id_prefix: str | None = None,
    ) -> None:
        """`id_prefix`: what every id it issues starts with after its kind (`ws-`,
        `prj-`); None, a random one per instance, so that ids never repeat across
        restarts; "" for ids that follow from the seed alone."""
        config = config if config is not None else FakeConfig()
        self._state = FakeState(config, parents, id_prefix=id_prefix)
        self._address = (host, port)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle

    def start(self) -> Self:
        """Bind and serve in a daemon thread; return self."""
        if self._server is not None:
            return self
        self._state.stopping.clear()
        self._server = _Server(self._address, Dispatcher(self._state))
        self._thread = threading.Thread(target=self._server.serve, name="fake-gateway", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end held requests and open connections, free the port."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._state.stopping.set()
        server.shutdown()
        thread.join()
        server.drop_connections()
        server.server_close()
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
    def id_prefix(self) -> str:
        """What this instance's ids carry after their kind ("" for none)."""
        return self._state.id_prefix

    @property
    def parents(self) -> tuple[str, ...]:
        return self._state.parent_ids

    def configure(self, **knobs: object) -> JsonObject:
        """Set knobs (ValueError on an unknown knob or bad value); return the whole config."""
        return self._state.configure(knobs)

    def reset(self) -> None:
        """Forget every workspace but the parents, the call counts and any outage;
        keep the config."""
        self._state.reset()

    def outage(self, seconds: float, mode: str = "503") -> JsonObject | None:
        """As ``POST /_fake/outage``: every gateway call answered 503 (mode "503"), or
        connections refused (mode "refuse"), for ``seconds``; 0 ends one now.
        ValueError on a bad duration or mode."""
        outage = self._state.start_outage(seconds, mode)
        if refuses(outage) and self._server is not None:
            self._server.refuse()
        return outage

    def state(self) -> JsonObject:
        """The same document as ``GET /_fake/state``."""
        return self._state.snapshot()

    def seed_workspace(
        self, title: str, parent: str | None, status: str = "created", projects: int = 0
    ) -> JsonObject:
        """Add a workspace with a fixed status; ``parent=None`` adds a top-level parent."""
        try:
            return self._state.seed_workspace(title, parent, status, projects)
        except NotFoundError as exc:
            raise KeyError(str(exc)) from None

    def seed_workspaces(
        self, title: str, parent: str, count: int, status: str = "created"
    ) -> JsonObject:
        """Add `count` alike children of `parent` at once: ``{"count", "first", "last"}``."""
        try:
            return self._state.seed_workspaces(title, parent, status, 0, count)
        except NotFoundError as exc:
            raise KeyError(str(exc)) from None

    def add_project(self, workspace_id: str) -> str:
        """Add a project to a workspace; return its id (KeyError if unknown)."""
        try:
            return self._state.add_project(workspace_id)
        except NotFoundError as exc:
            raise KeyError(str(exc)) from None

    def refuse_deletes(self, workspace_id: str, status: int = 409, message: str = "") -> JsonObject:
        """As ``POST /_fake/workspaces/{id}/refuse-deletes``: answer every project delete
        in the workspace ``status`` with ``message`` (a default naming it) and delete
        nothing; 0 deletes again. KeyError if unknown, ValueError on a bad status."""
        try:
            return self._state.refuse_deletes(workspace_id, status, message)
        except NotFoundError as exc:
            raise KeyError(str(exc)) from None

    def script(self, title: str, fate: str) -> dict[str, str]:
        """Fix the fate of creates titled ``title``: zombie, a terminal status
        (creation_failed, failed, error, invalid subscription),
        timeout_after_create, timeout_without_create, slow:N ('' clears it)."""
        return self._state.script(title, fate)
