"""What the tests that run the worker, the relay or the CLI against a broker share:
their settings (`environment`, `cli_env`), waits (`wait_for`, `promoted`), the
broker's queues (`take`, `take_all`, `queue_depth`, `publish_raw`, `list_queues`), the
components on threads (`components`, `consuming`) or in a subprocess (`worker_process`, `cli`),
and the outages a test makes (`drop_connections`, `CrashOnSave`, `FixedPosition`).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, unquote, urlsplit
from uuid import UUID

from click.testing import CliRunner, Result
from eventsourcing.persistence import Tracking, TrackingRecorder
from kombu import Connection, Queue

from domain.errors import UnknownBrand
from domain.policies import AttemptState
from infrastructure.broker.outbox import load_position, save_position
from infrastructure.broker.topology import EXCHANGE
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.store.eventstore import is_postgres, open_position_store
from tests.conftest import unavailable
from tests.integration.cli_support import clean_env
from tests.support import rabbitmqctl
from worker.cli.main import main
from worker.consumer import HopWorker
from worker.relay import Relay
from worker.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]
BACKOFF_BASE_S = "0.05"
T = TypeVar("T")


def vhost_of(url: str) -> str:
    """The virtual host an AMQP URL names ('/' for amqp://host:port//)."""
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def list_queues(url: str) -> dict[str, tuple[int, int]] | None:
    """{queue: (ready, unacked)} in the URL's vhost, or None when rabbitmqctl cannot run."""
    try:
        out = rabbitmqctl(
            "list_queues", "-q", "-p", vhost_of(url), "name", "messages_ready",
            "messages_unacknowledged",
        )  # fmt: skip
    except (OSError, RuntimeError, subprocess.TimeoutExpired):
        return None
    queues: dict[str, tuple[int, int]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            queues[parts[0]] = (int(parts[1]), int(parts[2]))
    return queues


def close_all_connections(url: str, why: str = "test") -> None:
    """Make the broker drop every connection of the URL's vhost (never --global)."""
    rabbitmqctl("close_all_connections", "--vhost", vhost_of(url), why)


def wait_for(
    predicate: Callable[[], T], what: str, timeout: float = 8.0, interval: float = 0.02
) -> T:
    """Poll `predicate` until it answers something truthy; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def title_of(brand_id: str) -> str:
    return f"Messaging {brand_id}"


def environment(
    database_url: str, broker_url: str, fake: FakeGateway, **extra: str
) -> dict[str, str]:
    """The PROVISIONER_* settings of a test (for Settings.from_env or a subprocess)."""
    return {
        "PROVISIONER_DATABASE_URL": database_url,
        "PROVISIONER_BROKER_URL": broker_url,
        "PROVISIONER_GATEWAY_URL": fake.url,
        "PROVISIONER_PARENT_IDS": ",".join(fake.parents),
        "PROVISIONER_GATEWAY_TOKEN": "x",
        "PROVISIONER_GATEWAY_TIMEOUT_S": "5",
        "PROVISIONER_BACKOFF_BASE_S": BACKOFF_BASE_S,
        "PROVISIONER_CONCURRENCY": "4",
        "PROVISIONER_DECOMMISSION_DELAY_S": "0",  # emptied at once unless a test says
        **extra,
    }


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'events.sqlite'}"


def queue_depth(url: str, name: str) -> tuple[int, int]:
    """(ready messages, consumers) of a queue, from a passive declare."""
    with Connection(url, connect_timeout=3) as conn:
        _, ready, consumers = conn.channel().queue_declare(queue=name, passive=True)
        return int(ready), int(consumers)


def publish_raw(
    url: str,
    body: bytes,
    routing_key: str,
    content_type: str = "application/json",
    content_encoding: str = "utf-8",
    headers: dict[str, Any] | None = None,
    *,
    exchange: str = EXCHANGE,
    **properties: Any,
) -> None:
    """Publish a body as is (no validation) to the work exchange, or `exchange`, with
    confirms and `mandatory` (unroutable raises); `properties` as kombu takes them."""
    with Connection(url, connect_timeout=3, transport_options={"confirm_publish": True}) as conn:
        conn.Producer().publish(
            body,
            exchange=exchange,
            routing_key=routing_key,
            content_type=content_type,
            content_encoding=content_encoding,
            headers=headers,
            mandatory=True,
            retry=False,
            **properties,
        )


def take(url: str, queue_name: str, count: int, timeout: float = 5.0) -> list[Any]:
    """Remove `count` messages from a queue (basic.get), waiting up to `timeout` s."""
    taken: list[Any] = []
    with Connection(url, connect_timeout=3) as conn:
        queue = Queue(queue_name, no_declare=True).bind(conn.channel())
        deadline = time.monotonic() + timeout
        while len(taken) < count and time.monotonic() < deadline:
            message = queue.get(no_ack=True)
            if message is None:
                time.sleep(0.02)
            else:
                taken.append(message)
    return taken


def take_all(url: str, queue_name: str) -> list[Any]:
    """Remove every message a queue holds now (basic.get until it is empty)."""
    taken = []
    with Connection(url, connect_timeout=3) as conn:
        queue = Queue(queue_name, no_declare=True).bind(conn.channel())
        while (message := queue.get(no_ack=True)) is not None:
            taken.append(message)
    return taken


def raw(body: bytes | str) -> bytes:
    """py-amqp hands over a body with a content_encoding already decoded when it can."""
    return body.encode() if isinstance(body, str) else body


def state_of(runtime: Runtime, attempt_id: UUID) -> AttemptState:
    return runtime.service.attempt(attempt_id).state


def promoted(runtime: Runtime, attempt_id: UUID, timeout: float = 8.0) -> None:
    wait_for(
        lambda: state_of(runtime, attempt_id) is AttemptState.PROMOTED,
        f"attempt {attempt_id} to be promoted",
        timeout,
    )


def close_recorder(recorder: TrackingRecorder) -> None:
    datastore = getattr(recorder, "datastore", None)
    if datastore is not None and hasattr(datastore, "close"):
        datastore.close()


def relay_from_head(runtime: Runtime) -> int:
    """Move the relay's stored position to the log's head, so that it publishes only
    this test's events (PostgreSQL is shared by the session); return the head."""
    url = runtime.settings.database_url
    head = runtime.app.recorder.max_notification_id() or 0
    positions = open_position_store(url, create_table=not is_postgres(url))
    try:
        if head > load_position(positions):
            save_position(positions, head)
        return load_position(positions)
    finally:
        close_recorder(positions)


@dataclass
class Running:
    stop: threading.Event
    worker: HopWorker | None = None
    relay: Relay | None = None
    threads: list[threading.Thread] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def guarded(self, target: Callable[[threading.Event], None]) -> Callable[..., None]:
        """`target`, recording the exception that ends it (for the assertion message)."""

        def run(stop: threading.Event) -> None:
            try:
                target(stop)
            except Exception as exc:
                self.errors.append(exc)

        return run


@contextmanager
def components(
    runtime: Runtime, *, worker: bool = True, relay: bool = False, concurrency: int = 4
) -> Iterator[Running]:
    """Run a hop worker and/or a relay on threads, as `provisioner run` does; stop them
    (and check that they stopped) on exit."""
    running = Running(threading.Event())
    try:
        if worker:
            running.worker = runtime.worker(concurrency)
            running.threads.append(
                runtime.start(running.guarded(running.worker.run), "worker", running.stop)
            )
            assert running.worker.ready.wait(10), "the worker never started consuming"
        if relay:
            relay_from_head(runtime)
            running.relay = runtime.relay()
            running.threads.append(
                runtime.start(running.guarded(running.relay.run), "relay", running.stop)
            )
        yield running
    finally:
        running.stop.set()
        for thread in running.threads:
            thread.join(20)
        if running.relay is not None:
            running.relay.broker.close()
            close_recorder(running.relay.positions)
    assert not [t.name for t in running.threads if t.is_alive()], "a component did not stop"
    assert not running.errors, f"a component died: {died(running)}"


@contextmanager
def consuming(worker: HopWorker) -> Iterator[HopWorker]:
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), name="worker", daemon=True)
    thread.start()
    try:
        assert worker.ready.wait(10), "the worker never started consuming"
        yield worker
    finally:
        stop.set()
        thread.join(20)
    assert not thread.is_alive()


def alive(running: Running) -> bool:
    return all(t.is_alive() for t in running.threads)


def died(running: Running) -> str:
    return "; ".join(f"{type(e).__name__}: {e}".strip() for e in running.errors)


class _Crash(Exception):
    """Stands for the relay process dying."""


class CrashOnSave:
    """Tracking recorder whose position write 'crashes' the relay (after it published)."""

    def __init__(self, inner: TrackingRecorder) -> None:
        self.inner = inner

    def max_tracking_id(self, application_name: str) -> int | None:
        return self.inner.max_tracking_id(application_name)

    def insert_tracking(self, tracking: Tracking) -> None:
        raise _Crash(f"killed before recording position {tracking.notification_id}")


class FixedPosition:
    """Tracking recorder that always answers `position` and records nothing."""

    def __init__(self, position: int) -> None:
        self.position = position

    def max_tracking_id(self, application_name: str) -> int | None:
        return self.position

    def insert_tracking(self, tracking: Tracking) -> None:
        return None


def cli_env(database_url: str, broker_url: str, fake: FakeGateway) -> dict[str, str]:
    """The environment of a CLI subprocess: this one without PROVISIONER_*, plus the test's."""
    return clean_env(**environment(database_url, broker_url, fake))


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli.main", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def dead_letters_cli(url: str, *args: str) -> Result:
    """`provisioner dead-letters ARGS` in this process, on the broker at `url`."""
    return CliRunner().invoke(
        main, ["dead-letters", *args], env={"PROVISIONER_BROKER_URL": url}, catch_exceptions=False
    )


@contextmanager
def worker_process(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[str]]:
    """`provisioner worker` in a subprocess; killed on exit if still running."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli.main", "worker", "--concurrency", "2"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def drop_connections(url: str) -> None:
    """The broker closes every connection of the test's vhost (rabbitmqctl), or the
    test cannot run (skips locally, fails in CI)."""
    try:
        close_all_connections(url, "test")
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        unavailable("rabbitmqctl", exc)


# --- A vhost of its own, with the broker permission model applied
# (docs/operations.md, "Broker permissions"): the `vhost` fixture (conftest.py).

BROKER_HOST = "127.0.0.1:5672"  # the broker the local rabbitmqctl manages


@dataclass(frozen=True)
class Vhost:
    """The throwaway vhost, with the model applied and the topology declared."""

    name: str
    service_url: str
    producer_url: str


def apply_permissions(printed: str, passwords: dict[str, str]) -> None:
    """Run the printed rabbitmqctl lines as they are; add_user reads its password on stdin."""
    lines = [line for line in printed.splitlines() if line.strip() and not line.startswith("#")]
    assert lines, printed
    for line in lines:
        argv = shlex.split(line)
        assert argv[0] == "rabbitmqctl", line
        stdin = passwords[argv[2]] + "\n" if argv[1] == "add_user" else None
        rabbitmqctl(*argv[1:], stdin=stdin)


def remove_vhost(vhost: str, users: list[str]) -> list[str]:
    """Delete the vhost and the users, each tried whatever became of the others."""
    failures = []
    for argv in (["delete_vhost", vhost], *(["delete_user", user] for user in users)):
        try:
            rabbitmqctl(*argv)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            failures.append(str(exc))
    return failures


def user_url(user: str, password: str, vhost: str) -> str:
    """The AMQP URL of a user of `vhost` on the local broker."""
    return f"amqp://{user}:{password}@{BROKER_HOST}/{quote(vhost, safe='')}"


def bound_workspace(runtime: Runtime, brand_id: str) -> str | None:
    """The brand's bound workspace; None while it has none, or is not registered yet."""
    try:
        workspace_id: str | None = runtime.service.brand(brand_id).workspace_id
    except UnknownBrand:
        return None
    return workspace_id
