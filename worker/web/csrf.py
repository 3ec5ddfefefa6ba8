"""The rule that lets the web view's forms act (docs/operations.md, "Web view"), as
pure functions: no action without PROVISIONER_WEB_TOKEN, and none whose form token
does not match.

Each browser gets a random nonce in a cookie (`provisioner_csrf`: HttpOnly,
SameSite=Strict, path /) with the first page it reads; every form of that page
carries, in a hidden field, the HMAC-SHA256 of that nonce keyed by the web token.
A POST acts only if the field matches the HMAC of the nonce its cookie holds. A
page of another site cannot read the cookie nor the pages, so it cannot know the
field, and without the web token nobody can derive it from a nonce; a field seen
once is worth nothing to another browser (another nonce). This is on top of the
same-origin checks every request passes first (worker/web/guard.py) and the
bearer token every request carries.

What an action said is shown once on the page it leads to, from a cookie signed
the same way (`provisioner_said`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets

COOKIE = "provisioner_csrf"
FIELD = "csrf"
SAID = "provisioner_said"
NONCE = re.compile(r"[A-Za-z0-9_-]{32}")

NOT_CONFIGURED = (
    "403: the web view acts only with PROVISIONER_WEB_TOKEN set (every request then "
    "carries Authorization: Bearer <token>): set it and restart `provisioner web`, or "
    "use the command line"
)
NO_COOKIE = (
    "403: refused: this browser has no form cookie of this server (provisioner_csrf); "
    "open the page from this server's address, then submit its form again"
)
NO_FIELD = (
    "403: refused: the form carried no CSRF token; submit the form of this server's own "
    "page (reload it first)"
)
MISMATCH = (
    "403: refused: the form's CSRF token does not match this browser's cookie (an old "
    "page, another browser's, or another site's form); reload the page and submit it again"
)


def new_nonce() -> str:
    return secrets.token_urlsafe(24)  # 32 characters


def is_nonce(value: str | None) -> bool:
    return value is not None and NONCE.fullmatch(value) is not None


def _mac(web_token: str, purpose: str, text: str) -> str:
    message = f"{purpose}:{text}".encode()
    return hmac.new(web_token.encode(), message, hashlib.sha256).hexdigest()


def form_token(web_token: str, nonce: str) -> str:
    """The hidden field a form of a page read with this nonce carries."""
    return _mac(web_token, "csrf", nonce)


def refusal(web_token: str | None, cookie: str | None, field: str | None) -> str | None:
    """Why a POST may not act (its 403's one line), or None when it may."""
    if not web_token:
        return NOT_CONFIGURED
    if not is_nonce(cookie):
        return NO_COOKIE
    if not field:
        return NO_FIELD
    assert cookie is not None
    if not hmac.compare_digest(field.encode(), form_token(web_token, cookie).encode()):
        return MISMATCH
    return None


def signed_lines(web_token: str, lines: list[str]) -> str:
    """The lines an action said, for the `provisioner_said` cookie (ASCII, signed; the
    first 10, each cut to 300 characters, so the cookie stays well under 4 KiB)."""
    kept = [line[:300] for line in lines[:10]]
    body = base64.urlsafe_b64encode(json.dumps(kept).encode()).decode()
    return f"{body}.{_mac(web_token, 'said', body)}"


def read_lines(web_token: str | None, value: str | None) -> list[str]:
    """The lines of a `provisioner_said` cookie this server signed ([] otherwise)."""
    if not web_token or not value or "." not in value:
        return []
    body, _, mac = value.rpartition(".")
    if not hmac.compare_digest(mac.encode(), _mac(web_token, "said", body).encode()):
        return []
    try:
        lines = json.loads(base64.urlsafe_b64decode(body.encode()))
    except ValueError:
        return []
    if not isinstance(lines, list):
        return []
    return [str(line) for line in lines]
