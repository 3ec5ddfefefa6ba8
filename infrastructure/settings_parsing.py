"""Reading and checking one environment variable each, for `Settings`
(infrastructure/settings.py): a bad value raises `SettingsError` naming it."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from domain.ids import GATEWAY_ID
from domain.producer_scopes import Scope
from infrastructure.failures import ConfigurationError

_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
LOG_FORMATS = ("auto", "text", "json")


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


def number(
    env: Mapping[str, str],
    key: str,
    default: float,
    *,
    low: float,
    high: float,
    integer: bool = False,
    above: bool = False,
) -> float:
    raw = env_value(env, key)
    if raw is None:
        return default
    kind = "an integer" if integer else "a number"
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise SettingsError(f"{key} must be {kind}, got {raw!r}") from None
    if value != value or (value <= low if above else value < low) or value > high:  # noqa: PLR0124
        bound = f"> {low:g}" if above else f">= {low:g}"
        raise SettingsError(f"{key} must be {kind} {bound} and <= {high:g}, got {raw!r}")
    return value


def positive(env: Mapping[str, str], key: str, default: float, *, high: float) -> float:
    """A number > 0 and <= `high`."""
    return number(env, key, default, low=0, high=high, above=True)


def integer(env: Mapping[str, str], key: str, default: int, *, low: int, high: int) -> int:
    """An integer from `low` to `high`."""
    return int(number(env, key, default, low=low, high=high, integer=True))


def gateway_rate(env: Mapping[str, str]) -> float | None:
    """PROVISIONER_GATEWAY_RATE: calls/s for the whole fleet; unset, learned from 429s."""
    if env_value(env, "PROVISIONER_GATEWAY_RATE") is None:
        return None
    return positive(env, "PROVISIONER_GATEWAY_RATE", 0, high=10**6)


def choice(env: Mapping[str, str], key: str, choices: tuple[str, ...]) -> str:
    raw = (env_value(env, key) or choices[0]).lower()
    if raw not in choices:
        raise SettingsError(f"{key} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


def flag(env: Mapping[str, str], key: str) -> bool:
    return choice(env, key, ("0", "1")) == "1"


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


def file_path(env: Mapping[str, str], key: str) -> str | None:
    """A path to a readable file (a CA bundle, a certificate, a key), or None."""
    path = env_value(env, key)
    if path is not None and not os.path.isfile(path):
        raise SettingsError(f"{key} names {path!r}, which is not a readable file")
    return path


def parent_ids(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """PROVISIONER_PARENT_IDS: the comma-separated parents the service may act under."""
    raw = env_value(env, "PROVISIONER_PARENT_IDS")
    if raw is None:
        return None
    ids = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    bad = [i for i in ids if not GATEWAY_ID.fullmatch(i)]
    if not ids or bad:
        raise SettingsError(
            "PROVISIONER_PARENT_IDS must be comma-separated gateway ids "
            f"([A-Za-z0-9._-], 1 to 128 characters), got {raw!r}"
        )
    return ids


_PRODUCER = re.compile(r"[A-Za-z0-9._-]{1,64}")
_BRAND_PATTERN = re.compile(r"[A-Za-z0-9._*?-]{1,200}")
SCOPES_FORM = "USER=BRAND_PATTERN[,...][@PARENT[,...]], entries separated by ';'"


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


def allowed_hosts(env: Mapping[str, str]) -> tuple[str, ...]:
    """PROVISIONER_WEB_ALLOWED_HOSTS: comma-separated `name` (any port) or `name:port`."""
    key = "PROVISIONER_WEB_ALLOWED_HOSTS"
    raw = env_value(env, key)
    if raw is None:
        return ()
    hosts = tuple(dict.fromkeys(part.strip().lower() for part in raw.split(",") if part.strip()))
    if not hosts or not all(split_host(host) for host in hosts):
        raise SettingsError(
            f"{key} must be comma-separated host names or addresses, each with an optional "
            f":port (IPv6 in brackets), got {raw!r}"
        )
    return hosts


def web_token(env: Mapping[str, str]) -> str | None:
    token = env_value(env, "PROVISIONER_WEB_TOKEN")
    return None if token is None else check_token("PROVISIONER_WEB_TOKEN", token)


def log_format(env: Mapping[str, str] | None = None) -> str:
    """PROVISIONER_LOG_FORMAT, read on its own: logging is set up before the rest."""
    return choice(os.environ if env is None else env, "PROVISIONER_LOG_FORMAT", LOG_FORMATS)
