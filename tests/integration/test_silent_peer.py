"""A PostgreSQL peer that goes silent is noticed: every connection the service
opens carries TCP keepalives and a TCP user timeout (docs/configuration.md,
"A database that goes silent"), and the URL's own options win.

Dropping packets on loopback needs privileges a test should not take, so the
test reads the options off each connection's socket: what the kernel enforces.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from infrastructure.store.eventstore import open_event_store
from infrastructure.views.store import SqlViewStore
from worker.relay import _PostgresListener

pytestmark = pytest.mark.postgres

# TCP_USER_TIMEOUT is Linux's option 18; the socket module names it only on 3.12+.
TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)


def _tcp_options(conn: Any) -> dict[str, int]:
    sock = socket.socket(fileno=conn.pgconn.socket)
    try:
        return {
            "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "user_timeout_ms": sock.getsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT),
        }
    finally:
        sock.detach()  # the connection owns the descriptor


@contextmanager
def _every_connection(url: str) -> Iterator[dict[str, dict[str, int]]]:
    """The options of a pooled, a one-shot, a read-model and a LISTEN connection."""
    seen: dict[str, dict[str, int]] = {}
    pooled = open_event_store(url, pool_size=1)
    one_shot = open_event_store(url, one_shot=True)
    try:
        for name, app in (("pooled", pooled), ("one-shot", one_shot)):
            datastore: Any = app.recorder.datastore  # type: ignore[attr-defined]
            with datastore.get_connection() as conn:
                seen[name] = _tcp_options(conn)
        with SqlViewStore(url) as views:
            seen["read models"] = _tcp_options(views.pg)
        listener = _PostgresListener(url, timeout_s=0.01)
        with listener:
            seen["listen"] = _tcp_options(listener.conn)
        yield seen
    finally:
        pooled.close()
        one_shot.close()


def test_every_connection_probes_a_silent_peer(pg_database: str) -> None:
    with _every_connection(pg_database) as seen:
        assert set(seen) == {"pooled", "one-shot", "read models", "listen"}
        for name, options in seen.items():
            assert options == {
                "keepalive": 1,
                "idle": 30,
                "interval": 10,
                "count": 3,
                "user_timeout_ms": 60000,
            }, name


def test_the_urls_own_options_win(pg_database: str) -> None:
    url = f"{pg_database}?keepalives_idle=7&keepalives_count=2&tcp_user_timeout=15000"
    with _every_connection(url) as seen:
        for name, options in seen.items():
            assert (options["idle"], options["count"], options["interval"]) == (7, 2, 10), name
            assert options["user_timeout_ms"] == 15000, name
    with _every_connection(f"{pg_database}?keepalives=0") as seen:
        assert {name: o["keepalive"] for name, o in seen.items()} == dict.fromkeys(seen, 0)
