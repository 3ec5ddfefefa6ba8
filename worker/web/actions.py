"""What the web view's forms do (docs/operations.md, "Web view", "Actions"): retry a
failed brand, deactivate one (kept for the retention window, or emptied now),
replay or purge a dead letter, audit upstream now (read-only).

POST only, each behind the web token and the form's CSRF token (worker/web/csrf.py),
after the same-origin checks every request passes (worker/web/guard.py). Each calls
what the command line calls (worker/actions.py, worker/redrive.py), so it records
the same events, findings and lines; each line it said is logged on
`provisioner.web.actions` (WARNING: seen at the default level) and shown once on the
page a 303 leads to. A refusal is a page with one line saying what to do: 403 (no
web token, a CSRF check failed), 400 (a form that is not one of ours), 404 (no such
dead letter), 409 (nothing to do as asked); a service that fails is the 503 every
page gives.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs, quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from domain.dead_letter_rules import AmbiguousId
from domain.errors import ProvisionerError
from infrastructure.broker.connection import is_memory
from infrastructure.broker.dead_letter_parsing import NotReplayable
from infrastructure.broker.dead_letters import NotFound
from infrastructure.failures import ConfigurationError
from infrastructure.settings.model import Settings
from worker import actions
from worker.redrive import publish, redrive_line, select
from worker.web import csrf

log = logging.getLogger("provisioner.web.actions")

T = TypeVar("T")
FORM_BYTES = 8192  # a form of ours is a few hundred bytes
RETENTION = {"keep": False, "purge": True}  # the form's choice: `purge_now`


MEMORY_BROKER = (
    "a retry publishes to the workers' broker, and memory:// is in-process: set "
    "PROVISIONER_BROKER_URL to the broker your workers consume, or run `provisioner retry "
    "--failed` where it is set"
)


class ActionRefused(Exception):
    """An action not taken: its status code and one line saying what to do."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


class Actions:
    def __init__(self, settings: Settings, show: Callable[[Request, int, str, str], Response]):
        self.settings = settings
        self.show = show  # (request, status, heading, message) -> the refusal's page

    async def _form(self, request: Request) -> dict[str, str]:
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            raise ActionRefused(400, "an action is a form of this server's pages (urlencoded)")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > FORM_BYTES:
                raise ActionRefused(400, "this form is larger than any form of these pages")
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        return {name: values[0] for name, values in fields.items()}

    async def _act(
        self, request: Request, action: Callable[[dict[str, str]], tuple[str, list[str]]]
    ) -> Response:
        """Read the form, check the tokens, act (in a thread), and redirect (303)
        to the page the action leads to, what it said kept for that page."""
        token = self.settings.web_token
        try:
            form = await self._form(request)
            self._check(request, form)
            to, lines = await run_in_threadpool(action, form)
        except ActionRefused as refused:
            return self.show(request, refused.status_code, "Not done", str(refused))
        for line in lines:
            log.warning("web action %s: %s", request.url.path.rsplit("/", 1)[-1], line)
        answer = RedirectResponse(to, status_code=303)
        assert token is not None
        answer.set_cookie(
            csrf.SAID,
            csrf.signed_lines(token, lines),
            max_age=300,
            httponly=True,
            samesite="strict",
        )
        return answer

    def _check(self, request: Request, form: dict[str, str]) -> None:
        """Refused (403) without the web token or when the CSRF check fails."""
        cookie = request.cookies.get(csrf.COOKIE)
        why = csrf.refusal(self.settings.web_token, cookie, form.get(csrf.FIELD))
        if why is not None:
            log.warning("web action refused: %s %s", request.url.path, why)
            raise ActionRefused(403, why)

    async def retry(self, request: Request) -> Response:
        return await self._act(request, self._retry)

    async def deactivate(self, request: Request) -> Response:
        return await self._act(request, self._deactivate)

    async def replay(self, request: Request) -> Response:
        return await self._act(request, self._replay)

    async def purge(self, request: Request) -> Response:
        return await self._act(request, self._purge)

    async def audit(self, request: Request) -> Response:
        return await self._act(request, self._audit)

    # ------------------------------------------------------------------ the actions

    def _retry(self, form: dict[str, str]) -> tuple[str, list[str]]:
        """`provisioner retry --failed --brand B`: one `provision` with the failed
        attempt's title and parent."""
        brand_id = _field(form, "brand_id")
        url = self.settings.broker_url
        if is_memory(url):
            raise ActionRefused(409, MEMORY_BROKER)
        done, skipped = select(self.settings, brand_ids=[brand_id])
        if not done:
            now = f"is {skipped[0]['status']} now" if skipped else "has no failed attempt"
            raise ActionRefused(409, f"brand {brand_id} {now}: there is no failure to retry")
        [redrive] = done
        if redrive.error is not None:
            raise ActionRefused(409, redrive_line(redrive, "re-requested"))
        publish(self.settings, done, url, [])
        return _brand_page(brand_id), [redrive_line(redrive, "re-requested")]

    def _deactivate(self, form: dict[str, str]) -> tuple[str, list[str]]:
        """`provisioner deactivate B [--purge-now]`."""
        brand_id = _field(form, "brand_id")
        retention = form.get("retention", "")
        if retention not in RETENTION:
            raise ActionRefused(
                400,
                "choose what becomes of the workspace: keep it for the "
                "retention window, or empty it now",
            )
        try:
            said = actions.deactivate(self.settings, brand_id, purge_now=RETENTION[retention])
        except ProvisionerError as exc:
            raise ActionRefused(409, str(exc)) from None
        return _brand_page(brand_id), [said]

    def _replay(self, form: dict[str, str]) -> tuple[str, list[str]]:
        """`provisioner dead-letters replay ID`."""
        letter_id = _field(form, "letter_id")
        done = _on_letters(self.settings, lambda letters: letters.replay(letter_id))
        return "/dead-letters", actions.replay_lines(done)

    def _purge(self, form: dict[str, str]) -> tuple[str, list[str]]:
        """`provisioner dead-letters purge ID --yes`."""
        letter_id = _field(form, "letter_id")
        purged = _on_letters(self.settings, lambda letters: letters.purge((letter_id,)))
        return "/dead-letters", actions.purge_lines(purged)

    def _audit(self, form: dict[str, str]) -> tuple[str, list[str]]:
        """`provisioner audit [--parent P]`, never `--fix`."""
        parent = form.get("parent", "").strip() or None
        try:
            audits = actions.audit_now(self.settings, parent)
        except ConfigurationError as exc:
            raise ActionRefused(409, str(exc)) from None
        lines = [actions.audit_line(audit) for audit in audits]
        return "/audit", lines or ["no parent on record to audit: nothing was read"]


def _field(form: dict[str, str], name: str) -> str:
    value = form.get(name, "")
    if not value:
        named = name.replace("_", " ")
        raise ActionRefused(400, f"the form names no {named}: use this server's page")
    return value


def _brand_page(brand_id: str) -> str:
    return "/brands/" + quote(brand_id, safe="")


def _on_letters(settings: Settings, act: Callable[[Any], T]) -> T:
    """`act` on the dead-letter queue (as `provisioner dead-letters` opens it), a
    letter that is not there, or not as asked, said as a refusal."""
    try:
        with actions.dead_letters(settings) as letters:
            return act(letters)
    except NotFound as missing:
        raise ActionRefused(404, f"{missing}: replayed or purged already? See the list") from None
    except (AmbiguousId, NotReplayable) as refused:
        raise ActionRefused(409, str(refused)) from None
    except ConfigurationError as exc:  # the embedded broker keeps none
        raise ActionRefused(409, str(exc)) from None
