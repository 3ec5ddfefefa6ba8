"""`provisioner config`: the settings in effect, each with where it came from
(`default`, `environment`, or `flag` for the global `--i-know-this-is-a-test`),
every secret redacted: the tokens shown as `***`, passwords in URLs too, and the
value of every URL query key not known to be harmless (`HARMLESS_QUERY_KEYS`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_plus

import click

from infrastructure.redaction import HIDDEN, redact
from infrastructure.settings.checks import PREFIX, check_environment
from infrastructure.settings.model import FAKE_SWITCH, Settings
from infrastructure.settings.table import VARIABLES
from worker.console import echo, load_settings
from worker.logs import printable

SECRET_FIELDS = frozenset({"gateway_token", "web_token"})
# Query keys of a URL that say how to connect, never who connects: their values are
# shown. Any other key's value is hidden (`?api_key=`, `?token=`, a key we never heard of).
HARMLESS_QUERY_KEYS = frozenset(
    {
        "sslmode",
        "sslrootcert",
        "connect_timeout",
        "application_name",
        "target_session_attrs",
        "heartbeat",
    }
)


def hide_query_values(text: str) -> str:
    """A URL with the value of each query key not in `HARMLESS_QUERY_KEYS` shown as
    `***`; the keys, and any text that is no URL with a query, as they are."""
    scheme, _, rest = text.partition("://")
    base, question, query = rest.partition("?")
    if not scheme or not question:
        return text
    query, hash_mark, fragment = query.partition("#")
    parts = []
    for part in query.split("&"):
        key, equals, _value = part.partition("=")
        harmless = unquote_plus(key).strip().lower() in HARMLESS_QUERY_KEYS
        parts.append(part if not equals or harmless else f"{key}={HIDDEN}")
    hidden_fragment = HIDDEN if fragment else ""
    return f"{scheme}://{base}?{'&'.join(parts)}{hash_mark}{hidden_fragment}"


def _value(settings: Settings, name: str, env: Mapping[str, str]) -> Any:
    """The value in effect of variable `name`: its `Settings` field (a field per
    variable, named after it), or the raw variable for one without a field."""
    if name == FAKE_SWITCH:
        return ("test" if settings.fake_gateway_test else "1") if settings.fake_gateway else "0"
    field = name.removeprefix(PREFIX).lower()
    if not hasattr(settings, field):
        return env.get(name)
    value = getattr(settings, field)
    if field in SECRET_FIELDS and value is not None:
        return HIDDEN
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(value) or None
    return value


def config_rows(
    settings: Settings, env: Mapping[str, str], *, fake_flag: bool = False
) -> list[dict[str, Any]]:
    """One row per setting, in the table's order: name, value in effect, source."""
    secrets = settings.secrets()
    rows = []
    for name in VARIABLES:
        value = _value(settings, name, env)
        if isinstance(value, str):
            value = secrets.scrub(redact(hide_query_values(value)))
        source = "environment" if name in env else "default"
        if name == FAKE_SWITCH and fake_flag and value == "test" and env.get(name) != "test":
            source = "flag"  # PROVISIONER_FAKE_GATEWAY=1 and --i-know-this-is-a-test
        rows.append({"name": name, "value": value, "source": source})
    return rows


def _shown(value: Any) -> str:
    if value is None:
        return "(none)"
    return f"{value:g}" if isinstance(value, float) else str(value)


GAP = "   "
BELOW = "(below)"


def table_lines(rows: list[dict[str, Any]], width: int) -> list[str]:
    """The settings as a table of `width` columns (setting, value, source) in which
    no value is ever broken: one too long for its column is shown whole on the next
    line, indented, with `(below)` in the column (a terminal narrower than the value
    wraps it, and a copy of it is still one value)."""
    cells = [(printable(r["name"]), printable(_shown(r["value"])), r["source"]) for r in rows]
    name_w = max(len("setting"), *(len(name) for name, _, _ in cells))
    source_w = max(len("source"), *(len(source) for _, _, source in cells))
    room = max(width - name_w - source_w - 2 * len(GAP), len(BELOW))

    def line(name: str, value: str, source: str) -> str:
        return f"{name:<{name_w}}{GAP}{value:<{room}}{GAP}{source}".rstrip()

    lines = [line("setting", "value", "source"), "\u2500" * width]
    for name, value, source in cells:
        if len(value) <= room:
            lines.append(line(name, value, source))
        else:
            lines += [line(name, BELOW, source), f"    {value}"]
    return lines


@click.command("config")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def config(as_json: bool) -> None:
    """Print the settings in effect and where each came from (default, environment,
    flag); secrets redacted. Exit 3, after them, if the store and broker mix the
    embedded default with real services without PROVISIONER_ALLOW_MIXED_EMBEDDED=1."""
    settings = load_settings()
    fake_flag = bool(click.get_current_context().find_root().params.get("fake_is_test"))
    rows = config_rows(settings, os.environ, fake_flag=fake_flag)
    if as_json:
        echo(json.dumps({"settings": rows}, indent=2))
    else:
        from rich.console import Console

        for line in table_lines(rows, Console().width):
            echo(line)
    check_environment(mix=True)
