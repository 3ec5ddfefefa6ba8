"""Ports: what the domain needs from the outside world, as Protocols.

The gateway port speaks in plain values and a small exception tree. Adapters
(`infrastructure.gateway.adapter.HttpGateway`, the in-memory fakes of the tests) map
their transport's failures onto it; the hop logic never sees HTTP.

Exception tree::

    GatewayError                 anything the gateway did that was not an answer
    ├── AmbiguousCreate          a create that may or may not have happened
    │                            (timeout, dropped connection, 5xx on the POST)
    ├── TransientGatewayError    no answer: timeout, 429, 5xx, refused, or held by the pace
    │   └── CertificateRefused   the gateway's TLS certificate did not verify: a hop
    │                            defers, but the deployment is broken (health refuses)
    ├── WorkspaceGone            404 for a workspace (list projects, status)
    ├── RequestRejected          409/422 (quota, conflict) or another 4xx: terminal
    ├── Unauthorized             401/403: credentials; terminal for the attempt, alert
    └── MalformedAnswer          an answer that does not parse as the contract says

Messages never carry the bearer token or request headers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol


class GatewayError(Exception):
    """Base of every failure the gateway adapter raises."""


class AmbiguousCreate(GatewayError):
    """The create call may or may not have created the child. `answered`: the gateway
    answered it (a 5xx but 502/504, an unreadable answer), so it holds the request no
    longer; otherwise (a timeout, a dropped connection, a proxy's 502 or 504) it may."""

    def __init__(self, message: str = "", *, answered: bool = False) -> None:
        super().__init__(message)
        self.answered = answered


class TransientGatewayError(GatewayError):
    """No answer now (throttled, down, unreachable, or held back by the fleet's pace):
    may succeed later. `retry_after_s`: when the gateway, or the fleet's shared
    pace, says to try again (0 when nothing says). `waited`: a 429 whose Retry-After
    the calling thread has waited out already (the fleet's pace has it so while it
    limits the calls): the call may be made again at once."""

    def __init__(
        self,
        message: str = "",
        *,
        retry_after_s: float = 0.0,
        paced: bool = False,
        waited: bool = False,
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.paced = paced  # held for the fleet's own turn: `retry_after_s` is when it comes
        self.waited = waited


class CertificateRefused(TransientGatewayError):
    """The gateway's TLS certificate did not verify (nothing was sent). A hop defers as
    for any call without an answer, but only a change of setting or certificate fixes
    it: health and start-up read it as a refusal, not an outage. `reason`: one line
    saying what did not verify and which setting to check."""

    def __init__(self, message: str = "", *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


class WorkspaceGone(GatewayError):
    """The workspace does not exist (404)."""


class RequestRejected(GatewayError):
    """The gateway refused the request for good (409, 422, other 4xx)."""


class Unauthorized(GatewayError):
    """The credentials were refused (401, 403)."""


class MalformedAnswer(GatewayError):
    """The answer did not have the shape the contract promises."""


# The same failures, as values: what the hop's decisions take.


class FaultKind(StrEnum):
    """Every kind of gateway fault (the port's exceptions), as a value."""

    AMBIGUOUS = "ambiguous"  # a create that may or may not have happened
    TRANSIENT = "transient"  # no answer: timeout, 429, 5xx, never sent, held by the pace
    GONE = "gone"  # 404 for a workspace
    REJECTED = "rejected"  # refused for good (409, 422, other 4xx)
    UNAUTHORIZED = "unauthorized"  # 401, 403
    MALFORMED = "malformed"  # an answer not shaped as the contract says


_KINDS: tuple[tuple[type[GatewayError], FaultKind], ...] = (
    (AmbiguousCreate, FaultKind.AMBIGUOUS),
    (TransientGatewayError, FaultKind.TRANSIENT),
    (WorkspaceGone, FaultKind.GONE),
    (RequestRejected, FaultKind.REJECTED),
    (Unauthorized, FaultKind.UNAUTHORIZED),
    (MalformedAnswer, FaultKind.MALFORMED),
)


@dataclass(frozen=True, slots=True)
class GatewayFault:
    """What the gateway answered instead of an answer."""

    kind: FaultKind
    message: str
    retry_after_s: float = 0.0  # a transient failure: when the gateway or the pace allows
    answered: bool = False  # an ambiguous create the gateway answered (`AmbiguousCreate`)
    paced: bool = False  # not sent: held for the fleet's own turn, due in `retry_after_s`
    waited: bool = False  # a 429 whose Retry-After was waited out: the call may go again


def fault_of(exc: GatewayError) -> GatewayFault:
    """The port's exception as a value (an unknown subclass counts as transient)."""
    retry_after_s = getattr(exc, "retry_after_s", 0.0)
    answered, paced = getattr(exc, "answered", False), getattr(exc, "paced", False)
    waited = getattr(exc, "waited", False)
    for cls, kind in _KINDS:
        if isinstance(exc, cls):
            return GatewayFault(kind, str(exc), retry_after_s, answered, paced, waited)
    return GatewayFault(FaultKind.TRANSIENT, str(exc), retry_after_s)


@dataclass(frozen=True, slots=True)
class FamilyMember:
    """One entry of a parent's family listing (the parent itself included)."""

    id: str
    title: str
    status: str


class Gateway(Protocol):
    """The calls the provisioner makes upstream (docs/gateway.md)."""

    def create_child(self, parent_id: str, title: str) -> str:
        """Create a child workspace; return the id the gateway answered with.

        The id is returned as given (possibly empty or equal to the parent's);
        judging it is the domain's job. Never retried by the adapter.
        """
        ...

    def status(self, workspace_id: str) -> str:
        """Return the raw status string of a workspace."""
        ...

    def family(self, parent_id: str, title: str | None = None) -> list[FamilyMember]:
        """Return the parent's family: the parent itself and its children.

        With `title`, only the members titled exactly so (the parent too, if it
        is). Every use in the hop protocol wants only those; the listing is
        still read whole, but the other entries are not decoded into members.
        """
        ...

    def list_projects(self, workspace_id: str) -> list[str]:
        """Return the ids of the workspace's projects (type=ai)."""
        ...

    def delete_project(self, workspace_id: str, project_id: str) -> None:
        """Delete one project; a project already gone (404) counts as deleted."""
        ...


class Clock(Protocol):
    """Wall-clock time, timezone-aware UTC. Swapped for a manual clock in tests."""

    def now(self) -> datetime: ...
