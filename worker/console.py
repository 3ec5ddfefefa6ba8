"""What the `provisioner` commands share: settings, the one-shot service, the read
models, and text made safe for Rich and free of secrets."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, ClassVar

import click
from rich.markup import escape

from infrastructure.broker.failures import broker_failure
from infrastructure.broker.publisher import Broker
from infrastructure.broker.topology import Topology
from infrastructure.redaction import Secrets
from infrastructure.settings.model import Settings, log_secrets
from infrastructure.tls import warn_unverified_database
from worker.logs import printable


def load_settings() -> Settings:
    """The settings from the environment; the global `--i-know-this-is-a-test` counts as
    PROVISIONER_FAKE_GATEWAY=test (the fake allowed on PostgreSQL or RabbitMQ)."""
    settings = Settings.from_env()
    warn_unverified_database(settings.database_url)
    context = click.get_current_context(silent=True)
    if context is not None and context.find_root().params.get("fake_is_test"):
        settings = replace(settings, fake_gateway_test=True)
    return settings


def secrets() -> Secrets:
    """Every configured secret, read from the raw environment: this works when the
    settings themselves are wrong (an error line about them is scrubbed too)."""
    return Secrets(log_secrets())


def shown(text: str) -> str:
    """`text` for the terminal, without any configured secret."""
    return secrets().scrub(text)


def echo(text: str, *, err: bool = False) -> None:
    """`click.echo` of a printable text (`printable`)."""
    click.echo(printable(text), err=err)


class CommandFailed(click.ClickException):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(printable(message))
        self.exit_code = exit_code


def cell(value: Any) -> str:
    """Text for a Rich table cell: whatever came from the wire or a producer, made
    printable and escaped (no markup)."""
    return escape(printable("" if value is None else str(value)))


def jsonable(value: Any) -> Any:
    from datetime import datetime

    return value.isoformat() if isinstance(value, datetime) else str(value)


def service_only(*, read_only: bool = False) -> Any:
    """A service for the request path (no gateway call is made there) on one
    database connection at a time, opened per use. `read_only`: creates nothing."""
    from worker.actions import request_service

    return request_service(load_settings(), read_only=read_only)


def views(*, read_only: bool = True) -> Any:
    """The read models of the configured database, checked to exist (creating nothing)."""
    from infrastructure.views.store import SqlViewStore

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
def declared_broker(
    url: str, topology: Topology, settings: Settings | None = None
) -> Iterator[Broker]:
    """A publisher on the broker (TLS as the settings say), connected and the topology
    declared first, so a one-shot command says at once, in one line, which broker
    failed and why."""
    tls = (settings or load_settings()).broker_tls()
    publisher = Broker(url, topology, scheduler=None, tls=tls)
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


def compact_table(title: str | None, caption: str | None = None) -> Any:
    """A Rich table that spends little width on rules, so that at 80 columns the
    cells get the room: a line under the header, a space between columns; the
    table takes the whole width (titles wrap at it, not at the cells). Columns
    should fold (never cut with "…") what does not fit."""
    from rich import box
    from rich.table import Table

    return Table(
        title=cell(title) if title else None,
        caption=cell(caption) if caption else None,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        title_justify="left",
        caption_justify="left",
        expand=True,
    )


def outcome_sentence(story: dict[str, Any]) -> str:
    """How an ended attempt (an `attempt_story`) ended, as one sentence."""
    ends = ("Promoted", "Failed", "Cancelled", "Superseded")
    end = next((e for e in reversed(story["events"]) if e["type"] in ends), None)
    head = f"attempt {story['attempt_id']} for brand {story['brand_id']}"
    state = story["state"]
    if state == "promoted":
        workspace = end["workspace_id"] if end else None
        return f"{head} promoted: the brand is ready in workspace {workspace}."
    if state == "failed":
        message = story.get("failure_message") or "no message"
        return f"{head} failed ({story.get('failure_reason')}): {message}"
    if state == "cancelled":
        why = end["reason"] if end and end["reason"] else "no reason recorded"
        return f"{head} was cancelled ({why})."
    if state == "superseded":
        by = end["reason"] if end and end["reason"] else "superseded by a newer attempt"
        return f"{head} was {by}, which carries on."
    return f"{head} is {state}."


class TimeParam(click.ParamType[Any]):
    """An ISO 8601 time (UTC unless it says otherwise), `now`, or an age: 30s, 15m, 2h, 7d."""

    name = "TIME"
    _UNITS: ClassVar[dict[str, int]] = {"s": 1, "m": 60, "h": 3600, "d": 86400}

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        from datetime import UTC, datetime, timedelta

        if isinstance(value, datetime):
            return value
        text = str(value).strip()
        now = datetime.now(UTC)
        if text == "now":
            return now
        unit = self._UNITS.get(text[-1:])
        if unit and text[:-1].replace(".", "", 1).isdigit():
            return now - timedelta(seconds=float(text[:-1]) * unit)
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            self.fail(
                f"{text!r} is not a time: use ISO 8601 (2026-11-30T12:00:00Z), "
                "now, or an age such as 15m, 2h, 7d",
                param,
                ctx,
            )
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
