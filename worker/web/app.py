"""The operator's web view: read-only pages over the read models, the event store and
the dead-letter queue (docs/operations.md, "Web view").

Starlette routes, Jinja2 templates with autoescape on (every text from a brand, the
gateway or a message is escaped), and an optional bearer token checked on every
request before anything is read. Served by uvicorn (`provisioner web`); the Host
check and the security headers are worker/web/guard.py's.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import markupsafe
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp

from domain.errors import UnknownBrand
from infrastructure.dead_letters import PAGE
from infrastructure.redaction import Secrets
from infrastructure.settings import Settings
from worker.edges import describe
from worker.web.guard import Guard, HostCheck, check_bind
from worker.web.reads import BRANDS_SHOWN, STATUSES, Reads

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
    reads = Reads(settings)
    templates = _templates(settings.secrets())
    css = STYLESHEET.read_bytes()

    def page(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        return templates.TemplateResponse(request, name, context, status_code=status_code)

    async def brands(request: Request) -> Response:
        status = request.query_params.get("status") or None
        if status is not None and status not in STATUSES:
            status = None
        search = (request.query_params.get("q") or "").strip() or None
        rows = await run_in_threadpool(reads.brands, status, search)
        return page(
            request, "brands.html", rows=rows[:BRANDS_SHOWN], more=len(rows) > BRANDS_SHOWN,
            statuses=STATUSES, status=status or "", q=search or "",
        )  # fmt: skip

    async def brand(request: Request) -> Response:
        brand_id = request.path_params["brand_id"]
        try:
            found = await run_in_threadpool(reads.brand, brand_id)
        except UnknownBrand as exc:
            return page(request, "missing.html", 404, heading="Not found", message=str(exc))
        return page(request, "brand.html", brand_id=brand_id, **found)

    async def stuck(request: Request) -> Response:
        try:
            overdue = float(request.query_params.get("overdue", settings.health_stuck_after_s))
        except ValueError:
            overdue = settings.health_stuck_after_s
        overdue = max(0.0, overdue)
        rows = await run_in_threadpool(reads.stuck, overdue)
        return page(request, "stuck.html", rows=rows, overdue=overdue)

    async def dead_letters(request: Request) -> Response:
        after = request.query_params.get("after", "")[:100] or None  # ids are 16 characters
        found = await run_in_threadpool(reads.dead_letters, after)
        return page(request, "dead_letters.html", page_size=PAGE, **found)

    async def lag(request: Request) -> Response:
        found = await run_in_threadpool(reads.lag)
        return page(request, "lag.html", **found)

    async def stylesheet(_request: Request) -> Response:
        return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=300"})

    async def failed(request: Request, exc: Exception) -> Response:
        return page(request, "missing.html", 503, heading="Unavailable", message=str(describe(exc)))

    async def not_found(request: Request, _exc: Exception) -> Response:
        return page(request, "missing.html", 404, heading="Not found", message="no such page")

    middleware = [Middleware(BearerToken, token=settings.web_token)] if settings.web_token else []
    pages = Starlette(
        routes=[
            Route("/style.css", stylesheet),
            Route("/", brands),
            Route("/brands/{brand_id:path}", brand),
            Route("/stuck", stuck),
            Route("/dead-letters", dead_letters),
            Route("/lag", lag),
        ],
        middleware=middleware,
        exception_handlers={404: not_found, Exception: failed},
    )
    return Guard(pages, HostCheck(settings, host or settings.web_host, port or settings.web_port))


def serve(settings: Settings, host: str, port: int) -> None:
    """Serve the pages until interrupted (uvicorn; its access log at WARNING and up);
    refused beyond loopback without a token unless PROVISIONER_WEB_ALLOW_OPEN=1."""
    check_bind(settings, host)
    app = create_app(settings, host=host, port=port)
    # log_config=None: uvicorn's lines (a traceback too) go to the root handler, behind
    # the redaction, rather than to handlers of its own made after it.
    uvicorn.run(app, host=host, port=port, log_level="warning", log_config=None)
