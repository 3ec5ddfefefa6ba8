"""What the `provisioner` commands share: settings, the one-shot service, the read
models, and text made safe for Rich."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.markup import escape

from infrastructure.broker import Broker, Topology
from infrastructure.broker_failures import broker_failure
from infrastructure.settings import Settings


def load_settings() -> Settings:
    return Settings.from_env()


class Failed(click.ClickException):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def cell(value: Any) -> str:
    """Text for a Rich table cell: whatever came from the wire or a producer, escaped."""
    return escape("" if value is None else str(value))


def jsonable(value: Any) -> Any:
    from datetime import datetime

    return value.isoformat() if isinstance(value, datetime) else str(value)


def service_only(*, read_only: bool = False) -> Any:
    """A service for the request path (no gateway call is made there) on one
    database connection at a time, opened per use. `read_only`: creates nothing."""
    from infrastructure.eventstore import open_event_store
    from infrastructure.gateway import HttpGateway
    from infrastructure.service import ProvisioningService

    settings = load_settings()
    app = open_event_store(
        settings.database_url, one_shot=True, read_only=read_only,
        wait_s=settings.connect_wait_s,
    )  # fmt: skip
    gateway = HttpGateway("http://127.0.0.1:9", "request-path")
    return ProvisioningService(app, gateway, settings=settings.engine())


def views(*, read_only: bool = True) -> Any:
    """The read models of the configured database, checked to exist (creating nothing)."""
    from infrastructure.views import SqlViewStore

    settings = load_settings()
    url = settings.database_url
    store = SqlViewStore(url, read_only=read_only, wait_s=settings.connect_wait_s)
    try:
        store.check()
    except BaseException:
        store.close()
        raise
    return store


@contextmanager
def declared_broker(url: str, topology: Topology) -> Iterator[Broker]:
    """A publisher on the broker, connected and the topology declared first, so a
    one-shot command says at once, in one line, which broker failed and why."""
    publisher = Broker(url, topology, scheduler=None)
    try:
        try:
            publisher.declare()
        except Exception as exc:
            failure = broker_failure(exc, url)
            if failure is None:
                raise
            raise failure from exc
        yield publisher
    finally:
        publisher.close()
