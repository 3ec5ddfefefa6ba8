"""The web view's pages: each reads what it shows (worker/web/reads.py) and renders
its template; a page's refusals (an unknown filter, a bad `?refresh=`) are 400s."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

import click
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from domain.errors import UnknownAttempt, UnknownBrand
from domain.policies import FailureReason
from infrastructure.broker.dead_letters import PAGE
from infrastructure.settings.model import Settings
from worker.console import TimeParam
from worker.edges import describe
from worker.health.results import healthy
from worker.web import csrf
from worker.web.reads import BRANDS_SHOWN, STATUSES, GatewayProbe, Reads

REFRESH_S = (5, 3600)  # the seconds `?refresh=` may ask between reloads
REASONS = tuple(reason.value for reason in FailureReason)


def _time(name: str, text: str) -> datetime | None:
    """`?since=` or `?until=`: a time as the commands take it (ISO 8601, UTC unless it
    says otherwise; `now`; or an age: 30s, 15m, 2h, 7d), or None when not given."""
    if not text:
        return None
    try:
        found: datetime = TimeParam().convert(text[:60], None, None)
    except click.BadParameter as exc:
        raise ValueError(f"?{name}={text[:60]!r}: {exc.message}") from None
    return found


class Pages:
    def __init__(self, settings: Settings, templates: Jinja2Templates) -> None:
        self.settings = settings
        self.reads = Reads(settings)
        self.gateway = GatewayProbe(settings)  # its answer kept across requests
        self.templates = templates

    def page(self, request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        """The template; with `?refresh=N`, one the browser reloads every N seconds."""
        refresh = request.query_params.get("refresh")
        low, high = REFRESH_S
        if refresh is not None and not (refresh.isdigit() and low <= int(refresh) <= high):
            return self.refused(
                request,
                f"?refresh={refresh[:20]!r}: give the seconds "
                f"between reloads, from {low} to {high}",
            )
        others = [(k, v) for k, v in request.query_params.multi_items() if k != "refresh"]
        links = {
            "stop_url": "?" + urlencode(others),
            "refresh_url": "?" + urlencode([*others, ("refresh", "10")]),
        }
        shown = {"refresh": int(refresh) if refresh else None, **links, **context}
        return self._forms(request, name, shown, status_code)

    def _forms(
        self, request: Request, name: str, context: dict[str, Any], status_code: int
    ) -> Response:
        """The template with what its forms need (worker/web/csrf.py): with a web token,
        the form token of this browser's nonce (a new nonce in a cookie if it has
        none), and what the last action said (shown once)."""
        token = self.settings.web_token
        nonce = request.cookies.get(csrf.COOKIE)
        fresh = csrf.new_nonce() if token and not csrf.is_nonce(nonce) else None
        form_token = csrf.form_token(token, fresh or nonce or "") if token else None
        said = csrf.read_lines(token, request.cookies.get(csrf.SAID))
        shown = {"csrf": form_token, "said": said, **context}
        answer = self.templates.TemplateResponse(request, name, shown, status_code=status_code)
        if token:
            answer.headers["Cache-Control"] = "no-store"  # a page holding a form token
        if fresh:
            answer.set_cookie(
                csrf.COOKIE,
                fresh,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        if csrf.SAID in request.cookies:
            answer.delete_cookie(csrf.SAID, httponly=True, samesite="strict")
        return answer

    def refused(
        self, request: Request, message: str, status_code: int = 400, heading: str = "Bad request"
    ) -> Response:
        context = {
            "refresh": None,
            "stop_url": "?",
            "refresh_url": "?refresh=10",
            "heading": heading,
            "message": message,
        }
        return self._forms(request, "missing.html", context, status_code)

    def not_done(self, request: Request, status_code: int, heading: str, message: str) -> Response:
        """An action's refusal (worker/web/actions.py)."""
        return self.refused(request, message, status_code, heading)

    def missing(self, request: Request, message: str) -> Response:
        return self.page(request, "missing.html", 404, heading="Not found", message=message)

    async def brands(self, request: Request) -> Response:
        status = request.query_params.get("status") or None
        if status is not None and status not in STATUSES:
            shown = status[:40]
            return self.refused(request, f"unknown status {shown!r}: one of {', '.join(STATUSES)}")
        reason = request.query_params.get("reason") or None
        if reason is not None and reason not in REASONS:
            shown = reason[:40]
            return self.refused(request, f"unknown reason {shown!r}: one of {', '.join(REASONS)}")
        times = {k: (request.query_params.get(k) or "").strip() for k in ("since", "until")}
        try:
            since, until = (_time(k, times[k]) for k in ("since", "until"))
        except ValueError as exc:
            return self.refused(request, str(exc))
        search = (request.query_params.get("q") or "").strip() or None
        after = request.query_params.get("after", "")[:200] or None
        found = await run_in_threadpool(
            self.reads.brands, status, search, after, reason=reason, since=since, until=until
        )
        refresh = request.query_params.get("refresh")
        kept = {
            k: v
            for k, v in (
                ("status", status),
                ("q", search),
                ("reason", reason),
                ("since", times["since"]),
                ("until", times["until"]),
                ("refresh", refresh),
            )
            if v
        }
        nxt = found["next_after"]
        return self.page(
            request,
            "brands.html",
            statuses=STATUSES,
            status=status or "",
            q=search or "",
            reasons=REASONS,
            reason=reason or "",
            since=times["since"],
            until=times["until"],
            page_size=BRANDS_SHOWN,
            paged=after is not None,
            first_url="?" + urlencode(kept),
            next_url="?" + urlencode({**kept, "after": nxt}) if nxt else None,
            **found,
        )

    async def brand(self, request: Request) -> Response:
        brand_id = request.path_params["brand_id"]
        try:
            found = await run_in_threadpool(self.reads.brand, brand_id)
        except UnknownBrand as exc:
            return self.missing(request, str(exc))
        return self.page(request, "brand.html", brand_id=brand_id, **found)

    async def attempt(self, request: Request) -> Response:
        given = request.path_params["attempt_id"]
        try:
            attempt_id = UUID(given)
        except ValueError:
            return self.missing(request, f"{given[:60]!r} is not an attempt id (a UUID)")
        try:
            found = await run_in_threadpool(self.reads.attempt, attempt_id)
        except UnknownAttempt as exc:
            return self.missing(request, str(exc))
        return self.page(request, "attempt.html", **found)

    async def workspace(self, request: Request) -> Response:
        workspace_id = request.path_params["workspace_id"]
        found = await run_in_threadpool(self.reads.workspace, workspace_id)
        return self.page(request, "workspace.html", workspace_id=workspace_id, **found)

    async def stuck(self, request: Request) -> Response:
        default = self.settings.health_stuck_after_s
        try:
            overdue = float(request.query_params.get("overdue", default))
        except ValueError:
            overdue = default
        overdue = max(0.0, overdue)
        rows = await run_in_threadpool(self.reads.stuck, overdue)
        return self.page(request, "stuck.html", rows=rows, overdue=overdue)

    async def dead_letters(self, request: Request) -> Response:
        after = request.query_params.get("after", "")[:100] or None  # ids are 16 characters
        found = await run_in_threadpool(self.reads.dead_letters, after)
        return self.page(request, "dead_letters.html", page_size=PAGE, **found)

    async def dead_letter(self, request: Request) -> Response:
        letter_id = request.path_params["letter_id"][:100]
        found = await run_in_threadpool(self.reads.dead_letter, letter_id)
        if "missing" in found:
            return self.missing(request, found["missing"])
        return self.page(request, "dead_letter.html", letter_id=letter_id, **found)

    async def audit(self, request: Request) -> Response:
        parents = await run_in_threadpool(self.reads.audit)
        return self.page(request, "audit.html", parents=parents)

    async def health(self, request: Request) -> Response:
        results = await run_in_threadpool(self.reads.health, self.gateway)
        circuit = next((r for r in results if r.name == "gateway_circuit"), None)
        return self.page(
            request,
            "health.html",
            results=results,
            circuit=circuit,
            healthy=healthy(results),
            at=datetime.now(UTC),
        )

    async def lag(self, request: Request) -> Response:
        found = await run_in_threadpool(self.reads.lag)
        return self.page(request, "lag.html", **found)

    async def failed(self, request: Request, exc: Exception) -> Response:
        message = str(describe(exc))
        return self.page(request, "missing.html", 503, heading="Unavailable", message=message)

    async def not_found(self, request: Request, _exc: Exception) -> Response:
        return self.missing(request, "no such page")
