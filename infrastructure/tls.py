"""TLS at the edges: what is said when a peer's certificate does not verify, and the
start-up warning for a PostgreSQL connection that would not check one.

A certificate that does not verify is a refusal, not an outage: only a change of
setting or of certificate fixes it, so retrying is no use (infrastructure/failures.py).
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Mapping

from psycopg.conninfo import conninfo_to_dict

from infrastructure.eventstore import is_postgres
from infrastructure.failures import ServiceRefused, causes
from infrastructure.settings import is_loopback

log = logging.getLogger("provisioner.settings")

# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
_NAME_MISMATCH = (62, 64)
_warned: set[str] = set()


def certificate_refusal(
    exc: BaseException, *, peer: str, host: str | None, url_key: str, ca_key: str
) -> ServiceRefused | None:
    """One line for a certificate of `peer` (at `host`) that did not verify, naming the
    settings to check; None when `exc` is no such failure."""
    error = next((c for c in causes(exc) if isinstance(c, ssl.SSLCertVerificationError)), None)
    if error is None:
        return None
    if error.verify_code in _NAME_MISMATCH:
        return ServiceRefused(
            f"TLS: {peer} presented a certificate that is not valid for {host} "
            f"(hostname mismatch): check {url_key}'s host, or {ca_key}"
        )
    reason = " ".join(str(error.verify_message or error.reason or error).split()).rstrip(".")
    return ServiceRefused(
        f"TLS: {peer} presented a certificate that does not verify ({reason}): set {ca_key} "
        "to the CA that signed it, or check the server's certificate"
    )


def unverified_database(url: str, env: Mapping[str, str]) -> str | None:
    """Why a PostgreSQL URL would reach a remote host without checking its certificate
    and name (libpq's `sslmode`, else PGSSLMODE, else `prefer`); None when it would not."""
    if not is_postgres(url):
        return None
    options = conninfo_to_dict(url)
    mode = str(options.get("sslmode") or env.get("PGSSLMODE") or "prefer")
    hosts = str(options.get("host") or "127.0.0.1").split(",")
    remote = [h for h in hosts if h and not h.startswith("/") and not is_loopback(h)]
    if mode == "verify-full" or not remote:
        return None
    return (
        f"PROVISIONER_DATABASE_URL reaches {', '.join(remote)} with sslmode={mode}: the "
        "server's certificate and name are not checked; add "
        "?sslmode=verify-full&sslrootcert=<CA file> to the URL"
    )


def warn_unverified_database(url: str) -> None:
    """Log `unverified_database` once per process (and URL)."""
    if url in _warned:
        return
    _warned.add(url)
    why = unverified_database(url, os.environ)
    if why is not None:
        log.warning("%s", why)
