"""The conventional peer's Celery tasks (bench/peer.py starts the workers):

    celery -A peer_tasks worker --pool threads --concurrency 16

`provision` creates the brand's sub-workspace (POST /v2/workspaces/{parent}/child)
and polls its status once; while it is not ready, `poll` is enqueued again with a
countdown (PEER_POLL_BASE_S doubled each time, at most PEER_POLL_CAP_S, for at
most PEER_MAX_POLLS polls), so that no thread sleeps. Ready, the workspace is bound
by compare-and-set on the brand's row (bench/peer_rows.py). Configured by the
environment: PEER_BROKER_URL, PEER_DATABASE_URL, PEER_GATEWAY_URL, PEER_POOL_SIZE.
Nothing of the project is imported: this is the design it is compared with.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import httpx
import peer_rows
from celery import Celery
from psycopg_pool import ConnectionPool

READY = frozenset({"created", "active", "ready"})
TERMINAL = frozenset({"creation_failed", "creation failed", "failed", "error"})

app = Celery("peer_tasks", broker=os.environ.get("PEER_BROKER_URL", "amqp://guest@127.0.0.1//"))
app.conf.update(
    task_ignore_result=True,
    task_default_queue="peer",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

POLL_BASE_S = float(os.environ.get("PEER_POLL_BASE_S", "1.0"))
POLL_CAP_S = float(os.environ.get("PEER_POLL_CAP_S", "30.0"))
MAX_POLLS = int(os.environ.get("PEER_MAX_POLLS", "10"))

_lock = threading.Lock()
_shared: dict[str, Any] = {}


def _pool() -> ConnectionPool:
    with _lock:
        if "pool" not in _shared:
            size = int(os.environ.get("PEER_POOL_SIZE", "8"))
            _shared["pool"] = ConnectionPool(
                os.environ["PEER_DATABASE_URL"],
                min_size=size,
                max_size=size,
                kwargs={"autocommit": True},
                open=True,
            )
        return _shared["pool"]  # type: ignore[no-any-return]


def _http() -> httpx.Client:
    with _lock:
        if "http" not in _shared:
            _shared["http"] = httpx.Client(
                base_url=os.environ["PEER_GATEWAY_URL"],
                headers={"Authorization": "Bearer peer-token"},
                timeout=10.0,
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
            )
        return _shared["http"]  # type: ignore[no-any-return]


def _status(workspace: str) -> str:
    answer = _http().get(f"/v1/workspaces/{workspace}/status")
    answer.raise_for_status()
    return str(answer.json().get("status", "")).strip().lower()


def _settle(brand: str, attempt: str, workspace: str, polls: int) -> None:
    """Act on the workspace's status: bind, fail, or poll again later."""
    status = _status(workspace)
    with _pool().connection() as conn:
        if status in READY:
            peer_rows.bind(conn, brand, attempt, workspace, time.time())
            return
        if status in TERMINAL:
            peer_rows.fail(conn, brand, attempt, f"terminal: {status}")
            return
        if polls >= MAX_POLLS:
            peer_rows.fail(conn, brand, attempt, f"not ready after {polls} polls")
            return
    poll.apply_async(
        (brand, attempt, workspace, polls + 1),
        countdown=peer_rows.poll_delay(polls + 1, POLL_BASE_S, POLL_CAP_S),
    )


@app.task(bind=True, max_retries=5)
def provision(self: Any, brand: str, title: str, parent: str, attempt: str) -> None:
    try:
        answer = _http().post(
            f"/v2/workspaces/{parent}/child", json={"title": title, "resources": {}}
        )
    except httpx.TimeoutException as exc:  # ambiguous: creating again could make two
        with _pool().connection() as conn:
            peer_rows.fail(conn, brand, attempt, f"create unconfirmed: {exc}")
        return
    if answer.status_code in (429, 503):  # answered, nothing made: try again later
        raise self.retry(countdown=float(answer.headers.get("Retry-After", "1")))
    if answer.status_code >= 400:
        with _pool().connection() as conn:
            peer_rows.fail(conn, brand, attempt, f"create answered {answer.status_code}")
        return
    _settle(brand, attempt, str(answer.json()["id"]), 0)


@app.task(
    autoretry_for=(httpx.HTTPError,),
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=8,
)
def poll(brand: str, attempt: str, workspace: str, polls: int) -> None:
    _settle(brand, attempt, workspace, polls)
