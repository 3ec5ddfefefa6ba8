"""Reading and checking one environment variable: the parsers of the settings'
table (infrastructure/settings/table.py), each with the words the docs use for
what it accepts. A bad value raises `SettingsError`, one line naming the variable."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from domain.ids import GATEWAY_ID
from domain.producer_scopes import Scope
from infrastructure.failures import ConfigurationError
from infrastructure.store.eventstore import DATABASE_SCHEMES, check_database_url

_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
LOG_FORMATS = ("auto", "text", "json")
GATEWAY_IDS = "gateway ids ([A-Za-z0-9._-], 1 to 128 characters)"


class SettingsError(ConfigurationError):
    """A setting has a value that cannot be used; the message names it."""


def env_value(env: Mapping[str, str], key: str) -> str | None:
    """The variable's value, None when unset; set but empty is an error."""
    raw = env.get(key)
    if raw is None:
        return None
    if raw.strip() == "":
        raise SettingsError(f"{key} is set but empty: unset it for the default, or give a value")
    return raw.strip()


class Parser(Protocol):
    """How a variable that is set (not empty) becomes its value, or SettingsError."""

    def parse(self, key: str, raw: str) -> Any: ...

    def accepts(self) -> str:
        """What a value must be, in the docs' words (markdown)."""
        ...


def _amount(value: float) -> str:
    return f"{int(value):,}" if value == int(value) else f"{value:g}"


@dataclass(frozen=True, slots=True)
class Number:
    """A number from `low` (above it, with `above`) to `high`; whole with `integer`."""

    low: float
    high: float
    above: bool = False
    integer: bool = False

    def parse(self, key: str, raw: str) -> float:
        kind = "an integer" if self.integer else "a number"
        try:
            value = int(raw) if self.integer else float(raw)
        except ValueError:
            raise SettingsError(f"{key} must be {kind}, got {raw!r}") from None
        low, high = self.low, self.high
        if value != value or (value <= low if self.above else value < low) or value > high:  # noqa: PLR0124
            bound = f"> {low:g}" if self.above else f">= {low:g}"
            raise SettingsError(f"{key} must be {kind} {bound} and <= {high:g}, got {raw!r}")
        return value

    def accepts(self) -> str:
        kind = "integer" if self.integer else "number"
        if self.above:
            return f"{kind} above {_amount(self.low)}, up to {_amount(self.high)}"
        return f"{kind} {_amount(self.low)} to {_amount(self.high)}"


@dataclass(frozen=True, slots=True)
class Choice:
    """One of `choices`, in any case."""

    choices: tuple[str, ...]

    def parse(self, key: str, raw: str) -> str:
        value = raw.lower()
        if value not in self.choices:
            raise SettingsError(f"{key} must be one of {', '.join(self.choices)}, got {value!r}")
        return value

    def accepts(self) -> str:
        *first, last = (f"`{choice}`" for choice in self.choices)
        return f"{', '.join(first)} or {last}"


@dataclass(frozen=True, slots=True)
class Flag:
    """`0` or `1`, read as False or True."""

    def parse(self, key: str, raw: str) -> bool:
        return Choice(("0", "1")).parse(key, raw) == "1"

    def accepts(self) -> str:
        return Choice(("0", "1")).accepts()


@dataclass(frozen=True, slots=True)
class Url:
    """A URL of one of `schemes`, with a host unless `host` is False."""

    schemes: tuple[str, ...]
    host: bool = True

    def parse(self, key: str, raw: str) -> str:
        return check_url(key, raw, self.schemes, host=self.host)

    def accepts(self) -> str:
        return f"URL: {', '.join(f'`{scheme}`' for scheme in self.schemes)}"


@dataclass(frozen=True, slots=True)
class DatabaseUrl:
    """The event store's URL: a scheme it knows, and options libpq knows."""

    def parse(self, key: str, raw: str) -> str:
        check_url(key, raw, DATABASE_SCHEMES, host=False)
        try:
            check_database_url(raw)
        except ConfigurationError as exc:
            raise SettingsError(f"{key}: {exc}") from None
        return raw

    def accepts(self) -> str:
        return Url(DATABASE_SCHEMES).accepts()


@dataclass(frozen=True, slots=True)
class Host:
    """An address to bind (`check_host`)."""

    def parse(self, key: str, raw: str) -> str:
        return check_host(key, raw)

    def accepts(self) -> str:
        return "IP address or host name"


@dataclass(frozen=True, slots=True)
class Token:
    """A secret sent as it is: no whitespace or control characters."""

    def parse(self, key: str, raw: str) -> str:
        return check_token(key, raw)

    def accepts(self) -> str:
        return "text without whitespace or control characters"


@dataclass(frozen=True, slots=True)
class File:
    """A path to a readable file (a CA bundle, a certificate, a key)."""

    def parse(self, key: str, raw: str) -> str:
        if not os.path.isfile(raw):
            raise SettingsError(f"{key} names {raw!r}, which is not a readable file")
        return raw

    def accepts(self) -> str:
        return "path of a readable file"


@dataclass(frozen=True, slots=True)
class ParentIds:
    """Comma-separated gateway ids, each once."""

    def parse(self, key: str, raw: str) -> tuple[str, ...]:
        return parent_ids(key, raw)

    def accepts(self) -> str:
        return "comma-separated gateway ids (`[A-Za-z0-9._-]`, 1 to 128 characters)"


@dataclass(frozen=True, slots=True)
class Scopes:
    """Producers' scopes, kept as written: checked with the parents (`producer_scopes`)."""

    def parse(self, key: str, raw: str) -> str:  # noqa: ARG002 (checked with the parents)
        return raw

    def accepts(self) -> str:
        return f"`{SCOPES_ENTRY}`, entries separated by `;`"


@dataclass(frozen=True, slots=True)
class AllowedHosts:
    """Comma-separated `name` or `name:port`, each once."""

    def parse(self, key: str, raw: str) -> tuple[str, ...]:
        return allowed_hosts(key, raw)

    def accepts(self) -> str:
        return "comma-separated `name` or `name:port`"


def check_url(key: str, url: str, schemes: tuple[str, ...], *, host: bool = True) -> str:
    """Scheme, host and port of a URL; raise SettingsError naming `key`."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise SettingsError(f"{key} is not a usable URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise SettingsError(
            f"{key} has scheme {scheme or '(none)'!r}: use one of {', '.join(schemes)}"
        )
    if host and scheme != "memory" and not parts.hostname:
        raise SettingsError(f"{key} names no host")
    if port == 0:
        raise SettingsError(f"{key} has port 0: give a port from 1 to 65535")
    return url


def check_host(key: str, host: str) -> str:
    """An address to bind: an IPv4/IPv6 literal (0.0.0.0 or :: for every interface) or a
    host name; no port, scheme or path."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        labels = host.rstrip(".").split(".")
    else:
        return host
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise SettingsError(
            f"{key} must be an IP address or a host name (no port or scheme), got {host!r}"
        )
    return host


def check_token(key: str, token: str) -> str:
    if any(c.isspace() or not c.isprintable() for c in token):
        raise SettingsError(f"{key} contains whitespace or control characters")
    return token


def parent_ids(key: str, raw: str) -> tuple[str, ...]:
    """PROVISIONER_PARENT_IDS: the comma-separated parents the service may act under."""
    ids = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    bad = [i for i in ids if not GATEWAY_ID.fullmatch(i)]
    if not ids or bad:
        raise SettingsError(f"{key} must be comma-separated {GATEWAY_IDS}, got {raw!r}")
    return ids


_PRODUCER = re.compile(r"[A-Za-z0-9._-]{1,64}")
_BRAND_PATTERN = re.compile(r"[A-Za-z0-9._*?-]{1,200}")
SCOPES_ENTRY = "USER=BRAND_PATTERN[,...][@PARENT[,...]]"
SCOPES_FORM = f"{SCOPES_ENTRY}, entries separated by ';'"


def producer_scopes(raw: str, parents: tuple[str, ...] | None = None) -> dict[str, Scope]:
    """PROVISIONER_PRODUCER_SCOPES read: each producer's brand patterns and parents
    (`orders=ord-*,shop-*@org-parent;billing=bill-*`). A parent must be one of
    `parents` (PROVISIONER_PARENT_IDS) when they are given."""
    key = "PROVISIONER_PRODUCER_SCOPES"
    scopes: dict[str, Scope] = {}
    for entry in (part.strip() for part in raw.split(";")):
        if not entry:
            continue
        user, _, rest = (x.strip() for x in entry.partition("="))
        brands_text, _, parents_text = rest.partition("@")
        brands = _items(brands_text)
        scoped_parents = _items(parents_text)
        bad = not _PRODUCER.fullmatch(user) or not brands or user in scopes
        bad = bad or not all(_BRAND_PATTERN.fullmatch(b) for b in brands)
        bad = bad or ("@" in rest and not scoped_parents)
        if bad or not all(GATEWAY_ID.fullmatch(p) for p in scoped_parents):
            raise SettingsError(f"{key}: {entry!r} is not {SCOPES_FORM} (each user once)")
        foreign = [p for p in scoped_parents if parents is not None and p not in parents]
        if foreign:
            raise SettingsError(
                f"{key}: {entry!r} names {foreign[0]!r}, not in PROVISIONER_PARENT_IDS"
            )
        scopes[user] = Scope(brands, scoped_parents)
    if not scopes:
        raise SettingsError(f"{key} names no producer: give {SCOPES_FORM}, or unset it")
    return scopes


def _items(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_host(value: str) -> tuple[str, int | None] | None:
    """`name`, `name:port`, `[v6]` or `[v6]:port` (a Host header, an allowed host) as
    (name, port): the name lower-cased, without brackets; None when it is not that."""
    try:
        parts = urlsplit(f"//{value}")
        port = parts.port
        check_host("host", parts.hostname or "")
    except (ValueError, SettingsError):
        return None
    if parts.netloc != value or "@" in value:
        return None
    return parts.hostname or "", port


def allowed_hosts(key: str, raw: str) -> tuple[str, ...]:
    """PROVISIONER_WEB_ALLOWED_HOSTS: comma-separated `name` (any port) or `name:port`."""
    hosts = tuple(dict.fromkeys(part.strip().lower() for part in raw.split(",") if part.strip()))
    if not hosts or not all(split_host(host) for host in hosts):
        raise SettingsError(
            f"{key} must be comma-separated host names or addresses, each with an optional "
            f":port (IPv6 in brackets), got {raw!r}"
        )
    return hosts
