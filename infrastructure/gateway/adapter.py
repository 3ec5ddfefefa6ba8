"""HTTP adapter for the workspace gateway (docs/gateway.md).

`HttpGateway` implements `domain.ports.Gateway` with explicit timeouts, a
bearer token and a bounded connection pool. It sends through one
`httpx.Client`: in production with httpx's own transport (keep-alive HTTP/1.1,
a proxy taken from the environment as httpx does), in tests with an injected
`httpx.MockTransport`, on the same code path. The product writes no request
and parses no answer itself. It maps every transport failure and HTTP answer
onto the port's exception tree:

=========================================  ======================  =========================
what happened                              create_child (POST)     status / family /
                                           never retried           list_projects / delete
=========================================  ======================  =========================
2xx                                        the ``id`` as str       the parsed answer
                                           ("" if missing/null)
2xx whose body is not the contract's       MalformedAnswer         MalformedAnswer
shape (not JSON, too deeply nested, wrong
type, an id not matching ``GATEWAY_ID``)
never sent: ConnectError, ConnectTimeout,  TransientGatewayError   retried, then
PoolTimeout, UnsupportedProtocol,                                  TransientGatewayError
ProxyError, LocalProtocolError, or held
back by the pace (not retried)
never sent: the certificate did not        CertificateRefused      CertificateRefused
verify (a TransientGatewayError)                                   (not retried)
sent, then timeout / dropped connection /  AmbiguousCreate         retried, then
RemoteProtocolError (any TransportError)                           TransientGatewayError
answer unreadable (DecodingError, larger   AmbiguousCreate         MalformedAnswer
than its cap, compressed)
429                                        TransientGatewayError   TransientGatewayError
                                           (nothing created;       (sent once more after
                                           ``waited`` after a      a short Retry-After
                                           short Retry-After while while the pace limits
                                           the pace limits calls)  the calls)
5xx                                        AmbiguousCreate         retried, then
                                           (``answered`` but for   TransientGatewayError
                                           502 / 504, as for an
                                           unreadable answer)
401 / 403                                  Unauthorized            Unauthorized
404                                        RequestRejected         WorkspaceGone (status,
                                                                   family, list_projects);
                                                                   success (delete_project)
409 / 422 / other 4xx                      RequestRejected         RequestRejected
1xx / 3xx (redirects are not followed)     MalformedAnswer         MalformedAnswer
=========================================  ======================  =========================

Retries (reads and deletes only, after no answer or a 5xx): up to ``retries``
extra attempts, sleeping ``retry_backoff_s * 2**n`` before retry ``n`` (0-based,
``domain.waits.doubled``; every wait and its words are domain/waits.py's).
A 4xx is never retried. A 429's ``Retry-After`` travels on the error
(``retry_after_s``), and the hop is deferred until then instead of holding its
thread, except as the pace allows below.

With a `Pace` (infrastructure/gateway/pacing.py), every request first asks it for its
turn: the fleet's rate, the shared Retry-After and the circuit. A request it
holds back is not sent (``TransientGatewayError`` with ``retry_after_s``), and
every answer is reported to it. While the pace limits the calls, a 429 whose
Retry-After fits the call's patience is waited in its thread (`Pace.told`), so
that the hop keeps its place in the queue: a read or a delete is then sent once
more here; a create is raised with ``waited`` set, and the hop records the
refusal and creates again at once, so that every create sent is on record
(domain/hop.py).

No message, repr or log line carries the token or request headers: the domain
errors are raised outside the ``except`` blocks (no ``__cause__``/``__context__``
pointing at an httpx exception, which holds the request), and what comes from
the wire is read by infrastructure/gateway/answers.py: bounded (`_ANSWER_MAX`,
1 MiB; a family listing, parsed as it arrives by infrastructure/gateway/family.py,
`FAMILY_ANSWER_MAX`, 64 MiB, whatever its number of entries), never compressed
(we ask for ``Accept-Encoding: identity``), ids checked against
``domain.ids.GATEWAY_ID`` and texts scrubbed of the token.

Path segments (ids) are percent-encoded; an id made only of dots is encoded
too (``%2E``) so it cannot become a ``..`` segment, and an empty id is refused
up front with `RequestRejected`.
"""

from __future__ import annotations

import json as jsonlib
import logging
import ssl
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import httpx

from domain.ports import (
    AmbiguousCreate,
    CertificateRefused,
    FamilyMember,
    MalformedAnswer,
    RequestRejected,
    TransientGatewayError,
    Unauthorized,
    WorkspaceGone,
)
from domain.waits import doubled
from infrastructure.gateway.answers import (
    Answer,
    AnswerReader,
    TooLarge,
    capped_chunks,
    retry_after,
)
from infrastructure.gateway.exchange import Failure, exchange, pace_result, seg
from infrastructure.gateway.family import (
    FAMILY_ANSWER_MAX,
    OVER,
    FamilyWatch,
    Listing,
    read_family,
)

if TYPE_CHECKING:
    from infrastructure.gateway.pacing import Pace

__all__ = ["HttpGateway"]

log = logging.getLogger(__name__)

_ANSWER_MAX = 1024 * 1024  # bytes; a status or a create answer is under 1 KiB


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
        observe: Callable[[str, int | None, float], None] | None = None,
        pace: Pace | None = None,
        ca_file: str | None = None,
        family_max_bytes: int = FAMILY_ANSWER_MAX,
        on_family_share: Callable[[float], None] | None = None,
        on_bytes: Callable[[str, int], None] | None = None,
    ) -> None:
        if not token:
            raise ValueError("the gateway token must not be empty")
        if not token.isprintable() or not token.isascii():
            raise ValueError("the gateway token must be printable ASCII (it goes in a header)")
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self._base_url = base_url
        self._answers = AnswerReader(token)
        self._retries = retries
        self._backoff_s = retry_backoff_s
        self._sleep: Callable[[float], None] = time.sleep  # swapped in tests
        # Told of every request: (operation, HTTP status or None without one, seconds).
        self._observe = observe
        # Told of the bytes of every answer's body read: (operation, bytes).
        self._on_bytes = on_bytes
        self._pace = pace
        self._family_max = family_max_bytes
        # Told of the largest share of `family_max_bytes` among the parents' last listings.
        self._family_watch = FamilyWatch(family_max_bytes, on_family_share)
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        # With a transport given (tests), httpx takes no proxy from the environment:
        # every request reaches that transport.
        self._client = httpx.Client(
            base_url=base_url,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "Accept-Encoding": "identity",  # see gateway_answers.read_capped
                "User-Agent": "provisioner",
            },
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
            limits=limits,
            transport=transport,
            follow_redirects=False,
            # The gateway's certificate chains to `ca_file` alone when given, else to
            # httpx's CAs; either way its name is checked.
            verify=ssl.create_default_context(cafile=ca_file) if ca_file else True,
        )
        self._closed = False

    def __repr__(self) -> str:
        return f"HttpGateway(base_url={self._base_url!r}, retries={self._retries})"

    def close(self) -> None:
        self._closed = True
        self._client.close()

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
        path = f"/v2/workspaces/{seg(parent_id)}/child"
        outcome = self._attempt(op, "POST", path, json={"title": title, "resources": {}})
        if isinstance(outcome, Failure):
            if outcome.certificate:
                raise CertificateRefused(
                    f"{op}: not sent ({outcome.summary})", reason=outcome.certificate
                )
            if outcome.kind in ("not_sent", "held"):
                raise TransientGatewayError(
                    f"{op}: not sent ({outcome.summary})",
                    retry_after_s=outcome.retry_after_s,
                    paced=outcome.paced,
                )
            raise AmbiguousCreate(
                f"{op}: outcome unknown ({outcome.summary})",
                answered=outcome.kind == "unreadable",
            )
        code = outcome.status_code
        if 200 <= code < 300:
            body = self._answers.json(outcome, op)
            if not isinstance(body, dict):
                raise MalformedAnswer(f"{op}: expected a JSON object")
            # Only the id is read: a malformed status beside it cannot lose what was made.
            return self._answers.field(body.get("id"), op, "id")
        if code in (401, 403):
            raise Unauthorized(f"{op}: credentials refused (HTTP {code})")
        if code == 429:  # waited here under a limit; made again by the hop, on record
            raise TransientGatewayError(
                f"{op}: throttled (HTTP 429), nothing created",
                retry_after_s=retry_after(outcome),
                waited=self._told(outcome, create=True),
            )
        if code >= 500:  # a proxy's 502 or 504: the gateway behind it may still hold it
            raise AmbiguousCreate(
                f"{op}: outcome unknown (HTTP {code})", answered=code not in (502, 504)
            )
        if 400 <= code < 500:
            raise RequestRejected(f"{op}: HTTP {code}: {self._answers.error_text(outcome)}")
        raise MalformedAnswer(f"{op}: unexpected HTTP {code}")

    def status(self, workspace_id: str) -> str:
        op = "status"
        body = self._read_json(op, f"/v1/workspaces/{seg(workspace_id)}/status")
        if not isinstance(body, dict):
            raise MalformedAnswer(f"{op}: expected a JSON object")
        return self._answers.field(body.get("status"), op, "status")

    def family(self, parent_id: str, title: str | None = None) -> list[FamilyMember]:
        return self.family_titled(parent_id, None if title is None else frozenset((title,)))

    def family_titled(self, parent_id: str, titles: frozenset[str] | None) -> list[FamilyMember]:
        """The family's members titled as one of `titles` (every member when None), from
        one read of the whole listing: what a shared read (infrastructure/gateway/family_reads.py)
        asks for its callers' titles."""
        op = "family"
        path = f"/v1/workspaces/{seg(parent_id)}/family"
        limit = self._family_max

        def read(got: httpx.Response) -> Listing:
            try:
                return read_family(capped_chunks(got, limit, OVER), titles)
            except TooLarge:
                self._family_watch.refused(parent_id)
                if self._on_bytes is not None:  # read up to the bound, then refused
                    self._on_bytes(op, limit)
                raise

        response = self._with_retries(op, "GET", path, limit=limit, read=read)
        if response.status_code == 404:
            raise WorkspaceGone(f"{op}: workspace not found (HTTP 404)")
        listing = response.parsed
        if not isinstance(listing, Listing):  # `read` made one of every 2xx answer
            raise MalformedAnswer(f"{op}: expected a bare JSON array")
        self._family_watch.seen(parent_id, listing)
        return self._answers.family(listing.wanted, op)

    def list_projects(self, workspace_id: str) -> list[str]:
        op = "list_projects"
        path = f"/v1/workspaces/{seg(workspace_id)}/projects"
        body = self._read_json(op, path, params={"type": "ai"})
        return self._answers.project_ids(body, op)

    def delete_project(self, workspace_id: str, project_id: str) -> None:
        path = f"/v1/workspaces/{seg(workspace_id)}/projects/{seg(project_id)}"
        self._with_retries("delete_project", "DELETE", path)  # 2xx or 404: both fine

    # -- plumbing ---------------------------------------------------------------

    def _read_json(
        self, op: str, path: str, params: dict[str, str] | None = None, limit: int = 0
    ) -> Any:
        response = self._with_retries(op, "GET", path, params, limit)
        if response.status_code == 404:
            raise WorkspaceGone(f"{op}: workspace not found (HTTP 404)")
        return self._answers.json(response, op)

    def _with_retries(
        self,
        op: str,
        method: str,
        path: str,
        params: dict[str, str] | None = None,
        limit: int = 0,
        *,
        read: Callable[[httpx.Response], Any] | None = None,
    ) -> Answer:
        """Send a read or delete; return a 2xx or 404 response, or raise."""
        attempts = self._retries + 1
        last = ""
        told = False  # one 429 a call is waited out here; the next is the hop's
        for n in range(attempts):
            outcome, told = self._told_again(
                told, op, method, path, params=params, limit=limit, read=read
            )
            delay = doubled(self._backoff_s, n)
            if isinstance(outcome, Failure):
                if outcome.certificate:  # retrying cannot change a certificate
                    raise CertificateRefused(
                        f"{op}: not sent ({outcome.summary})", reason=outcome.certificate
                    )
                if outcome.kind == "unreadable":
                    raise MalformedAnswer(f"{op}: {outcome.summary}")
                if outcome.kind == "held":
                    raise TransientGatewayError(
                        f"{op}: not sent ({outcome.summary})",
                        retry_after_s=outcome.retry_after_s,
                        paced=outcome.paced,
                    )
                last = outcome.summary
            else:
                code = outcome.status_code
                if 200 <= code < 300 or code == 404:
                    return outcome
                if code in (401, 403):
                    raise Unauthorized(f"{op}: credentials refused (HTTP {code})")
                if code == 429:
                    raise TransientGatewayError(
                        f"{op}: throttled (HTTP 429)", retry_after_s=retry_after(outcome)
                    )
                if code < 500:
                    if 400 <= code < 500:
                        raise RequestRejected(
                            f"{op}: HTTP {code}: {self._answers.error_text(outcome)}"
                        )
                    raise MalformedAnswer(f"{op}: unexpected HTTP {code}")
                last = f"HTTP {code}"
            if n + 1 < attempts:
                log.info("gateway %s: attempt %d/%d failed (%s)", op, n + 1, attempts, last)
                self._sleep(delay)
        raise TransientGatewayError(f"{op}: {last} after {attempts} attempt(s)")

    def _told_again(
        self, told: bool, op: str, method: str, path: str, **request: Any
    ) -> tuple[Answer | Failure, bool]:
        """One read or delete, sent once more after a 429 this thread waits out
        (`_told`), unless the call `told` one already: its outcome, and whether it has."""
        outcome = self._attempt(op, method, path, **request)
        if told or not self._told(outcome):
            return outcome, told
        log.info("gateway %s: throttled (HTTP 429); sent again after its Retry-After", op)
        return self._attempt(op, method, path, **request), True

    def _told(self, outcome: Answer | Failure, *, create: bool = False) -> bool:
        """A 429 whose Retry-After the pace has this thread wait out (`Pace.told`: a
        limit in force, within the call's patience): nothing was done, and the call may
        be made again at once, so that its hop keeps its place in the queue."""
        if self._pace is None or not isinstance(outcome, Answer) or outcome.status_code != 429:
            return False
        return self._pace.told(retry_after(outcome), create=create)

    def _attempt(
        self,
        op: str,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: dict[str, Any] | None = None,
        limit: int = 0,
        read: Callable[[httpx.Response], Any] | None = None,
    ) -> Answer | Failure:
        """One request, its answer read up to `limit` bytes (0: `_ANSWER_MAX`). A
        failure comes back as a value so that the domain error is raised outside
        this ``except`` and never chains the httpx exception (which holds the
        request and its headers)."""
        if self._closed:
            raise RuntimeError("the gateway client has been closed")
        content = None
        headers = None
        if json is not None:
            content = jsonlib.dumps(json, ensure_ascii=False, separators=(",", ":")).encode()
            headers = {"Content-Type": "application/json"}
        pace = self._pace
        if pace is not None and (held := pace.before(create=method == "POST")) is not None:
            return Failure("held", held.why, held.wait_s, held.paced)
        started = time.monotonic()
        outcome = exchange(
            self._client,
            method,
            path,
            params=params,
            content=content,
            headers=headers,
            limit=limit or _ANSWER_MAX,
            scrub=self._answers.scrub,
            read=read,
        )
        code = outcome.status_code if isinstance(outcome, Answer) else None
        if self._observe is not None:
            self._observe(op, code, time.monotonic() - started)
        if self._on_bytes is not None and isinstance(outcome, Answer):
            listing = outcome.parsed  # a family listing is parsed as it arrives, not kept
            size = listing.size if isinstance(listing, Listing) else 0
            self._on_bytes(op, len(outcome.content) + size)
        if self._pace is not None:
            self._pace.after(
                pace_result(outcome),
                retry_after_s=retry_after(outcome) if isinstance(outcome, Answer) else 0.0,
                error=outcome.summary if isinstance(outcome, Failure) else f"{op}: HTTP {code}",
            )
        return outcome
