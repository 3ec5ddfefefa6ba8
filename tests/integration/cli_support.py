"""What the tests of the `provisioner` command in a subprocess share: its
environment (`clean_env`), running it (`run_cli`), reading its one-line failure
(`one_line`), a PostgreSQL URL on the local server (`pg_url`), and a TCP
forwarder that can drop the database's connections (`forwarder`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from tests.conftest import PG_ADMIN

ROOT = Path(__file__).resolve().parents[2]
PROVISIONER = str(Path(sys.executable).parent / "provisioner")


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without PROVISIONER_*, plus the test's `settings`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
    # PostgreSQL alone, or SQLite with RabbitMQ: mixed on purpose.
    mixed = {"PROVISIONER_ALLOW_MIXED_EMBEDDED": "1"}
    return {**base, "PYTHONPATH": str(ROOT), **mixed, **settings}


def run_cli(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROVISIONER, *args], env=env, capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The failure's message: one line on stderr (after any start-up log lines,
    such as "connected to ..."), and no traceback."""
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert lines, result.stderr
    assert lines[-1].startswith("Error: "), result.stderr
    logged = [line for line in lines[:-1] if " INFO " in line or " WARNING " in line]
    assert len(logged) == len(lines) - 1, result.stderr
    return lines[-1]


def pg_url(dbname: str, *, user: str = "root", port: int = 5432, query: str = "") -> str:
    host = PG_ADMIN.split("@", 1)[1].split(":")[0].split("/")[0]
    return f"postgresql://{user}:pw@{host}:{port}/{dbname}{'?' + query if query else ''}"


@contextmanager
def forwarder(port: int, target: tuple[str, int]) -> Iterator[None]:
    """A TCP forwarder on 127.0.0.1:port to `target`: the database, as seen from `port`."""
    server = socket.create_server(("127.0.0.1", port))
    done = threading.Event()
    opened: list[socket.socket] = []

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for sock in (src, dst):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def accept() -> None:
        server.settimeout(0.2)
        while not done.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(target)
            opened.extend((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)
        server.close()
        for sock in list(opened):
            # shutdown first: close() alone does not wake a pump blocked in recv on
            # the socket, so no FIN would reach the client and its connection would
            # hang half-open instead of dropping as a stopped server's does.
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
