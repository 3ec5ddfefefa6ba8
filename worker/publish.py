"""What `rollout` and `retry` share: projection rows by id, and `provision`
messages published on the workers' broker."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import click

from infrastructure.settings.model import Settings
from worker.console import CommandFailed, load_settings

IN_CHUNK = 500  # ids per `IN (...)` query (well under SQLite's limit on parameters)


def chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), IN_CHUNK):
        yield items[start : start + IN_CHUNK]


def rows_by(store: Any, name: str, column: str, values: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of projection `name` whose `column` is one of `values` (chunked queries)."""
    from infrastructure.views.store import PROJECTIONS

    found: list[dict[str, Any]] = []
    for chunk in chunks(list(dict.fromkeys(values))):
        marks = ", ".join("?" * len(chunk))
        found += store.rows(PROJECTIONS[name], f"{column} IN ({marks})", list(chunk))
    return found


def refuse_memory(command: str, settings: Settings | None = None) -> str:
    """The broker URL to publish on; memory:// would reach no worker (exit 3)."""
    from infrastructure.broker.connection import is_memory
    from infrastructure.failures import ConfigurationError

    url = (settings or load_settings()).broker_url
    if is_memory(url):
        raise ConfigurationError(
            f"`{command}` publishes to the workers' broker, and memory:// is in-process "
            "(no worker would see the messages): set PROVISIONER_BROKER_URL=amqp://... to "
            "the broker your workers consume"
        )
    return url


def publisher(url: str, settings: Settings | None = None) -> Any:
    from infrastructure.broker.topology import Topology
    from worker.console import declared_broker

    settings = settings or load_settings()
    return declared_broker(url, Topology(queue_type=settings.queue_type), settings)


def provision(brand_id: str, title: str, parent: str) -> Any:
    from infrastructure.broker import messages

    return messages.provision(brand_id, title, parent, datetime.now(UTC))


@contextmanager
def partial_sends(sent: Sequence[object], total: int, again: str) -> Iterator[None]:
    """A publish that failed part-way, as one line: the failure, and what was sent
    (raised as it is with --debug, or when nothing was sent: it says it all)."""
    from worker.edges import describe

    try:
        yield
    except Exception as exc:
        if click.get_current_context().find_root().params.get("debug") or not sent:
            raise
        failure = describe(exc)
        raise CommandFailed(
            f"{failure} ({len(sent)} of {total} sent before that; {again})", failure.exit_code
        ) from None


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
