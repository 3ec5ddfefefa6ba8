"""The run's own database, role, vhost and broker user, and the `provisioner`
processes (and the fake gateway) as subprocesses, their output captured to files
in the run directory.

Isolation: a PostgreSQL role with a password and a database it owns, a RabbitMQ
vhost with a user of its own (a password too), all named `rel_<hex>` and removed
at the end unless kept. Nothing outside them is touched.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg

from tests.support import rabbitmqctl

ROOT = Path(__file__).resolve().parents[2]
PROVISIONER = ROOT / ".venv" / "bin" / "provisioner"


def provisioner() -> list[str]:
    if PROVISIONER.exists():
        return [str(PROVISIONER)]
    return [sys.executable, "-m", "worker.cli.main"]


@dataclass
class Isolation:
    """Where the run lives: its database, vhost, and the credentials it uses."""

    admin_database_url: str  # a superuser's URL on the server (CREATE ROLE/DATABASE)
    admin_broker_url: str  # the broker's host and port (the vhost is ours)
    name: str = field(default_factory=lambda: f"rel_{secrets.token_hex(5)}")
    pg_password: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    amqp_password: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    token: str = field(default_factory=lambda: "tok-" + secrets.token_urlsafe(24), repr=False)
    created: list[str] = field(default_factory=list)

    @property
    def database_url(self) -> str:
        server = urlsplit(self.admin_database_url)
        host = f"{server.hostname}:{server.port or 5432}"
        return f"postgresql://{self.name}:{self.pg_password}@{host}/{self.name}"

    @property
    def broker_url(self) -> str:
        server = urlsplit(self.admin_broker_url)
        host = f"{server.hostname}:{server.port or 5672}"
        return f"amqp://{self.name}:{self.amqp_password}@{host}/{quote(self.name, safe='')}"

    def secrets(self) -> dict[str, str]:
        return {
            "gateway token": self.token,
            "database password": self.pg_password,
            "broker password": self.amqp_password,
        }

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.admin_database_url, autocommit=True, connect_timeout=5)

    def create(self) -> None:
        with self.admin() as conn:
            conn.execute(f"CREATE ROLE {self.name} LOGIN PASSWORD '{self.pg_password}'")
            self.created.append("role")
            conn.execute(f"CREATE DATABASE {self.name} OWNER {self.name}")
            self.created.append("database")
        rabbitmqctl("add_vhost", self.name)
        self.created.append("vhost")
        rabbitmqctl("add_user", self.name, self.amqp_password)
        self.created.append("user")
        rabbitmqctl("set_permissions", "-p", self.name, self.name, ".*", ".*", ".*")

    def drop(self) -> None:
        if "vhost" in self.created:
            with contextlib.suppress(Exception):
                rabbitmqctl("delete_vhost", self.name)
        if "user" in self.created:
            with contextlib.suppress(Exception):
                rabbitmqctl("delete_user", self.name)
        with contextlib.suppress(Exception), self.admin() as conn:
            if "database" in self.created:
                conn.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
            if "role" in self.created:
                conn.execute(f"DROP ROLE IF EXISTS {self.name}")
        self.created.clear()


class Fleet:
    """Long-running processes by name (`worker-1`, `relay`, ...), each run's output in
    `<run dir>/<name>.<n>.log` (n counts restarts); one-shot commands in `cli.log`."""

    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.run_dir = run_dir
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.args: dict[str, list[str]] = {}
        self.starts: dict[str, int] = {}
        self.exits: list[str] = []  # unexpected exits seen: "name: code"

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.args[name] = args
        n = self.starts.get(name, 0) + 1
        self.starts[name] = n
        with (self.run_dir / f"{name}.{n}.log").open("wb") as out:
            self.procs[name] = subprocess.Popen(
                args, cwd=ROOT, env=env or self.env, stdout=out, stderr=subprocess.STDOUT
            )

    def service(self, name: str, *args: str) -> None:
        self.start(name, [*provisioner(), *args])

    def kill_and_restart(self, name: str) -> None:
        """SIGKILL (no goodbye), then start it again at once."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        self.start(name, self.args[name])

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None and f"{name}: {code}" not in self.exits:
                self.exits.append(f"{name}: {code}")

    def stop(self, names: list[str] | None = None) -> None:
        """SIGTERM (a clean stop), then SIGKILL whatever is still there after 30 s."""
        chosen = [n for n in (names or list(self.procs)) if n in self.procs]
        for name in chosen:
            if self.procs[name].poll() is None:
                self.procs[name].terminate()
        for name in chosen:
            try:
                self.procs[name].wait(30)
            except subprocess.TimeoutExpired:
                self.procs[name].kill()
                self.procs[name].wait(10)
                self.exits.append(f"{name}: did not stop on SIGTERM")
            del self.procs[name]

    def one_shot(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*provisioner(), *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
        with (self.run_dir / "cli.log").open("a") as log:
            log.write(f"$ provisioner {' '.join(args)}  -> {done.returncode}\n")
            log.write(done.stdout + done.stderr)
        return done

    def logs(self) -> dict[str, str]:
        return {
            path.name: path.read_text(errors="replace")
            for path in sorted(self.run_dir.glob("*.log"))
        }


def environment(iso: Isolation, gateway_url: str, knobs: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
    return {
        **base,
        "PYTHONUNBUFFERED": "1",
        "PROVISIONER_DATABASE_URL": iso.database_url,
        "PROVISIONER_BROKER_URL": iso.broker_url,
        "PROVISIONER_GATEWAY_URL": gateway_url,
        "PROVISIONER_GATEWAY_TOKEN": iso.token,
        "PROVISIONER_LOG_FORMAT": "json",
        "PROVISIONER_DECOMMISSION_DELAY_S": "0",  # the checks expect deactivations emptied
        **knobs,
    }


def start_fake(fleet: Fleet, flags: list[str], timeout_s: float = 30.0) -> str:
    """`provisioner fake-gateway --port 0 ...`; its URL, from the line it prints first."""
    env = {k: v for k, v in fleet.env.items() if not k.startswith("PROVISIONER_")}
    fleet.start("fake-gateway", [*provisioner(), "fake-gateway", "--port", "0", *flags], env)
    log = fleet.run_dir / "fake-gateway.1.log"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("fake gateway listening on "):
                return line.rsplit(" ", 1)[1]
        if fleet.procs["fake-gateway"].poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"the fake gateway did not start: {log.read_text()[-2000:]}")
