"""Secrets kept out of every text the service shows: log lines, command output and
error lines, the probes, the web pages and dead letters.

`Secrets` holds the configured secrets (`Settings.secrets()`: the gateway token, the
passwords of the database, broker and gateway URLs, the web token) and hides each one
by its value, in every form a text may carry it: as it is, percent-encoded (as
`quote` and `quote_plus` write it, and as the URL itself does) and JSON-escaped
(`\\"` and `\\\\`, non-ASCII as `\\uXXXX` or not, or every character as `\\uXXXX`).
`redact` is the fallback for the passwords nobody told us of: it hides the user-info
password of any URL and every `password=` query value, by their shape.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit

HIDDEN = "***"
# A shorter secret is not looked for: it would match inside ordinary words and ids
# (the stars would shred every message and, by where they fall, tell the secret
# anyway), and a secret that short is guessed in moments: hiding it protects nothing.
MIN_CHARS = 4
# A secret cut short at the end of a text (truncated to fit a header or a line) is
# hidden when this much of it is left: fewer characters tell little, and more often
# end an ordinary text that merely begins like a secret.
MIN_CUT_CHARS = 8
# A JSON body up to this size is decoded to look for a secret escaped some other way
# (a message is at most 64 KiB; a bigger body is refused unread, and only shortened).
JSON_PASS_MAX_BYTES = 1 << 20

# scheme://user:password@host: the password runs to the last "@" before white
# space, so one holding any unencoded character ("@", "/", "?", "#", quotes) is
# hidden whole. A URL with an "@" later on (`?application_name=a@b`) loses its
# host and path from the message too: more than its password, never less.
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^:/?#\s@\"'<>]*:)\S*@")
# A query key that names a password, and its value.
_PASSWORD_KEY = re.compile(r"(?i)([?&;][^=&#\s]*password[^=&#\s]*=)[^&#\s]*")
# One URL's user and password, the password up to its last "@" (spaces and quotes too).
_USER_INFO = re.compile(r"(?is)^[a-z][a-z0-9+.-]*://([^:/?#]*):(.*)@")


def redact(text: str) -> str:
    """The URL (or a text with URLs in it) without its passwords, by their shape: the
    user-info password of any URL (`user:***@host`), and the value of every query key
    that names a password (`password=`, `sslpassword=`, ...). Lexical, so it also
    hides what a malformed URL holds; a password holding a space, or after a user
    name holding a quote, is only hidden by its value (`Secrets`, `redact_url`)."""
    return _PASSWORD_KEY.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


def url_passwords(url: str | None) -> tuple[str, ...]:
    """The passwords a URL carries, as written in it and decoded; never raises.

    Its user-info password as `urlsplit` reads it and as read up to the URL's last
    "@" (a password holding an unencoded "/", "?", "#" or space), and the value of
    every query key naming a password. A password equal to the URL's user, host or
    database name is left out: the URL shows that text anyway, and hiding it would
    hide that user or host in every line.
    """
    if not url:
        return ()
    found: list[str] = []
    shown: set[str] = set()
    try:
        parts = urlsplit(url)
        found.append(parts.password or "")
        found += [
            v for k, v in parse_qsl(parts.query, keep_blank_values=True) if "password" in k.lower()
        ]
        shown |= {parts.username or "", parts.hostname or "", parts.path.strip("/")}
    except ValueError:
        pass  # not even a URL: what the pattern reads below is all there is
    whole = _USER_INFO.match(url)
    if whole:
        found.append(whole.group(2))
        shown.add(whole.group(1))
    shown |= {unquote(text) for text in shown}
    forms = (form for password in found for form in (password, unquote(password)))
    return tuple(dict.fromkeys(form for form in forms if form and form not in shown))


def _forms(secret: str) -> set[str]:
    """Every form `secret` may take in a text (see the module's docstring)."""
    units = secret.encode("utf-16-be", "surrogatepass")
    every = [int.from_bytes(units[i : i + 2], "big") for i in range(0, len(units), 2)]
    forms = {
        secret,
        json.dumps(secret)[1:-1],  # ensure_ascii: non-ASCII as \uXXXX
        json.dumps(secret, ensure_ascii=False)[1:-1],
        "".join(f"\\u{unit:04x}" for unit in every),
        "".join(f"\\u{unit:04X}" for unit in every),
    }
    with contextlib.suppress(UnicodeError):  # a lone surrogate no URL holds: no such form
        forms |= {
            quote(secret, safe="", errors="surrogateescape"),
            quote(secret, errors="surrogateescape"),  # "/" kept, as in a path
            quote_plus(secret, errors="surrogateescape"),
        }
    return forms


def _encoded(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeError:
        return text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True, slots=True)
class Secrets:
    """The configured secrets, each hidden (`***`) by its value wherever it appears.

    `values` keeps the secrets of at least MIN_CHARS characters, once each; `forms`
    is every form of each, longest first (a form holding another is hidden whole).
    """

    values: tuple[str, ...] = field(default=(), repr=False)
    forms: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _bytes: tuple[bytes, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kept = tuple(dict.fromkeys(v for v in self.values if len(v) >= MIN_CHARS))
        forms = sorted(
            {form for value in kept for form in _forms(value)}, key=lambda form: (-len(form), form)
        )
        object.__setattr__(self, "values", kept)
        object.__setattr__(self, "forms", tuple(forms))
        object.__setattr__(self, "_bytes", tuple(dict.fromkeys(map(_encoded, forms))))

    @classmethod
    def of(cls, *values: str | None) -> Secrets:
        return cls(tuple(value for value in values if value))

    def __bool__(self) -> bool:
        return bool(self.values)

    def scrub(self, text: str) -> str:
        """The text without any secret (nor, by the fallback `redact`, any URL password)."""
        return redact(self._hide(text))

    def scrub_bytes(self, data: bytes) -> bytes:
        """A body without any secret, in any form; a JSON body in which one is still
        found once decoded (escaped some other way, `\\u` for some characters only)
        is written anew from its decoded value, the secret hidden. Nothing else in
        the body changes: no URL-shape fallback."""
        for form in self._bytes:
            data = data.replace(form, HIDDEN.encode())
        if not self.values or len(data) > JSON_PASS_MAX_BYTES:
            return data
        try:
            decoded = json.loads(data.decode("utf-8"))
            hidden = self._map(decoded, self._hide)
        except (ValueError, RecursionError):
            return data
        return data if hidden == decoded else json.dumps(hidden, ensure_ascii=False).encode()

    def scrub_value(self, value: Any) -> Any:
        """`value` with every text in it scrubbed: strings, dictionary keys and values,
        list and tuple items, byte strings; anything else as it is."""
        return self._map(value, self.scrub)

    def _hide(self, text: str) -> str:
        for form in self.forms:
            if form in text:
                text = text.replace(form, HIDDEN)
        return self._hide_cut(text)

    def _hide_cut(self, text: str) -> str:
        """The text without a secret cut short at its end (a value truncated to fit
        a header or a line), when at least MIN_CUT_CHARS of it are left."""
        cut = len(text)
        for form in self.forms:
            head = form[:MIN_CUT_CHARS]
            if len(head) < MIN_CUT_CHARS:
                continue
            at = text.find(head, max(0, len(text) - len(form) + 1))
            while at != -1 and at < cut:
                if form.startswith(text[at:]):
                    cut = at
                    break
                at = text.find(head, at + 1)
        return text if cut == len(text) else text[:cut] + HIDDEN

    def _map(self, value: Any, hide: Callable[[str], str]) -> Any:
        if isinstance(value, str):
            return hide(value)
        if isinstance(value, bytes):
            return self.scrub_bytes(value)
        if isinstance(value, dict):
            return {self._map(k, hide): self._map(v, hide) for k, v in value.items()}
        if isinstance(value, list | tuple):
            items = [self._map(item, hide) for item in value]
            return items if isinstance(value, list) else tuple(items)
        return value


NO_SECRETS = Secrets()


def redact_url(url: str, text: str | None = None) -> str:
    """`text` (the URL itself by default) without the URL's passwords: by their value,
    then by the shape of any URL in it."""
    return Secrets.of(*url_passwords(url)).scrub(url if text is None else text)
