"""TLS against real servers: a throwaway CA (made with the `openssl` binary) signs one
certificate for `evil.example` and one for 127.0.0.1/localhost, and a TLS server on
127.0.0.1 presents one of them. The wrong name is refused in one line before a byte
of AMQP or HTTP (the token) is sent; the right one passes the TLS layer.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from domain.ports import TransientGatewayError, WorkspaceGone
from infrastructure.failures import EXIT_REFUSED, EXIT_UNAVAILABLE
from infrastructure.gateway.adapter import HttpGateway
from tests.conftest import TOKEN, unavailable
from tests.integration.cli_support import clean_env, one_line, run_cli

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
NOT_FOUND = (
    b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
)


@dataclass(frozen=True)
class Pki:
    ca: Path
    evil: tuple[Path, Path]  # certificate and key for evil.example
    local: tuple[Path, Path]  # for 127.0.0.1 and localhost


def _openssl(folder: Path, *args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        unavailable("openssl", FileNotFoundError("no openssl binary on PATH"))
    subprocess.run([str(openssl), *args], cwd=folder, check=True, capture_output=True)


def _leaf(folder: Path, name: str, alt_names: str) -> tuple[Path, Path]:
    """A server certificate signed by the test CA (ca.pem, ca.key in `folder`)."""
    ext = folder / f"{name}.ext"
    ext.write_text(
        f"subjectAltName={alt_names}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(folder, "req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={name}")  # fmt: skip
    _openssl(folder, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-set_serial", str(abs(hash(name)) % 10**9), "-days", "2",
             "-extfile", ext.name, "-out", f"{name}.pem")  # fmt: skip
    return folder / f"{name}.pem", folder / f"{name}.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    _openssl(folder, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=provisioner test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    return Pki(
        ca=folder / "ca.pem",
        evil=_leaf(folder, "evil.example", "DNS:evil.example"),
        local=_leaf(folder, "local", "IP:127.0.0.1,DNS:localhost"),
    )


@dataclass
class TlsPeer:
    """A TLS server on 127.0.0.1 presenting one certificate. After a handshake it reads
    (an AMQP header, or an HTTP request head which it answers with `answer`) and keeps
    every byte of application data it got, and every handshake that failed."""

    certificate: tuple[Path, Path]
    answer: bytes | None = None
    received: bytearray = field(default_factory=bytearray)
    failed_handshakes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(*self.certificate)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                self._one(conn)

    def _one(self, conn: socket.socket) -> None:
        try:
            tls = self.context.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            self.failed_handshakes.append(str(exc))
            return
        with tls:
            try:
                while not self._request_read():
                    chunk = tls.recv(4096)
                    if not chunk:
                        return
                    self.received += chunk
                if self.answer is not None:
                    tls.sendall(self.answer)
            except (ssl.SSLError, OSError):
                return

    def _request_read(self) -> bool:
        if self.answer is None:
            return len(self.received) >= len(AMQP_HEADER)
        return b"\r\n\r\n" in self.received

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


Serve = Callable[..., TlsPeer]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start a TlsPeer (certificate, answer); every one is closed after the test."""
    started: list[TlsPeer] = []

    def start(certificate: tuple[Path, Path], answer: bytes | None = None) -> TlsPeer:
        started.append(TlsPeer(certificate, answer))
        return started[-1]

    yield start
    for server in started:
        server.close()


def _broker_init(server: TlsPeer, **settings: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(PROVISIONER_BROKER_URL=f"amqps://guest:guest@127.0.0.1:{server.port}//",
                    **settings)  # fmt: skip
    return run_cli(env, "broker", "init")


# -- AMQP -------------------------------------------------------------------------------


def test_broker_init_refuses_a_certificate_for_another_name(pki: Pki, serve: Serve) -> None:
    server = serve(pki.evil)
    result = _broker_init(server, PROVISIONER_BROKER_CA_FILE=str(pki.ca))
    assert result.returncode == EXIT_REFUSED, result.stderr
    assert one_line(result) == (
        f"Error: TLS: RabbitMQ at amqps://guest:***@127.0.0.1:{server.port}// presented a "
        "certificate that is not valid for 127.0.0.1 (hostname mismatch): check "
        "PROVISIONER_BROKER_URL's host, or PROVISIONER_BROKER_CA_FILE"
    )
    assert server.failed_handshakes
    assert bytes(server.received) == b""  # no AMQP header, no credentials


def test_broker_init_refuses_a_certificate_from_an_unknown_ca(pki: Pki, serve: Serve) -> None:
    """Without PROVISIONER_BROKER_CA_FILE the system's CAs decide: the test CA is not one."""
    server = serve(pki.local)
    result = _broker_init(server)
    assert result.returncode == EXIT_REFUSED, result.stderr
    line = one_line(result)
    assert "TLS: " in line
    assert "does not verify" in line
    assert "set PROVISIONER_BROKER_CA_FILE to the CA that signed it" in line
    assert bytes(server.received) == b""


def test_a_certificate_for_the_urls_host_passes_the_tls_layer(pki: Pki, serve: Serve) -> None:
    """The server speaks no AMQP after the header: the command fails past TLS."""
    server = serve(pki.local)
    result = _broker_init(server, PROVISIONER_BROKER_CA_FILE=str(pki.ca))
    assert result.returncode == EXIT_UNAVAILABLE, result.stderr
    assert "TLS: " not in one_line(result)
    assert bytes(server.received).startswith(AMQP_HEADER)


# -- HTTP (the gateway) -----------------------------------------------------------------


def _gateway(server: TlsPeer, ca: Path) -> HttpGateway:
    return HttpGateway(f"https://127.0.0.1:{server.port}", TOKEN, ca_file=str(ca), retries=0)


def test_the_gateway_refuses_a_certificate_for_another_name(pki: Pki, serve: Serve) -> None:
    server = serve(pki.evil, NOT_FOUND)
    with _gateway(server, pki.ca) as gateway, pytest.raises(TransientGatewayError) as raised:
        gateway.status("ws-1")
    message = str(raised.value)
    assert "\n" not in message
    assert "the gateway presented a certificate that is not valid for 127.0.0.1" in message
    assert "PROVISIONER_GATEWAY_CA_FILE" in message  # what to check, in the same line
    assert bytes(server.received) == b""  # the token never left


def test_the_gateway_accepts_a_certificate_for_its_host(pki: Pki, serve: Serve) -> None:
    server = serve(pki.local, NOT_FOUND)
    with _gateway(server, pki.ca) as gateway, pytest.raises(WorkspaceGone):
        gateway.status("ws-1")
    assert bytes(server.received).startswith(b"GET ")


def test_the_gateway_ca_setting_reaches_the_workers_client(
    pki: Pki, serve: Serve, tmp_path: Path
) -> None:
    """PROVISIONER_GATEWAY_CA_FILE through Settings and the composition root."""
    from infrastructure.settings.model import Settings
    from worker.runtime import build

    server = serve(pki.local, NOT_FOUND)
    settings = Settings.from_env(
        {
            "PROVISIONER_DATABASE_URL": f"sqlite:///{tmp_path}/events.sqlite",
            "PROVISIONER_GATEWAY_URL": f"https://127.0.0.1:{server.port}",
            "PROVISIONER_GATEWAY_TOKEN": TOKEN,
            "PROVISIONER_GATEWAY_CA_FILE": str(pki.ca),
            "PROVISIONER_PARENT_IDS": "org-parent",
        }
    )
    with build(settings, parts=("worker",)) as runtime, pytest.raises(WorkspaceGone):
        runtime.gateway.status("ws-1")
    assert bytes(server.received).startswith(b"GET ")


# -- a gateway whose certificate does not verify: a refusal, not an outage ---------------


def _gateway_env(server: TlsPeer, folder: Path, **settings: str) -> dict[str, str]:
    return clean_env(
        PROVISIONER_DATABASE_URL=f"sqlite:///{folder / 'events.sqlite'}",
        PROVISIONER_GATEWAY_URL=f"https://127.0.0.1:{server.port}",
        PROVISIONER_GATEWAY_TOKEN=TOKEN, PROVISIONER_PARENT_IDS="org-parent", **settings,
    )  # fmt: skip


def _gateway_line(result: subprocess.CompletedProcess[str]) -> str:
    return next(line for line in result.stdout.splitlines() if " gateway: " in line)


def test_health_refuses_a_gateway_certificate_for_another_name(
    pki: Pki, serve: Serve, tmp_path: Path
) -> None:
    """Before: DEGRADED and exit 0, as if the gateway were down for a while."""
    server = serve(pki.evil, NOT_FOUND)
    result = run_cli(_gateway_env(server, tmp_path, PROVISIONER_GATEWAY_CA_FILE=str(pki.ca)),
                     "health")  # fmt: skip
    assert result.returncode == EXIT_REFUSED, result.stdout + result.stderr
    reason = (
        "TLS: the gateway presented a certificate that is not valid for 127.0.0.1 (hostname "
        "mismatch): check PROVISIONER_GATEWAY_URL's host, or PROVISIONER_GATEWAY_CA_FILE"
    )
    assert one_line(result) == f"Error: {reason}"
    assert _gateway_line(result).startswith(f"FAILING  gateway: {reason}")
    assert "DEGRADED gateway:" not in result.stdout
    assert bytes(server.received) == b""  # the token never left


def test_health_refuses_a_gateway_certificate_from_an_unknown_ca(
    pki: Pki, serve: Serve, tmp_path: Path
) -> None:
    server = serve(pki.local, NOT_FOUND)
    result = run_cli(_gateway_env(server, tmp_path), "health")
    assert result.returncode == EXIT_REFUSED, result.stdout + result.stderr
    line = one_line(result)
    assert line.startswith("Error: TLS: the gateway presented a certificate that does not verify")
    assert "set PROVISIONER_GATEWAY_CA_FILE to the CA that signed it" in line
    assert bytes(server.received) == b""


def test_a_process_that_calls_the_gateway_refuses_to_start_with_its_certificate(
    pki: Pki, serve: Serve, tmp_path: Path
) -> None:
    """`run` (worker, relay, projections, reconciler) stops before it opens anything."""
    server = serve(pki.evil, NOT_FOUND)
    env = _gateway_env(server, tmp_path, PROVISIONER_GATEWAY_CA_FILE=str(pki.ca))
    result = run_cli(env, "run")
    assert result.returncode == EXIT_REFUSED, result.stdout + result.stderr
    assert "not valid for 127.0.0.1 (hostname mismatch)" in one_line(result)
    assert bytes(server.received) == b""
    assert not (tmp_path / "events.sqlite").exists()  # nothing opened before the refusal


def test_health_passes_a_gateway_certificate_that_verifies(
    pki: Pki, serve: Serve, tmp_path: Path
) -> None:
    server = serve(pki.local, NOT_FOUND)
    result = run_cli(_gateway_env(server, tmp_path, PROVISIONER_GATEWAY_CA_FILE=str(pki.ca)),
                     "health")  # fmt: skip
    assert result.returncode != EXIT_REFUSED, result.stdout + result.stderr
    assert _gateway_line(result) == "ok       gateway: reachable, token accepted"
    assert bytes(server.received).startswith(b"GET /v1/workspaces/provisioner-health-probe/")
