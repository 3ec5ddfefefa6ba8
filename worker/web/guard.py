"""What stands in front of every page of the web view: the Host check, the refusal of
requests another site's page made, the security headers, and the refusal to serve the
pages open beyond loopback.

A page the browser fetched under a name that is not this server's (DNS rebinding:
a hostile site whose name now points at 127.0.0.1) is refused before anything is
read. So is a request another site's page made (an `<img>` or a form pointing here):
the browser says so in `Sec-Fetch-Site` (anything but `same-origin` and `none`, a
typed address or a bookmark) or in an `Origin` that is not one of this server's own
names. Without a token such a request would otherwise be served on loopback, and a
page that opens connections (or calls the gateway) would run for it.

Every answer, an error, a 400, 401 or 403 too, carries the headers below: no frame,
no sniffing, no referrer to another site, and a Content-Security-Policy that lets the pages load
their own stylesheet and nothing else (they have no script).
"""

from __future__ import annotations

import logging

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infrastructure.failures import ConfigurationError
from infrastructure.settings.model import Settings
from infrastructure.settings.parsing import is_loopback, split_host

log = logging.getLogger("provisioner.web")

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = (
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    # No referrer to another site; to this one, its pages' own addresses. (With
    # no-referrer a browser sends `Origin: null` with a form's POST, which the check
    # below must refuse: the forms could not act.)
    ("Referrer-Policy", "same-origin"),
)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def check_bind(settings: Settings, host: str) -> None:
    """Refuse to serve the pages without a token beyond loopback (0.0.0.0 and :: too),
    unless PROVISIONER_WEB_ALLOW_OPEN=1 says this network is trusted."""
    if is_loopback(host) or settings.web_token:
        return
    if not settings.web_allow_open:
        raise ConfigurationError(
            f"provisioner web would serve {host} without PROVISIONER_WEB_TOKEN: set a token, "
            "bind 127.0.0.1, or set PROVISIONER_WEB_ALLOW_OPEN=1 if this network is trusted"
        )
    log.warning("serving the web view at %s without a token (PROVISIONER_WEB_ALLOW_OPEN=1)", host)


class HostCheck:
    """The names this server answers to: the bound host and the loopback names with
    the bound port, and PROVISIONER_WEB_ALLOWED_HOSTS (`name`: any port)."""

    def __init__(self, settings: Settings, host: str, port: int) -> None:
        bound = split_host(f"[{host}]" if ":" in host else host)
        self.names = {bound[0] if bound else host.lower(), *LOOPBACK_NAMES}
        self.port = port
        entries = (split_host(entry) for entry in settings.web_allowed_hosts)
        self.allowed = [entry for entry in entries if entry is not None]

    def __call__(self, header: str) -> bool:
        found = split_host(header)
        if found is None:
            return False
        name, port = found
        if name in self.names and (port or 80) == self.port:
            return True
        return any(name == n and p in (None, port) for n, p in self.allowed)


def cross_site(headers: Headers, hosts: HostCheck) -> str | None:
    """Why a request was made by another site's page (its one-line refusal), or None."""
    fetched = headers.get("sec-fetch-site")
    if fetched is not None and fetched.lower() not in ("same-origin", "none"):
        shown = fetched[:40].encode("ascii", "replace").decode()
        return (
            f"403: refused a request from another site's page (Sec-Fetch-Site: {shown}): "
            "open this page from its own address"
        )
    origin = headers.get("origin")
    if origin is None:
        return None
    scheme, _, rest = origin.partition("://")
    if scheme.lower() in ("http", "https") and rest and "/" not in rest and hosts(rest):
        return None
    shown = origin[:100].encode("ascii", "replace").decode()
    return (
        f"403: refused a request from another origin ({shown!r}): open this page "
        "from its own address"
    )


class Guard:
    """ASGI middleware around the whole application (outside Starlette's error
    handler, so that a 500 or 503 page carries the headers as well)."""

    def __init__(self, app: ASGIApp, hosts: HostCheck) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for key, value in SECURITY_HEADERS:
                    headers[key] = value
            await send(message)

        host = Headers(scope=scope).get("host", "")
        if not self.hosts(host):
            shown = host[:100].encode("ascii", "replace").decode()
            refusal = PlainTextResponse(
                f"400: this server does not answer to the name {shown!r} "
                "(PROVISIONER_WEB_ALLOWED_HOSTS lists the names it may have)",
                status_code=400,
            )
            await refusal(scope, receive, guarded)
            return
        why = cross_site(Headers(scope=scope), self.hosts)
        if why is not None:
            await PlainTextResponse(why, status_code=403)(scope, receive, guarded)
            return
        await self.app(scope, receive, guarded)
