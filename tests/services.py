"""Private RabbitMQ nodes and PostgreSQL clusters, for tests that stop and restart them.

The shared servers are never stopped (other test runs use them): a test that
needs an outage starts its own node or cluster on free ports in a temporary
folder, and takes it away at the end.

- `RabbitNode`: `rabbitmq-server -detached` with its own node name, ports,
  data, log, config and (empty) plugins files, and its own Erlang cookie (HOME
  is the node's folder); `stop_app`/`start_app` make the outage.
- `PgCluster`: `initdb` and `pg_ctl` run as the `postgres` user on a folder
  under /tmp, listening on 127.0.0.1 and a socket in that folder; `restart`
  makes the outage (fast shutdown: every connection is dropped).

A machine without them (a laptop) skips these tests; CI fails them, as with the
shared services (tests/conftest.py `unavailable`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import unavailable

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
PG_BIN = Path(os.environ.get("PROVISIONER_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
# rabbitmqctl's own distribution ports (35672-35682) and the shared node's (25672).
_RESERVED = {25672, *range(35672, 35683)}


def free_port() -> int:
    """A TCP port nobody listens on now (and that RabbitMQ's tools do not use)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in _RESERVED and port + 1 not in _RESERVED:
            return port


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 60) -> str:
    done = subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed: {(done.stderr or done.stdout)[-500:]}")
    return done.stdout


class RabbitNode:
    """A RabbitMQ node of its own: guest/guest on 127.0.0.1:<port>, vhost '/'."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.name = f"prov-{uuid.uuid4().hex[:8]}@localhost"
        self.port = free_port()
        self.pid_file = base / "pid"
        for name in ("enabled_plugins", "rabbitmq.conf"):
            (base / name).write_text("")
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")},
            "HOME": str(base),  # its own Erlang cookie
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.pid_file),
        }

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def ctl(self, *args: str, timeout: float = 60) -> str:
        return _run([str(RABBIT_BIN / "rabbitmqctl"), "-n", self.name, *args], self.env, timeout)

    def start(self) -> None:
        _run([str(RABBIT_BIN / "rabbitmq-server"), "-detached"], self.env)
        self.ctl("wait", str(self.pid_file), timeout=90)  # the node, then its apps

    def stop_app(self) -> None:
        self.ctl("stop_app")

    def start_app(self) -> None:
        self.ctl("start_app")
        self.ctl("await_startup")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.ctl("stop", timeout=30)
        with contextlib.suppress(Exception):  # still there: end it by its pid
            os.kill(int(self.pid_file.read_text().strip()), 9)


class PgCluster:
    """A PostgreSQL cluster of its own: user postgres (trust) on 127.0.0.1:<port>."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.data = base / "data"
        self.port = free_port()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _pg(self, *args: str, timeout: float = 60) -> str:
        return _run(["runuser", "-u", "postgres", "--", *args], timeout=timeout)

    def init(self) -> None:
        shutil.chown(self.base, "postgres", "postgres")
        self._pg(str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "--no-sync")

    def _ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._pg(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", options, "-w", "-m", "fast",
            "-l", str(self.base / "log"), action, *extra,
        )  # fmt: skip

    def start(self) -> None:
        self._ctl("start")

    def restart(self) -> None:
        self._ctl("restart")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._ctl("stop")

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _private(what: str, prefix: str, make: Any, start: Any) -> Iterator[Any]:
    """A private server in a fresh folder: started, yielded, stopped and removed.
    One that cannot start is `unavailable` (a skip on a laptop, a failure in CI)."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    server = make(base)
    try:
        start(server)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
        unavailable(what, exc)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def rabbit_node() -> Iterator[RabbitNode]:
    """A private RabbitMQ node for the module's tests; stopped and removed at the end."""
    yield from _private("a private RabbitMQ node", "prov-rabbit-", RabbitNode, RabbitNode.start)


def _init_and_start(cluster: PgCluster) -> None:
    cluster.init()
    cluster.start()


@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[PgCluster]:
    """A private PostgreSQL cluster for the module's tests; stopped and removed at the end."""
    yield from _private("a private PostgreSQL cluster", "prov-pg-", PgCluster, _init_and_start)


def wait_until_listening(port: int, timeout: float = 30.0) -> None:
    """Until something accepts TCP connections on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
