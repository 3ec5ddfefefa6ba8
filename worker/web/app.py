"""The operator's web view: pages over the read models, the event store and the
dead-letter queue, and the forms that act behind the web token and a CSRF check
(worker/web/actions.py; docs/operations.md, "Web view").

Starlette routes, Jinja2 templates with autoescape on (every text from a brand, the
gateway or a message is escaped), and an optional bearer token checked on every
request before anything is read. Served by uvicorn (`provisioner web`); the Host
check and the security headers are worker/web/guard.py's.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import markupsafe
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp

from domain.progress import clock
from infrastructure.redaction import Secrets
from infrastructure.settings.model import Settings
from worker.web.actions import Actions
from worker.web.guard import Guard, HostCheck, check_bind
from worker.web.pages import Pages
from worker.web.timeline import duration
from worker.web.workers import Workers

TEMPLATES = Path(__file__).parent / "templates"
STYLESHEET = Path(__file__).parent / "static" / "style.css"  # no inline style: the CSP


def when(value: Any) -> str:
    """A time as a person reads it (UTC, to the second)."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return str(value)
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _templates(secrets: Secrets) -> Jinja2Templates:
    def scrubbed(value: Any) -> Any:
        """What a page shows of a value (`{{ ... }}`), without any configured secret;
        before autoescape, so the secret is found as it is."""
        if value is None or isinstance(value, int | float):
            return value
        if isinstance(value, markupsafe.Markup):
            return markupsafe.Markup(secrets.scrub(str(value)))  # noqa: S704 - safe already
        return secrets.scrub(str(value))

    env = jinja2.Environment(
        finalize=scrubbed,
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # every page is HTML: everything interpolated is escaped
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = when
    env.filters["clock"] = lambda at: "" if at is None else clock(at, datetime.now(UTC))
    env.filters["duration"] = duration
    return Jinja2Templates(env=env)


class BearerToken(BaseHTTPMiddleware):
    """Every request carries `Authorization: Bearer <token>`, or gets 401."""

    def __init__(self, app: Any, token: str) -> None:
        super().__init__(app)
        self.expected = f"Bearer {token}".encode()

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        given = request.headers.get("authorization", "").encode()
        if not secrets.compare_digest(given, self.expected):
            return PlainTextResponse(
                "401: this page needs Authorization: Bearer <PROVISIONER_WEB_TOKEN>",
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="provisioner"'},
            )
        return await call_next(request)


def create_app(settings: Settings, *, host: str | None = None, port: int | None = None) -> ASGIApp:
    """The pages, answering only to the names of `host`:`port` (the bound address;
    PROVISIONER_WEB_HOST and _PORT by default) and PROVISIONER_WEB_ALLOWED_HOSTS."""
    pages = Pages(settings, _templates(settings.secrets()))
    actions = Actions(settings, pages.not_done)
    css = STYLESHEET.read_bytes()

    async def stylesheet(_request: Request) -> Response:
        return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=300"})

    middleware = [Middleware(BearerToken, token=settings.web_token)] if settings.web_token else []
    served = Starlette(
        routes=[
            Route("/style.css", stylesheet),
            Route("/", pages.brands),
            Route("/brands/{brand_id:path}", pages.brand),
            Route("/attempts/{attempt_id}", pages.attempt),
            Route("/workspaces/{workspace_id:path}", pages.workspace),
            Route("/stuck", pages.stuck),
            Route("/dead-letters", pages.dead_letters),
            Route("/dead-letters/{letter_id}", pages.dead_letter),
            Route("/audit", pages.audit),
            Route("/health", pages.health),
            Route("/lag", pages.lag),
            Route("/workers", Workers(settings, pages.page).list),
            Route("/actions/retry", actions.retry, methods=["POST"]),
            Route("/actions/deactivate", actions.deactivate, methods=["POST"]),
            Route("/actions/replay", actions.replay, methods=["POST"]),
            Route("/actions/purge", actions.purge, methods=["POST"]),
            Route("/actions/audit", actions.audit, methods=["POST"]),
        ],
        middleware=middleware,
        exception_handlers={404: pages.not_found, Exception: pages.failed},
    )
    return Guard(served, HostCheck(settings, host or settings.web_host, port or settings.web_port))


def serve(settings: Settings, host: str, port: int) -> None:
    """Serve the pages until interrupted (uvicorn; its access log at WARNING and up);
    refused beyond loopback without a token unless PROVISIONER_WEB_ALLOW_OPEN=1."""
    check_bind(settings, host)
    app = create_app(settings, host=host, port=port)
    shown = f"[{host}]" if ":" in host else host
    print(f"listening on http://{shown}:{port}", flush=True)
    # log_config=None: uvicorn's lines (a traceback too) go to the root handler, behind
    # the redaction, rather than to handlers of its own made after it.
    uvicorn.run(app, host=host, port=port, log_level="warning", log_config=None)
