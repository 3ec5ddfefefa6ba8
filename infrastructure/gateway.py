"""HTTP adapter for the workspace gateway (docs/gateway.md).

`HttpGateway` implements `domain.ports.Gateway` with explicit timeouts, a
bearer token and a bounded connection pool. It sends through an httpx
transport: by default `KeepAliveTransport`, keep-alive HTTP/1.1 on sockets
with answers parsed by `httptools` (llhttp; a sixth of the client CPU of
`http.client` per call, a sixteenth of `httpx.Client`'s; a hop makes three),
or httpx's own `HTTPTransport`
when the environment names a proxy; tests inject `httpx.MockTransport`. Either
way the failures are httpx's, and it maps every transport failure and HTTP
answer onto the port's exception tree:

=========================================  ======================  =========================
what happened                              create_child (POST)     status / family /
                                           never retried           list_projects / delete
=========================================  ======================  =========================
2xx                                        the ``id`` as str       the parsed answer
                                           ("" if missing/null)
2xx whose body is not the contract's       MalformedAnswer         MalformedAnswer
shape (not JSON, wrong type)
never sent: ConnectError, ConnectTimeout,  TransientGatewayError   retried, then
PoolTimeout, UnsupportedProtocol,                                  TransientGatewayError
ProxyError, LocalProtocolError
sent, then timeout / dropped connection /  AmbiguousCreate         retried, then
RemoteProtocolError (any TransportError)                           TransientGatewayError
answer unreadable (DecodingError, ...)     AmbiguousCreate         MalformedAnswer
429                                        TransientGatewayError   retried, then
                                           (nothing created)       TransientGatewayError
5xx                                        AmbiguousCreate         retried, then
                                                                   TransientGatewayError
401 / 403                                  Unauthorized            Unauthorized
404                                        RequestRejected         WorkspaceGone (status,
                                                                   family, list_projects);
                                                                   success (delete_project)
409 / 422 / other 4xx                      RequestRejected         RequestRejected
1xx / 3xx (redirects are not followed)     MalformedAnswer         MalformedAnswer
=========================================  ======================  =========================

Retries (reads and deletes only): up to ``retries`` extra attempts, sleeping
``retry_backoff_s * 2**n`` before retry ``n`` (0-based), or a numeric
``Retry-After`` if longer, capped at 1 s. A 4xx is never retried.

Rejection messages carry the gateway's error text, whitespace-collapsed and
truncated to 200 characters. No message, repr or log line carries the token or
request headers: the domain errors are raised outside the ``except`` blocks
(no ``__cause__``/``__context__`` pointing at an httpx exception, which holds
the request), and every text taken from the wire is scrubbed of the token:
error texts and statuses have it replaced, an id carrying it is refused as
`MalformedAnswer` (an id is stored and called back, so it cannot be altered).

Path segments (ids) are percent-encoded; an id made only of dots is encoded
too (``%2E``) so it cannot become a ``..`` segment, and an empty id is refused
up front with `RequestRejected`.
"""

from __future__ import annotations

import functools
import json as jsonlib
import logging
import math
import re
import select
import socket
import ssl
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import quote, urlencode

import httptools
import httpx

from domain.ports import (
    AmbiguousCreate,
    FamilyMember,
    MalformedAnswer,
    RequestRejected,
    TransientGatewayError,
    Unauthorized,
    WorkspaceGone,
)

__all__ = ["HttpGateway", "KeepAliveTransport"]

log = logging.getLogger(__name__)

_SUMMARY_MAX = 200
_RETRY_AFTER_CAP_S = 1.0

# Raised before the request left the client: nothing can have happened upstream.
_NOT_SENT: tuple[type[httpx.HTTPError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.ProxyError,
    httpx.LocalProtocolError,
)


@dataclass(frozen=True, slots=True)
class _Failure:
    """A request that produced no usable response, described without headers."""

    kind: Literal["not_sent", "transport", "unreadable"]
    summary: str


@dataclass(frozen=True, slots=True)
class _Answer:
    """An HTTP answer, body read and decoded (Content-Encoding undone)."""

    status_code: int
    content: bytes
    retry_after: str = ""
    text: str | None = None  # httpx's decoding of the body, when httpx read it

    def json(self) -> Any:
        return jsonlib.loads(self.content)

    def body_text(self) -> str:
        return self.text if self.text is not None else self.content.decode("utf-8", "replace")


class HttpGateway:
    """`domain.ports.Gateway` over HTTP. Thread-safe; close it (or use `with`)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        connect_timeout: float = 3.0,
        read_timeout: float = 10.0,
        retries: int = 2,
        retry_backoff_s: float = 0.1,
        transport: httpx.BaseTransport | None = None,
        max_connections: int = 64,
    ) -> None:
        if not token:
            raise ValueError("the gateway token must not be empty")
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self._base_url = base_url
        self._token = token
        self._retries = retries
        self._backoff_s = retry_backoff_s
        self._sleep: Callable[[float], None] = time.sleep  # swapped in tests
        # Requests go straight to the transport: httpx.Client's per-request work
        # (URL merging, cookies, auth and redirect plumbing) cost about 0.4 ms of
        # CPU per call, and a hop makes three. What it did that matters here is
        # done below: base URL, default headers, timeouts, no redirects.
        url = httpx.URL(base_url)
        self._prefix = str(url).rstrip("/")
        self._headers = [
            ("Authorization", f"Bearer {token}"),
            ("Accept", "application/json"),
            ("Accept-Encoding", "gzip, deflate"),
            ("User-Agent", "provisioner"),
        ]
        self._timeout = httpx.Timeout(read_timeout, connect=connect_timeout).as_dict()
        self._transport = transport or _default_transport(self._prefix, max_connections)
        # With the keep-alive transport not even an httpx.Request is built (its URL
        # parsing alone was a tenth of a worker's CPU): the origin and the path
        # prefix are taken apart once, here.
        self._origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        self._host_header = url.netloc.decode("ascii")
        self._path_prefix = url.raw_path.decode("ascii").split("?")[0].rstrip("/")
        self._closed = False

    def __repr__(self) -> str:
        return f"HttpGateway(base_url={self._base_url!r}, retries={self._retries})"

    def close(self) -> None:
        self._closed = True
        self._transport.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the port ---------------------------------------------------------------

    def create_child(self, parent_id: str, title: str) -> str:
        op = "create_child"
        path = f"/v2/workspaces/{_seg(parent_id)}/child"
        outcome = self._attempt("POST", path, json={"title": title, "resources": {}})
        if isinstance(outcome, _Failure):
            if outcome.kind == "not_sent":
                raise TransientGatewayError(f"{op}: not sent ({outcome.summary})")
            raise AmbiguousCreate(f"{op}: outcome unknown ({outcome.summary})")
        code = outcome.status_code
        if 200 <= code < 300:
            body = self._json(outcome, op)
            if not isinstance(body, dict):
                raise MalformedAnswer(f"{op}: expected a JSON object")
            return self._field(body.get("id"), op, "id")
        if code in (401, 403):
            raise Unauthorized(f"{op}: credentials refused (HTTP {code})")
        if code == 429:
            raise TransientGatewayError(f"{op}: throttled (HTTP 429), nothing created")
        if code >= 500:
            raise AmbiguousCreate(f"{op}: outcome unknown (HTTP {code})")
        if 400 <= code < 500:
            raise RequestRejected(f"{op}: HTTP {code}: {self._error_text(outcome)}")
        raise MalformedAnswer(f"{op}: unexpected HTTP {code}")

    def status(self, workspace_id: str) -> str:
        op = "status"
        body = self._read_json(op, f"/v1/workspaces/{_seg(workspace_id)}/status")
        if not isinstance(body, dict):
            raise MalformedAnswer(f"{op}: expected a JSON object")
        return self._field(body.get("status"), op, "status")

    def family(self, parent_id: str, title: str | None = None) -> list[FamilyMember]:
        op = "family"
        body = self._read_json(op, f"/v1/workspaces/{_seg(parent_id)}/family")
        if not isinstance(body, list):
            raise MalformedAnswer(f"{op}: expected a bare JSON array")
        members: list[FamilyMember] = []
        for entry in body:
            if not isinstance(entry, dict):
                raise MalformedAnswer(f"{op}: expected an array of objects")
            if title is not None and entry.get("title") != title:
                continue  # a listing of K children costs K comparisons, not K members
            member_id = self._field(entry.get("id"), op, "id")
            if not member_id:
                continue
            members.append(
                FamilyMember(
                    id=member_id,
                    title=self._field(entry.get("title"), op, "title"),
                    status=self._field(entry.get("status"), op, "status"),
                )
            )
        return members

    def list_projects(self, workspace_id: str) -> list[str]:
        op = "list_projects"
        path = f"/v1/workspaces/{_seg(workspace_id)}/projects"
        body = self._read_json(op, path, params={"type": "ai"})
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise MalformedAnswer(f"{op}: expected an object with an 'items' array")
        ids: list[str] = []
        for item in items:
            project_id = self._field(item.get("id"), op, "id") if isinstance(item, dict) else ""
            if not project_id:
                # Never under-report projects: release and adoption rely on the count.
                raise MalformedAnswer(f"{op}: an item without an id")
            ids.append(project_id)
        return ids

    def delete_project(self, workspace_id: str, project_id: str) -> None:
        path = f"/v1/workspaces/{_seg(workspace_id)}/projects/{_seg(project_id)}"
        self._with_retries("delete_project", "DELETE", path)  # 2xx or 404: both fine

    # -- plumbing ---------------------------------------------------------------

    def _read_json(self, op: str, path: str, params: dict[str, str] | None = None) -> Any:
        response = self._with_retries(op, "GET", path, params)
        if response.status_code == 404:
            raise WorkspaceGone(f"{op}: workspace not found (HTTP 404)")
        return self._json(response, op)

    def _with_retries(
        self, op: str, method: str, path: str, params: dict[str, str] | None = None
    ) -> _Answer:
        """Send a read or delete; return a 2xx or 404 response, or raise."""
        attempts = self._retries + 1
        last = ""
        for n in range(attempts):
            outcome = self._attempt(method, path, params=params)
            delay = self._backoff_s * 2**n
            if isinstance(outcome, _Failure):
                if outcome.kind == "unreadable":
                    raise MalformedAnswer(f"{op}: {outcome.summary}")
                last = outcome.summary
            else:
                code = outcome.status_code
                if 200 <= code < 300 or code == 404:
                    return outcome
                if code in (401, 403):
                    raise Unauthorized(f"{op}: credentials refused (HTTP {code})")
                if code != 429 and code < 500:
                    if 400 <= code < 500:
                        raise RequestRejected(f"{op}: HTTP {code}: {self._error_text(outcome)}")
                    raise MalformedAnswer(f"{op}: unexpected HTTP {code}")
                last = f"HTTP {code}"
                delay = max(delay, _retry_after(outcome))
            if n + 1 < attempts:
                log.info("gateway %s: attempt %d/%d failed (%s)", op, n + 1, attempts, last)
                self._sleep(delay)
        raise TransientGatewayError(f"{op}: {last} after {attempts} attempt(s)")

    def _attempt(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: dict[str, Any] | None = None,
    ) -> _Answer | _Failure:
        """One request. A failure comes back as a value so that the domain error
        is raised outside this ``except`` and never chains the httpx exception
        (which holds the request and its headers)."""
        if self._closed:
            raise RuntimeError("the gateway client has been closed")
        query = "?" + urlencode(params) if params else ""
        headers = self._headers
        content = None
        if json is not None:
            content = jsonlib.dumps(json, ensure_ascii=False, separators=(",", ":")).encode()
            headers = [*headers, ("Content-Type", "application/json")]
        try:
            transport = self._transport
            if isinstance(transport, KeepAliveTransport):
                target = self._path_prefix + path + query
                head = [("Host", self._host_header), *headers]
                if content is not None:
                    head.append(("Content-Length", str(len(content))))
                status, answer_headers, body = transport.exchange(
                    method, self._origin, target, head, body=content, timeouts=self._timeout
                )
                return _Answer(
                    status,
                    _decoded(body, answer_headers.get("content-encoding", "")),
                    answer_headers.get("retry-after", ""),
                )
            request = httpx.Request(
                method,
                self._prefix + path + query,
                headers=headers,
                content=content,
                extensions={"timeout": self._timeout},
            )
            response = transport.handle_request(request)
            response.request = request
            response.read()
            return _Answer(
                response.status_code,
                response.content,
                response.headers.get("Retry-After", ""),
                response.text,
            )
        except _NOT_SENT as exc:
            return _Failure("not_sent", self._describe(exc))
        except httpx.TransportError as exc:  # includes every other timeout
            return _Failure("transport", self._describe(exc))
        except httpx.HTTPError as exc:  # e.g. DecodingError: an answer we cannot read
            return _Failure("unreadable", self._describe(exc))

    def _describe(self, exc: httpx.HTTPError) -> str:
        detail = self._scrub(" ".join(str(exc).split()))[:_SUMMARY_MAX]
        return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__

    def _json(self, response: _Answer, op: str) -> Any:
        try:
            return response.json()
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            pass
        raise MalformedAnswer(f"{op}: the answer is not JSON (HTTP {response.status_code})")

    def _error_text(self, response: _Answer) -> str:
        """The gateway's own words about a rejection, safe to log and store."""
        text = response.body_text()
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict):
            for key in ("error", "message", "detail"):
                if isinstance(body.get(key), str):
                    text = body[key]
                    break
        summary = self._scrub(" ".join(text.split()))
        return summary[:_SUMMARY_MAX] or "(no detail)"

    def _scrub(self, text: str) -> str:
        return text.replace(self._token, "[redacted]")

    def _field(self, value: object, op: str, field: str) -> str:
        """A string field of an answer, safe to store and log.

        A status or title that carries the token is scrubbed of it (it is only
        read and recorded). An id that carries it is refused: an id is called
        back and bound, so it cannot be altered, and it must not be stored.
        """
        text = _text(value, op, field)
        if self._token not in text:
            return text
        if field == "id":
            raise MalformedAnswer(f"{op}: an id carries our credentials; answer refused")
        return self._scrub(text)


def _seg(value: str) -> str:
    """Percent-encode one path segment; ids are opaque strings."""
    if not value:
        raise RequestRejected("refused to call the gateway with an empty id")
    encoded = quote(value, safe="")
    return encoded.replace(".", "%2E") if set(value) == {"."} else encoded


def _text(value: object, op: str, field: str) -> str:
    """A string field of an answer: missing/null -> "", numbers as text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise MalformedAnswer(f"{op}: field {field!r} is not a string")


def _retry_after(response: _Answer) -> float:
    """A numeric Retry-After in seconds, capped; 0 when absent or a date."""
    try:
        seconds = float(response.retry_after)
    except ValueError:
        return 0.0
    if not math.isfinite(seconds) or seconds <= 0:
        return 0.0
    return min(seconds, _RETRY_AFTER_CAP_S)


def _default_transport(base_url: str, max_connections: int) -> httpx.BaseTransport:
    """The keep-alive transport, or httpx's own when the environment names a proxy
    for the gateway (the keep-alive transport speaks to the origin only)."""
    url = httpx.URL(base_url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(url.host):
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        return httpx.HTTPTransport(proxy=proxy, limits=limits)
    return KeepAliveTransport(max_connections=max_connections)


class KeepAliveTransport(httpx.BaseTransport):
    """HTTP/1.1 with keep-alive on plain sockets, answers parsed by `httptools`.

    An `httpx` transport, so `HttpGateway` maps its failures exactly as it maps
    httpx's own: it raises `httpx.ConnectError`/`ConnectTimeout` when nothing
    was sent, `WriteTimeout` while sending, `ReadTimeout`, `ReadError` or
    `RemoteProtocolError` after (a failed write reads on: a server may answer
    and close before reading the whole request), and `PoolTimeout` when all
    `max_connections` are busy for the pool timeout. Thread-safe.

    The request head is written here (a request line and the given headers,
    checked for control characters); the answer is parsed by llhttp, Node.js's
    HTTP parser, through `httptools`: status, headers, every body framing
    (Content-Length, chunked, to the end of the connection), interim 1xx
    answers. Measured per status call on loopback: 40 us of client CPU,
    against 230 us through `http.client` and 650 us through `httpx.Client`
    (see docs/architecture.md).

    An idle connection is reused only if the server has not closed it (the
    socket must not be readable), as httpcore does: a request on a connection
    the server already dropped would otherwise fail after sending, and a create
    would look ambiguous for no reason. It is reused only after an answer that
    allows it (HTTP/1.1 without `Connection: close`, nothing sent after it).
    """

    def __init__(
        self, *, max_connections: int = 64, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self._idle: dict[tuple[str, str, int], list[socket.socket]] = {}
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._ssl_context = ssl_context
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported scheme {url.scheme!r}", request=request)
        origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        try:
            status, answer_headers, content = self.exchange(
                request.method,
                origin,
                url.raw_path.decode("ascii"),
                headers,
                body=request.read() or None,
                timeouts=request.extensions.get("timeout", {}),
            )
        except httpx.TransportError as exc:
            exc.request = request
            raise
        return httpx.Response(
            status,
            headers=list(answer_headers.items()),
            content=content,
            extensions={"http_version": b"HTTP/1.1"},
        )

    def exchange(
        self,
        method: str,
        origin: tuple[str, str, int],
        target: str,
        headers: list[tuple[str, str]],
        *,
        body: bytes | None,
        timeouts: dict[str, float | None],
    ) -> tuple[int, dict[str, str], bytes]:
        """One request on a pooled connection: (status, lower-cased headers, raw body).

        `headers` must include Host (and Content-Length with a body); the body
        comes back as sent (Content-Encoding not undone). Raises httpx's
        transport errors.
        """
        if method in ("HEAD", "CONNECT"):
            raise httpx.UnsupportedProtocol(f"{method} is not supported by this transport")
        head = _request_head(method, target, headers)
        if not self._slots.acquire(timeout=timeouts.get("pool")):
            raise httpx.PoolTimeout("no connection available")
        try:
            return self._exchange(origin, head + (body or b""), timeouts)
        finally:
            self._slots.release()

    def _exchange(
        self, origin: tuple[str, str, int], request: bytes, timeouts: dict[str, float | None]
    ) -> tuple[int, dict[str, str], bytes]:
        sock = self._checkout(origin) or self._connect(origin, timeouts.get("connect"))
        cut_short = False
        try:
            sock.settimeout(timeouts.get("write"))
            sock.sendall(request)
        except TimeoutError:
            sock.close()
            raise httpx.WriteTimeout("timed out while sending") from None
        except OSError:
            # The server may have answered and closed before reading it all (a 413
            # or a 401, say): read that answer, as httpcore does; never reuse.
            cut_short = True
        answer = _Reading()
        try:
            sock.settimeout(timeouts.get("read"))
            while not answer.done:
                data = sock.recv(_RECV_SIZE)
                if not data:
                    answer.end_of_stream()
                    break
                answer.feed(data)
        except TimeoutError:
            sock.close()
            raise httpx.ReadTimeout("timed out") from None
        except (httptools.HttpParserError, _AnswerError) as exc:
            if not answer.done:
                sock.close()
                # A callback's own refusal says more than the parser's wrapper.
                cause = exc.__context__ if isinstance(exc.__context__, _AnswerError) else exc
                raise httpx.RemoteProtocolError(_what(cause)) from None
            answer.keep_alive = False  # bytes after the answer: never reuse
        except OSError as exc:
            sock.close()
            raise httpx.ReadError(_what(exc)) from None
        if answer.keep_alive and not cut_short:
            self._checkin(origin, sock)
        else:
            sock.close()
        return answer.status, answer.headers, b"".join(answer.body)

    def _connect(self, key: tuple[str, str, int], timeout: float | None) -> socket.socket:
        scheme, host, port = key
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except TimeoutError:
            raise httpx.ConnectTimeout("timed out while connecting") from None
        except OSError as exc:
            raise httpx.ConnectError(_what(exc)) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":
                context = self._ssl_context or httpx.create_ssl_context()
                sock = context.wrap_socket(sock, server_hostname=host)
        except TimeoutError:
            sock.close()
            raise httpx.ConnectTimeout("timed out during the TLS handshake") from None
        except OSError as exc:  # ssl.SSLError included
            sock.close()
            raise httpx.ConnectError(_what(exc)) from None
        return sock

    def _checkout(self, key: tuple[str, str, int]) -> socket.socket | None:
        while True:
            with self._lock:
                if self._closed:
                    raise RuntimeError("the transport has been closed")
                idle = self._idle.get(key)
                if not idle:
                    return None
                sock = idle.pop()
            if not _readable(sock):
                return sock
            sock.close()  # closed (or babbling) server side: never reuse it

    def _checkin(self, key: tuple[str, str, int], sock: socket.socket) -> None:
        with self._lock:
            if not self._closed:
                self._idle.setdefault(key, []).append(sock)
                return
        sock.close()


_RECV_SIZE = 65536
_ANSWER_MAX = 16 * 1024 * 1024  # no gateway answer we read is anywhere near this
_HEADERS_MAX = 64 * 1024  # as http.client and h11 (httpx) bound a header section
# Control characters (tab aside) in a request line or header: refused, never sent.
_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _request_head(method: str, target: str, headers: list[tuple[str, str]]) -> bytes:
    line = f"{method} {target} HTTP/1.1\r\n"
    if " " in target or not method.isalpha() or _UNSAFE.search(line, 0, len(line) - 2):
        raise httpx.LocalProtocolError("refused to send a malformed request line")
    try:
        return line.encode("ascii") + _header_block(tuple(headers))
    except UnicodeEncodeError:
        raise httpx.LocalProtocolError("the request target is not ASCII") from None


@functools.lru_cache(maxsize=256)
def _header_block(headers: tuple[tuple[str, str], ...]) -> bytes:
    """The header lines and the blank line, checked and encoded (the same few sets
    recur, so they are built once)."""
    for name, value in headers:
        if not name or ":" in name or " " in name or _UNSAFE.search(name + value):
            raise httpx.LocalProtocolError("refused to send a malformed header")
    block = "".join(f"{name}: {value}\r\n" for name, value in headers)
    try:
        return block.encode("latin-1") + b"\r\n"
    except UnicodeEncodeError:
        raise httpx.LocalProtocolError("a header is not latin-1 text") from None


class _AnswerError(Exception):
    """The answer broke the rules in a way the parser does not catch."""


class _Reading:
    """The answer being parsed (httptools' callbacks land here)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.received = 0
        self.header_bytes = 0
        self.headers_done = False
        self.done = False
        self.keep_alive = False

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        if self.received > _ANSWER_MAX:
            raise _AnswerError(f"answer larger than {_ANSWER_MAX} bytes")
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        if self.done:  # more after the final answer: the server is babbling
            raise _AnswerError("data after the answer")
        self.headers, self.body, self.headers_done, self.header_bytes = {}, [], False, 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > _HEADERS_MAX:
            raise _AnswerError(f"header section larger than {_HEADERS_MAX} bytes")
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        # A repeated field is one comma-separated list (RFC 9110 5.3), as in httpx.
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.parser.should_upgrade():
            raise _AnswerError("the server switched protocols")
        if self.headers.get("transfer-encoding", "chunked").strip().lower() != "chunked":
            # llhttp undoes chunked only: a body still gzip-coded would not be JSON.
            raise _AnswerError("a transfer coding other than chunked")
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:
            return  # an interim answer (100 Continue, 103 Early Hints): read on
        self.keep_alive = self.parser.should_keep_alive()
        self.done = True

    def end_of_stream(self) -> None:
        """The server closed the connection: complete only for a body read to the end."""
        framed = "content-length" in self.headers or "transfer-encoding" in self.headers
        if not self.headers_done or framed or 100 <= self.status < 200:
            raise _AnswerError("the server closed the connection before answering in full")
        self.done, self.keep_alive = True, False


def _readable(sock: socket.socket) -> bool:
    """True if an idle keep-alive socket has something to read: EOF or junk."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _decoded(body: bytes, encoding: str) -> bytes:
    """Undo a Content-Encoding we asked for (gzip, deflate); raise DecodingError."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity") or not body:  # e.g. a 204 that names gzip
        return body
    try:
        if encoding == "gzip":
            return zlib.decompress(body, 16 + zlib.MAX_WBITS)
        if encoding == "deflate":
            try:
                return zlib.decompress(body)
            except zlib.error:
                return zlib.decompress(body, -zlib.MAX_WBITS)
    except zlib.error as exc:
        raise httpx.DecodingError(f"{encoding}: {exc}") from None
    raise httpx.DecodingError(f"unsupported Content-Encoding {encoding!r}")


def _what(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
