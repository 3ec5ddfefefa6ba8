"""A crowd of `provision --wait` commands next to `provisioner run` on a small server.

Each one-shot command holds at most one database connection, and only while
it uses it; a "too many clients" refusal is retried with backoff. The test
runs a private PostgreSQL cluster (max_connections = 20) so that the shared
server is never touched, and 40 commands at once. Run by hand, the same
scenario at full size (docs/operations.md):

    .venv/bin/python -m tests.integration.test_cli_crowd --clients 200 --max-connections 100
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from infrastructure.fake_gateway.config import FakeConfig
from infrastructure.fake_gateway.server import FakeGateway
from tests.conftest import unavailable
from tests.services import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PG_BIN = Path(os.environ.get("PROVISIONER_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
PARENT = "org-parent"


def _as_postgres(*args: str) -> list[str]:
    """Run a server binary as the postgres user when we are root (initdb refuses root)."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *args]
    return list(args)


@contextmanager
def private_cluster(max_connections: int) -> Iterator[str]:
    """A throw-away PostgreSQL cluster on a free port; yields its URL (superuser `root`)."""
    if not (PG_BIN / "initdb").exists():
        raise FileNotFoundError(f"no PostgreSQL server binaries in {PG_BIN}")
    base = Path(tempfile.mkdtemp(prefix="provisioner-pg-"))
    data = base / "data"
    port = free_port()
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
    subprocess.run(
        _as_postgres(str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "root"),
        check=True, capture_output=True,
    )  # fmt: skip
    options = (
        f"-p {port} -k {base} -c listen_addresses=127.0.0.1 "
        f"-c max_connections={max_connections} -c fsync=off"
    )
    subprocess.run(
        _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", options, "-w", "start",
                     "-l", str(base / "log")),
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        yield f"postgresql://root@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"),
            check=False, capture_output=True,
        )  # fmt: skip
        shutil.rmtree(base, ignore_errors=True)


def crowd(
    database_url: str, broker_url: str, gateway_url: str, clients: int, log_dir: Path
) -> tuple[list[int], float]:
    """`provisioner run` plus `clients` concurrent `provision --wait`; their exit codes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
    env.update(
        PYTHONPATH=str(ROOT),
        PROVISIONER_DATABASE_URL=database_url,
        PROVISIONER_BROKER_URL=broker_url,
        PROVISIONER_GATEWAY_URL=gateway_url,
        PROVISIONER_GATEWAY_TOKEN="crowd-token",
        PROVISIONER_PARENT_IDS=PARENT,
        PROVISIONER_BACKOFF_BASE_S="0.2",
        PROVISIONER_CONCURRENCY="4",
    )
    provisioner = str(BIN / "provisioner")
    for init in (["db", "init"], ["broker", "init"]):
        subprocess.run([provisioner, *init], env=env, check=True, capture_output=True)
    with (log_dir / "run.log").open("w") as out:
        service = subprocess.Popen(
            [provisioner, "run"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        started = time.monotonic()
        tag = uuid.uuid4().hex[:6]
        procs = []
        for n in range(clients):
            out = (log_dir / f"client-{n}.log").open("w")
            procs.append(
                (
                    subprocess.Popen(
                        [
                            provisioner,
                            "provision",
                            f"crowd-{tag}-{n}",
                            "--title",
                            f"Crowd {tag} {n}",
                            "--parent",
                            PARENT,
                            "--wait",
                            "--timeout",
                            "300",
                        ],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    ),
                    out,
                )
            )
        codes = []
        for proc, out in procs:
            codes.append(proc.wait(600))
            out.close()
        elapsed = time.monotonic() - started
        assert service.poll() is None, (log_dir / "run.log").read_text()
        return codes, elapsed
    finally:
        service.terminate()
        service.wait(60)


@pytest.mark.postgres
@pytest.mark.rabbitmq
def test_forty_waiting_commands_and_the_service_share_twenty_connections(
    rabbit_url: str, tmp_path: Path
) -> None:
    if not (PG_BIN / "initdb").exists():
        unavailable("PostgreSQL's server binaries", FileNotFoundError(PG_BIN / "initdb"))
    with (
        FakeGateway(FakeConfig(seed=5), parents=(PARENT,)) as fake,
        private_cluster(max_connections=20) as url,
    ):
        codes, _ = crowd(url, rabbit_url, fake.url, 40, tmp_path)

    failed = [n for n, code in enumerate(codes) if code != 0]
    logs = [(tmp_path / f"client-{n}.log").read_text() for n in failed[:3]]
    assert failed == [], logs


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--max-connections", type=int, default=100)
    parser.add_argument("--broker-url", default="amqp://guest:guest@127.0.0.1:5672//")
    args = parser.parse_args()
    with (
        FakeGateway(FakeConfig(seed=5), parents=(PARENT,)) as fake,
        private_cluster(args.max_connections) as url,
        tempfile.TemporaryDirectory() as logs,
    ):
        codes, elapsed = crowd(url, args.broker_url, fake.url, args.clients, Path(logs))
    ok = sum(1 for code in codes if code == 0)
    print(
        f"{ok} of {args.clients} `provision --wait` succeeded in {elapsed:.1f} s next to "
        f"`provisioner run` (max_connections = {args.max_connections})"
    )


if __name__ == "__main__":
    _main()
