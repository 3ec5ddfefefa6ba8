"""The gateway's certificate, checked without calling the gateway: one TLS handshake
with its host, and no request (no token sent, nothing spent of the gateway's quota).

A certificate that does not verify is a refusal, not an outage (infrastructure/tls.py):
a process that would call the gateway refuses to start with it (exit 4), and `health`
fails with it, even while the fleet's pace holds every call. Anything else (the host
down, a proxy the handshake does not go through) is left to the calls themselves: an
outage the service waits out.
"""

from __future__ import annotations

import logging
import socket
import ssl
from urllib.parse import urlsplit

import httpx

from infrastructure.failures import ServiceRefused
from infrastructure.tls import certificate_refusal

log = logging.getLogger("provisioner.gateway")

HANDSHAKE_TIMEOUT_S = 3.0  # as the gateway client's connect timeout


def gateway_context(ca_file: str | None) -> ssl.SSLContext:
    """What the gateway client trusts (infrastructure/gateway/adapter.py): `ca_file` alone when
    given, else httpx's CAs; either way the name is checked."""
    return ssl.create_default_context(cafile=ca_file) if ca_file else httpx.create_ssl_context()


def certificate_refused(
    url: str, ca_file: str | None, *, timeout_s: float = HANDSHAKE_TIMEOUT_S
) -> ServiceRefused | None:
    """The one-line refusal when the gateway at `url` presents a certificate that does
    not verify; None when it verifies, for plain http, and when it cannot be reached."""
    where = urlsplit(url)
    host = where.hostname
    if where.scheme.lower() != "https" or not host:
        return None
    context = gateway_context(ca_file)
    try:
        with (
            socket.create_connection((host, where.port or 443), timeout=timeout_s) as sock,
            context.wrap_socket(sock, server_hostname=host),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        return gateway_refusal(exc, host)
    except OSError as exc:  # unreachable, or TLS failing otherwise: the calls will say
        log.debug("gateway TLS handshake not completed: %s", exc)
        return None


def refuse_unverified(url: str, ca_file: str | None) -> None:
    """Raise the refusal of `certificate_refused`, if any (a process's start)."""
    refusal = certificate_refused(url, ca_file)
    if refusal is not None:
        raise refusal


def gateway_refusal(exc: BaseException, host: str) -> ServiceRefused | None:
    """One line when the gateway's certificate did not verify; None for any other failure."""
    return certificate_refusal(
        exc,
        peer="the gateway",
        host=host,
        url_key="PROVISIONER_GATEWAY_URL",
        ca_key="PROVISIONER_GATEWAY_CA_FILE",
    )
