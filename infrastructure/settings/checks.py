"""Checks over the environment as a whole: no unknown PROVISIONER_* name (for
`Settings.from_env` and the CLI), and, before any CLI command, the embedded
default (a SQLite or in-memory store with the `memory://` broker) all or nothing.

A misspelt variable is never a fallback to the default: it is refused, naming
the known variable it most resembles. The known names are the rows of the
settings' table (infrastructure/settings/table.py), plus the few read elsewhere
(`ELSEWHERE`).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from infrastructure.settings.parsing import SettingsError, env_value
from infrastructure.settings.table import BY_NAME, VARIABLES, default_of
from infrastructure.store.eventstore import is_postgres

PREFIX = "PROVISIONER_"
ALLOW_MIXED = "PROVISIONER_ALLOW_MIXED_EMBEDDED"
REAL_BROKERS = ("amqp", "amqps", "pyamqp")

# PROVISIONER_* variables read outside infrastructure/settings/model.py, by the test
# harness and the benchmarks' helpers only; known, so that setting one is never
# taken for a misspelt setting (the CLI runs inside those environments).
ELSEWHERE = (
    "PROVISIONER_REQUIRE_SERVICES",  # tests/conftest.py, .ci/run: a missing service fails
    "PROVISIONER_TEST_PG",  # tests/conftest.py: the server the tests' databases live on
    "PROVISIONER_TEST_PG_BIN",  # tests/services.py: PostgreSQL's binaries
    "PROVISIONER_TEST_AMQP",  # tests/integration/conftest.py: the tests' broker
    "PROVISIONER_TEST_OUTAGE_BRANDS",  # tests/integration/test_outages.py: its size
    "PROVISIONER_SCREENSHOT",  # tests/integration/test_web_browser.py: where to save one
)


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` most resembles, if one is close (a typo, a missing `_`);
    compared without the common prefix, which would make every name look alike."""
    by_tail = {key.removeprefix(PREFIX): key for key in known}
    tail = name.removeprefix(PREFIX)
    matches = difflib.get_close_matches(tail, list(by_tail), n=1, cutoff=0.6)
    return by_tail[matches[0]] if matches else None


def unknown_names(env: Mapping[str, str], known: Iterable[str]) -> list[str]:
    """The PROVISIONER_* names set in `env` that are not `known`, sorted."""
    names = set(known)
    return sorted(key for key in env if key.startswith(PREFIX) and key not in names)


def check_names(env: Mapping[str, str], settings: Iterable[str]) -> None:
    """Raise SettingsError, one line, for any PROVISIONER_* variable that is neither
    one of `settings` (the settings table's) nor read `ELSEWHERE`."""
    known = (*settings, *ELSEWHERE)
    unknown = unknown_names(env, known)
    if not unknown:
        return
    where = "(docs/configuration.md lists the settings)"
    if len(unknown) == 1:
        near = closest(unknown[0], known)
        hint = f"did you mean {near}?" if near else "no setting has a name like it."
        raise SettingsError(f"unknown setting {unknown[0]}; {hint} Unset it or fix it {where}")
    named = ", ".join(
        f"{name} (did you mean {near}?)" if (near := closest(name, known)) else name
        for name in unknown
    )
    raise SettingsError(f"unknown settings {named}: unset them or fix them {where}")


def embedded_mix(database_url: str, broker_url: str) -> str | None:
    """Why this store and broker mix the embedded default with a real service (a
    SQLite or in-memory store with RabbitMQ, or PostgreSQL with the in-process
    `memory://` broker); None when both are embedded or both real."""
    real_store = is_postgres(database_url)
    scheme = urlsplit(broker_url).scheme.lower()
    real_broker = scheme in REAL_BROKERS
    if real_broker and not real_store:
        return (
            f"the embedded event store {database_url} with a real broker ({scheme}://): "
            "set PROVISIONER_DATABASE_URL to the PostgreSQL database"
        )
    if real_store and not real_broker:
        return (
            "PostgreSQL with the in-process broker memory://, which no other process "
            "shares: set PROVISIONER_BROKER_URL to the RabbitMQ broker"
        )
    return None


def check_mix(database_url: str, broker_url: str, *, allowed: bool) -> None:
    """Raise SettingsError when the store and broker mix embedded and real, unless `allowed`."""
    reason = embedded_mix(database_url, broker_url)
    if reason is not None and not allowed:
        raise SettingsError(f"{reason}, or {ALLOW_MIXED}=1 to mix them on purpose")


def check_environment(env: Mapping[str, str] | None = None, *, mix: bool = True) -> None:
    """What the CLI refuses before any command: an unknown PROVISIONER_* name and,
    with `mix`, a store and broker mixing embedded and real unless ALLOW_MIXED=1."""
    env = os.environ if env is None else env
    check_names(env, VARIABLES)
    if mix:
        # As written, unchecked: a bad URL is the command's to refuse, naming it.
        database = env_value(env, "PROVISIONER_DATABASE_URL") or default_of("database_url")
        broker = env_value(env, "PROVISIONER_BROKER_URL") or default_of("broker_url")
        check_mix(database, broker, allowed=BY_NAME[ALLOW_MIXED].parse(env))
