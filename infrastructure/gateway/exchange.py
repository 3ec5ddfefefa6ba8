"""One HTTP exchange with the gateway: what it came to (an `Answer`, or a
`Failure` described without headers), and what the fleet's pace learns from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import httpx

from domain.pacing import Result
from domain.ports import RequestRejected
from infrastructure.gateway.answers import SUMMARY_MAX, Answer, Unreadable, read_capped
from infrastructure.gateway.tls import gateway_refusal

# Raised before the request left the client: nothing can have happened upstream.
NOT_SENT: tuple[type[httpx.HTTPError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.ProxyError,
    httpx.LocalProtocolError,
)


@dataclass(frozen=True, slots=True)
class Failure:
    """A request that produced no usable response, described without headers."""

    kind: Literal["not_sent", "transport", "unreadable", "held"]
    summary: str
    retry_after_s: float = 0.0  # "held": when the pace lets it go
    paced: bool = False  # "held" for the fleet's turn (`domain.pacing.Hold.paced`)
    certificate: str = ""  # "not_sent": why the gateway's certificate did not verify


def exchange(
    client: httpx.Client,
    method: str,
    path: str,
    *,
    params: dict[str, str] | None,
    content: bytes | None,
    headers: dict[str, str] | None,
    limit: int,
    scrub: Callable[[str], str],
    read: Callable[[httpx.Response], Any] | None = None,
) -> Answer | Failure:
    """Send one request and read at most `limit` bytes of its answer; a 2xx answer's
    body is given to `read` instead, when given, as it arrives (its result: `parsed`)."""
    parsed = None
    try:
        with client.stream(method, path, params=params, content=content, headers=headers) as got:
            if read is not None and 200 <= got.status_code < 300:
                body, parsed = b"", read(got)
            else:
                body = read_capped(got, limit)
        return Answer(
            got.status_code,
            body,
            got.headers.get("Retry-After", ""),
            got.charset_encoding or "utf-8",
            got.headers.get("Date", ""),
            parsed,
        )
    except Unreadable as exc:
        return Failure("unreadable", str(exc))
    except NOT_SENT as exc:
        refusal = gateway_refusal(exc, client.base_url.host)
        why = scrub(str(refusal)) if refusal is not None else ""
        return Failure("not_sent", describe(exc, client.base_url.host, scrub), certificate=why)
    except httpx.TransportError as exc:  # includes every other timeout
        return Failure("transport", describe(exc, client.base_url.host, scrub))
    except httpx.HTTPError as exc:  # e.g. DecodingError: an answer we cannot read
        return Failure("unreadable", describe(exc, client.base_url.host, scrub))


def describe(exc: httpx.HTTPError, host: str, scrub: Callable[[str], str]) -> str:
    """One line: a certificate that did not verify says what to check."""
    refusal = gateway_refusal(exc, host)
    text = str(refusal) if refusal is not None else " ".join(str(exc).split())
    detail = scrub(text)[:SUMMARY_MAX]
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def seg(value: str) -> str:
    """Percent-encode one path segment; ids are opaque strings."""
    if not value:
        raise RequestRejected("refused to call the gateway with an empty id")
    encoded = quote(value, safe="")
    return encoded.replace(".", "%2E") if set(value) == {"."} else encoded


def pace_result(outcome: Answer | Failure) -> Result:
    """What the pace learns from a request: answered, throttled, or unreachable."""
    if isinstance(outcome, Failure):
        return Result.ANSWERED if outcome.kind == "unreadable" else Result.UNREACHABLE
    if outcome.status_code == 429:
        return Result.THROTTLED
    # The gateway (or what fronts it) is down; a 500 is one request broken, not an outage.
    return Result.UNREACHABLE if outcome.status_code in (502, 503, 504) else Result.ANSWERED
