"""Broker connections: every kombu Connection of the project is made by
`connection`; an `amqps://` one checks the broker's certificate chain and its
name (`BrokerTls`)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit

from kombu.connection import Connection

from infrastructure.failures import ConfigurationError
from infrastructure.settings.model import BrokerTls


def is_memory(url: str) -> bool:
    return url.startswith("memory://")


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
