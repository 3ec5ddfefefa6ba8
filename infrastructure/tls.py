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

from infrastructure.failures import ServiceRefused, causes
from infrastructure.settings.parsing import is_loopback
from infrastructure.store.eventstore import is_postgres

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
    and name (libpq's `sslmode`, else PGSSLMODE, else `prefer`); None when it would not.
    Where it connects is what libpq picks (`database_targets`)."""
    if not is_postgres(url):
        return None
    options = conninfo_to_dict(url)
    mode = str(options.get("sslmode") or env.get("PGSSLMODE") or "prefer")
    remote = [
        f"{target} ({source})" if source else target
        for target, source in database_targets(options, env)
        if not target.startswith(("/", "@")) and not is_loopback(target)
    ]
    if mode == "verify-full" or not remote:
        return None
    return (
        f"PROVISIONER_DATABASE_URL reaches {', '.join(remote)} with sslmode={mode}: the "
        "server's certificate and name are not checked; add "
        "?sslmode=verify-full&sslrootcert=<CA file> to the URL"
    )


def database_targets(
    options: Mapping[str, object], env: Mapping[str, str]
) -> list[tuple[str, str]]:
    """Where libpq connects, each with where it was said ("" for the URL's host): a
    host's `hostaddr` when one is given (the URL's, else PGHOSTADDR) is dialled, and
    its host name only checked against the certificate; else the host (the URL's,
    else PGHOST). None of them: the local socket."""
    hosts, host_from = _listed(options, env, "host", "PGHOST")
    addrs, addr_from = _listed(options, env, "hostaddr", "PGHOSTADDR")
    targets = []
    for n in range(max(len(hosts), len(addrs))):
        addr = addrs[n] if n < len(addrs) else ""
        host = hosts[n] if n < len(hosts) else ""
        if addr:
            targets.append((addr, addr_from))
        elif host:
            targets.append((host, host_from))
    return targets


def _listed(
    options: Mapping[str, object], env: Mapping[str, str], key: str, variable: str
) -> tuple[list[str], str]:
    """A comma-separated libpq option from the URL, else its environment variable."""
    if options.get(key):
        return [h.strip() for h in str(options[key]).split(",")], "" if key == "host" else key
    if env.get(variable):
        return [h.strip() for h in env[variable].split(",")], variable
    return [], ""


def warn_unverified_database(url: str) -> None:
    """Log `unverified_database` once per process (and URL)."""
    if url in _warned:
        return
    _warned.add(url)
    why = unverified_database(url, os.environ)
    if why is not None:
        log.warning("%s", why)
