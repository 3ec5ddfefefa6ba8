"""Broker connections: every kombu Connection of the project is made by
`connection`; an `amqps://` one checks the broker's certificate chain and its
name (`BrokerTls`)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from kombu.connection import Connection

from infrastructure.failures import ConfigurationError


def is_memory(url: str) -> bool:
    return url.startswith("memory://")


@dataclass(frozen=True, slots=True)
class BrokerTls:
    """What an `amqps://` connection trusts and shows: the CA file the broker's
    certificate must chain to (None: the system's CAs), and a client certificate
    with its key (both or neither)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs its key, and a key its certificate")

    def ssl_options(self, host: str) -> dict[str, Any]:
        """kombu's `ssl` argument as py-amqp reads it (`SSLTransport._wrap_socket_sni`):
        it checks the certificate's name only when given `server_hostname`, and loads
        the system's CAs when given no `ca_certs`."""
        options: dict[str, Any] = {
            "server_hostname": host,
            "cert_reqs": ssl.CERT_REQUIRED,
            "tls_minimum_version": ssl.TLSVersion.TLSv1_2,
        }
        if self.ca_file is not None:
            options["ca_certs"] = self.ca_file
        if self.cert_file is not None:
            options |= {"certfile": self.cert_file, "keyfile": self.key_file}
        return options


def connection(url: str, tls: BrokerTls | None = None, **options: Any) -> Connection:
    """A kombu Connection to `url`. For `amqps://`, with explicit TLS options (`tls`, or
    the system's CAs): by itself kombu passes `ssl=True`, with which py-amqp checks the
    chain but not that the certificate names the URL's host."""
    parts = urlsplit(url)
    # kombu would put a URL's ssl_* options in place of these.
    if any(key.lower().startswith("ssl") for key, _ in parse_qsl(parts.query)):
        raise ConfigurationError(
            "PROVISIONER_BROKER_URL has ssl_* query options: TLS is set with "
            "PROVISIONER_BROKER_CA_FILE, PROVISIONER_BROKER_CERT_FILE and _KEY_FILE"
        )
    if parts.scheme.lower() == "amqps":
        options["ssl"] = (tls or BrokerTls()).ssl_options(parts.hostname or "")
    return Connection(url, **options)


def connect(url: str, tls: BrokerTls | None = None) -> Connection:
    """A connection for publishing and consuming (confirms, heartbeats)."""
    options = {} if is_memory(url) else {"confirm_publish": True}
    heartbeat = 0 if is_memory(url) else 30
    return connection(url, tls, transport_options=options, heartbeat=heartbeat)
