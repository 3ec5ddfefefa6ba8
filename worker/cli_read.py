"""The `provisioner` read commands: a brand's story from the event store, attempts
from their projection. They create nothing: no file, folder or table."""

from __future__ import annotations

from typing import Any, ClassVar

import click

from worker.cli_support import cell, jsonable, load_settings, service_only, views


def _print(data: Any, as_json: bool, render: Any) -> None:
    import json

    if as_json:
        click.echo(json.dumps(data, indent=2, default=jsonable))
    else:
        render(data)


def _events_table(story: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=cell(f"attempt {story['attempt_id']}: {story['state']}"))
    for column in ("at", "event", "hop", "workspace", "provenance", "reason"):
        table.add_column(column)
    for e in story["events"]:
        table.add_row(
            cell(e["at"][:23]),
            cell(e["type"]),
            cell(e["hop"]),
            cell(e["workspace_id"]),
            cell(e["provenance"]),
            cell((e["reason"] or "")[:60]),
        )
    return table


def _audit(fetch: Any) -> Any:
    from domain.errors import ProvisionerError

    service = service_only(read_only=True)
    try:
        return fetch(service)
    except ProvisionerError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        service.app.close()


@click.command()
@click.argument("brand_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(brand_id: str, as_json: bool) -> None:
    """The brand's current state and workspace."""
    from infrastructure.audit import brand_status

    data = _audit(lambda service: brand_status(service, brand_id))
    _print(data, as_json, lambda d: click.echo("\n".join(f"{k}: {v}" for k, v in d.items())))


@click.command()
@click.argument("brand_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def history(brand_id: str, as_json: bool) -> None:
    """Every attempt of the brand, oldest first, with its events (from the event store)."""
    from rich.console import Console

    from infrastructure.audit import brand_history

    data = _audit(lambda service: brand_history(service, brand_id))

    def render(stories: list[dict[str, Any]]) -> None:
        console = Console()
        for story in stories:
            console.print(_events_table(story))

    _print(data, as_json, render)


@click.command()
@click.argument("attempt_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def attempt(attempt_id: str, as_json: bool) -> None:
    """One attempt in full."""
    from uuid import UUID

    from rich.console import Console

    from infrastructure.audit import attempt_story

    try:
        parsed = UUID(attempt_id)
    except ValueError:
        raise click.ClickException(f"{attempt_id!r} is not an attempt id (a UUID)") from None
    data = _audit(lambda service: attempt_story(service, parsed))
    _print(data, as_json, lambda d: Console().print(_events_table(d)))


class _Time(click.ParamType[Any]):
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


@click.command()
@click.argument("brand_id")
@click.option("--at", "at", type=_Time(), required=True, help="When (ISO 8601, or an age: 2h).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def pointer(brand_id: str, at: Any, as_json: bool) -> None:
    """The workspace the brand was bound to at a time (replayed from the event store)."""
    from infrastructure.audit import pointer_at

    data = _audit(lambda service: pointer_at(service, brand_id, at))
    _print(data, as_json, lambda d: click.echo("\n".join(f"{k}: {v}" for k, v in d.items())))


ATTEMPT_COLUMNS = ("attempt_id", "brand_id", "state", "hops_used", "candidate_id",
                   "provenance", "started_at", "next_hop_due", "last_error")  # fmt: skip


@click.command()
@click.option(
    "--state",
    type=click.Choice(["pending", "promoted", "failed", "cancelled", "superseded"]),
    help="Only attempts in this state.",
)
@click.option("--stuck", is_flag=True, help="Pending attempts whose next hop is overdue.")
@click.option("--overdue", default=60.0, show_default=True, help="Seconds overdue for --stuck.")
@click.option("--since", type=_Time(), help="Started at or after this time (or age: 1d).")
@click.option("--brand", "brand_id", help="Only this brand's attempts.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def attempts(
    *,
    state: str | None,
    stuck: bool,
    overdue: float,
    since: Any,
    brand_id: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Attempts from the `attempts` projection, newest first (stuck: most overdue first)."""
    from infrastructure.view_queries import list_attempts

    if stuck and state not in (None, "pending"):
        raise click.UsageError("--stuck lists pending attempts; drop --state or use pending")
    with views() as store:
        rows = list_attempts(
            store, state=state, stuck=stuck, overdue_s=overdue, since=since,
            brand_id=brand_id, limit=limit,
        )  # fmt: skip

    def render(found: list[dict[str, Any]]) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{len(found)} attempts")
        for column in ATTEMPT_COLUMNS:
            table.add_column(column)
        for row in found:
            cells = [row[c] for c in ATTEMPT_COLUMNS]
            table.add_row(*(cell(None if v is None else jsonable(v)[:40]) for v in cells))
        Console().print(table)

    _print(rows, as_json, render)


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def projections_status(as_json: bool) -> None:
    """Per projection: position, head of the log, events behind, rows, rebuild."""
    from infrastructure.eventstore import open_event_store
    from infrastructure.views import LogSource

    settings = load_settings()
    with views() as store:
        app = open_event_store(
            settings.database_url, one_shot=True, read_only=True, wait_s=settings.connect_wait_s
        )
        try:
            data = store.status(LogSource(app, store))
        finally:
            app.close()

    def render(report: list[dict[str, Any]]) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table()
        columns = ("projection", "copy", "position", "head", "behind", "rows", "rebuilding")
        for column in columns:
            table.add_column(column, no_wrap=column in ("projection", "copy"))
        for item in report:
            table.add_row(*(cell(item[c]) for c in columns))
        Console().print(table)

    _print(data, as_json, render)
