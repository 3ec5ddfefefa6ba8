"""Whether this process has ever had an answer from the gateway, and why not.

`GatewayContact` notes the time of the last HTTP answer of any status (a 404, a
429, a 503 are answers: something at PROVISIONER_GATEWAY_URL speaks HTTP) that
the process's client got; the heartbeats carry it to the database
(`gateway_answered_at`), so `provisioner health` can tell a gateway that never
answered any process (a wrong URL: a configuration error) from one that stopped
answering (an outage). `cause` words a request's failure for a person.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

Observe = Callable[[str, int | None, float], None]


class GatewayContact:
    """The last time this process had an HTTP answer from the gateway (epoch seconds;
    None: never since it started)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.answered_at: float | None = None
        self._lock = threading.Lock()
        self._changed = threading.Event()

    def note(self, status: int | None) -> None:
        """One request's outcome: an HTTP status (any), or None without an answer."""
        if status is None:
            return
        with self._lock:
            self.answered_at = self.clock()
        self._changed.set()

    def observing(self, then: Observe | None = None) -> Observe:
        """An `HttpGateway(observe=...)` that notes answers here, then calls `then`."""

        def observe(operation: str, status: int | None, seconds: float) -> None:
            self.note(status)
            if then is not None:
                then(operation, status, seconds)

        return observe

    def wait_answer(self, timeout_s: float) -> bool:
        """Wait until an answer was noted (True), at most `timeout_s`."""
        return self._changed.wait(timeout_s) or self.answered_at is not None


# What a request's failure text says, in a person's words (first match wins).
_CAUSES = (
    (
        (
            "wrong_version_number",
            "wrong version number",
            "record layer failure",
            "unknown protocol",
            "http_request",
        ),
        "the TLS handshake failed: is it a plain http:// server?",
    ),
    (("connection refused", "errno 111", "errno 61"), "connection refused"),
    (
        (
            "name or service not known",
            "nodename nor servname",
            "name resolution",
            "getaddrinfo",
            "no address associated",
        ),
        "the name does not resolve (DNS)",
    ),
    (("timed out", "timeout"), "timed out"),
    (("network is unreachable", "no route to host"), "no route to the host"),
    (
        ("connection reset", "server disconnected", "remoteprotocolerror"),
        "the connection was dropped without an answer",
    ),
)


def cause(text: str) -> str:
    """Why a request got no answer, from its failure's text (the text itself, cut,
    when no known cause matches)."""
    lowered = text.lower()
    for needles, said in _CAUSES:
        if any(n in lowered for n in needles):
            return said
    return " ".join(text.split())[:200] or "no answer"
