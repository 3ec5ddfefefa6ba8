"""The `provisioner` read commands: a brand's story from the event store, attempts
from their projection. They create nothing: no file, folder or table."""

from __future__ import annotations

from typing import Any

import click

from domain.policies import FailureReason
from worker.console import (
    TimeParam,
    cell,
    compact_table,
    echo,
    jsonable,
    load_settings,
    secrets,
    service_only,
    views,
)


def _print(data: Any, as_json: bool, render: Any) -> None:
    """JSON or the rendered text, without any configured secret: a title or a message
    may hold one, and Rich may fold it across lines (so the data is scrubbed first)."""
    import json

    data = secrets().scrub_value(data)
    if as_json:
        echo(json.dumps(data, indent=2, default=jsonable))
    else:
        render(data)


def _when(at: str, day: str) -> str:
    """An event's time: to the millisecond, with its date only when not `day`."""
    clock = at[11:23]
    return clock if at[:10] == day else f"{at[:10]} {clock}"


def _detail(e: dict[str, Any]) -> str:
    """What an event says beyond its type, in one phrase: the workspace (and how it
    came), the reason, the message."""
    parts = []
    if e.get("workspace_id"):
        how = f" ({e['provenance']})" if e.get("provenance") else ""
        parts.append(f"{e['workspace_id']}{how}")
    words = [w for w in (e.get("reason"), e.get("message")) if w]
    if words:
        parts.append(": ".join(dict.fromkeys(words)))
    return "; ".join(parts)


def _events_table(story: dict[str, Any]) -> Any:
    day = story["events"][0]["at"][:10] if story["events"] else ""
    state = story["state"]
    if story.get("failure_reason"):
        state = f"{state} ({story['failure_reason']})"
    if "settle_hops" in story:
        state += f"; settle hops {story['settle_hops']} of {story['max_hop']}"
        if story.get("deferrals"):
            state += f", {story['deferrals']} deferred (the gateway did not answer)"
    table = compact_table(
        f"attempt {story['attempt_id']} of brand {story['brand_id']}: {state}",
        caption=f"times UTC on {day}" if day else None,
    )
    table.add_column("at", no_wrap=True)
    table.add_column("event", overflow="fold")
    table.add_column("hop", justify="right", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=1)
    for e in story["events"]:
        hop = e.get("hop")
        table.add_row(
            cell(_when(e["at"], day)),
            cell(e["type"]),
            cell("" if hop is None else hop),
            cell(_detail(e)),
        )
    return table


def _failure_line(story: dict[str, Any]) -> str | None:
    if not story.get("failure_reason"):
        return None
    message = story.get("failure_message") or "(no message)"
    return f"failed ({story['failure_reason']}): {message}"


def _brand_table(brand_id: str, items: list[dict[str, Any]]) -> Any:
    table = compact_table(f"brand {brand_id}", caption=None)
    table.add_column("at (UTC)", no_wrap=True)
    table.add_column("event", overflow="fold")
    table.add_column("detail", overflow="fold", ratio=1)
    for e in items:
        # An attempt id here is the attempt shown just above (the one that bound the
        # workspace, or the pending one serving a repeated provision).
        served = "served by the pending attempt" if e["type"] == "ProvisionNoted" else None
        detail = "; ".join(w for w in (e.get("workspace_id"), e.get("reason"), served) if w)
        table.add_row(cell(_when(e["at"], "")), cell(e["type"]), cell(detail))
    return table


def _record(data: dict[str, Any]) -> None:
    """One record, a field a line, the values aligned and folded at the terminal's
    width; a missing value reads `none`."""
    from rich.console import Console
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in data.items():
        grid.add_row(cell(f"{key}:"), cell("none" if value is None else value))
    Console().print(grid)


def _audit(fetch: Any) -> Any:
    from domain.errors import ProvisionerError

    service = service_only(read_only=True)
    try:
        return fetch(service)
    except ProvisionerError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        service.app.close()


def _status(service: Any, brand_id: str) -> dict[str, Any]:
    """The brand's status, and its current attempt's "why, and what next?"."""
    from datetime import UTC, datetime
    from uuid import UUID

    from infrastructure.views.audit import brand_status
    from worker.attempt_progress import brand_facts, fleet, progress_fields

    data = brand_status(service, brand_id)
    attempt = service.attempt(UUID(data["attempt_id"])) if data.get("attempt_id") else None
    settings, now = load_settings(), datetime.now(UTC)
    deployment = fleet(settings.database_url, settings.heartbeat_max_age_s, now)
    said = progress_fields(
        attempt,
        service.settings,
        now,
        settings.parent_ids,
        brand=brand_facts(service.brand(brand_id)),
        deployment=deployment,
    )
    # The reason and its advice right under the status; the attempt's figures after it.
    ordered: dict[str, Any] = {}
    for key, value in data.items():
        ordered[key] = value
        if key == "status":
            ordered.update(reason=said.pop("reason"), advice=said.pop("advice"))
    return {**ordered, **said}


def _status_record(data: dict[str, Any]) -> None:
    """The record; of the attempt's figures, those it has (the JSON has them all)."""
    from worker.attempt_progress import FIELDS
    from worker.attempt_tables import table_value

    hidden = (*FIELDS, "to_be_emptied_at", "emptying_refused")  # shown only when it has a value
    shown = {k: v for k, v in data.items() if k not in hidden or v is not None}
    if shown.get("emptying_refused") is not None:
        shown["emptying_refused"] = (
            f"{shown['emptying_refused']} (the workspace is kept, not retried: fix it upstream, "
            f"then `provisioner deactivate {data['brand_id']} --purge-now`)"
        )
    _record({k: table_value(v) if v is not None else None for k, v in shown.items()})


@click.command()
@click.argument("brand_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(brand_id: str, as_json: bool) -> None:
    """The brand's current state and workspace; its current attempt: why it is where it
    is and what comes next (its hop, budget, next hop, deferrals, or its failure's
    reason and what to do)."""
    data = _audit(lambda service: _status(service, brand_id))
    _print(data, as_json, _status_record)


@click.command()
@click.argument("brand_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def history(brand_id: str, as_json: bool) -> None:
    """The brand's story from the event store, oldest first: its own events (registered,
    deactivated, unbound, ignored commands...) and, where it began each, an attempt
    with all its events."""
    from rich.console import Console

    from infrastructure.views.audit import brand_history

    data = _audit(lambda service: brand_history(service, brand_id))

    def render(items: list[dict[str, Any]]) -> None:
        console = Console()
        run: list[dict[str, Any]] = []
        for item in [*items, None]:
            if item is not None and item["kind"] == "brand":
                run.append(item)
                continue
            if run:
                console.print(_brand_table(brand_id, run))
                console.print()
                run = []
            if item is not None:
                console.print(_events_table(item))
                failure = _failure_line(item)
                if failure:
                    console.print(cell(failure))
                console.print()

    _print(data, as_json, render)


@click.command()
@click.argument("attempt_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def attempt(attempt_id: str, as_json: bool) -> None:
    """One attempt in full: every event, and why it failed if it did."""
    from uuid import UUID

    from rich.console import Console

    from infrastructure.views.audit import attempt_story

    try:
        parsed = UUID(attempt_id)
    except ValueError:
        parsed = _by_prefix(attempt_id)
    data = _audit(lambda service: attempt_story(service, parsed))

    def render(story: dict[str, Any]) -> None:
        console = Console()
        console.print(_events_table(story))
        failure = _failure_line(story)
        if failure:
            console.print(cell(failure))

    _print(data, as_json, render)


def _by_prefix(prefix: str) -> Any:
    """The one attempt whose id starts with `prefix` (at least 4 hex digits), as
    `dead-letters` takes a letter's: from the `attempts` read model."""
    import re
    from uuid import UUID

    from infrastructure.views.store import PROJECTIONS
    from worker.console import views

    text = prefix.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{4}[0-9a-f-]{0,31}", text):
        raise click.ClickException(
            f"{prefix!r} is not an attempt id (a UUID, or its first 4 or more hex digits)"
        )
    store = views()
    try:
        rows = store.rows(PROJECTIONS["attempts"], "attempt_id LIKE ?", [f"{text}%"], limit=2)
    finally:
        store.close()
    if len(rows) != 1:
        what = "no attempt" if not rows else "more than one attempt"
        raise click.ClickException(f"{what} has an id starting with {text!r}")
    return UUID(rows[0]["attempt_id"])


@click.command()
@click.argument("brand_id")
@click.option("--at", "at", type=TimeParam(), required=True, help="When (ISO 8601, or an age: 2h).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def pointer(brand_id: str, at: Any, as_json: bool) -> None:
    """The workspace the brand was bound to at a time (replayed from the event store)."""
    from infrastructure.views.audit import pointer_at

    data = _audit(lambda service: pointer_at(service, brand_id, at))
    _print(data, as_json, _record)


@click.command()
@click.option(
    "--state",
    type=click.Choice(["pending", "promoted", "failed", "cancelled", "superseded"]),
    help="Only attempts in this state.",
)
@click.option("--stuck", is_flag=True, help="Pending attempts whose next hop is overdue.")
@click.option("--overdue", default=60.0, show_default=True, help="Seconds overdue for --stuck.")
@click.option("--since", type=TimeParam(), help="Started at or after this time (or age: 1d).")
@click.option("--brand", "brand_id", help="Only this brand's attempts.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--wide", is_flag=True, help="Every field of each attempt, one block each.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def attempts(
    *,
    wide: bool,
    state: str | None,
    stuck: bool,
    overdue: float,
    since: Any,
    brand_id: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Attempts from the `attempts` projection, newest first (stuck: most overdue first)."""
    from infrastructure.views.queries import list_attempts

    if stuck and state not in (None, "pending"):
        raise click.UsageError("--stuck lists pending attempts; drop --state or use pending")
    with views() as store:
        rows = list_attempts(
            store,
            state=state,
            stuck=stuck,
            overdue_s=overdue,
            since=since,
            brand_id=brand_id,
            limit=limit,
        )

    def render(found: list[dict[str, Any]]) -> None:
        from rich.console import Console

        from worker.attempt_tables import attempt_blocks, attempts_table

        Console().print(attempt_blocks(found) if wide else attempts_table(found))

    _print(rows, as_json, render)


BRAND_STATUSES = ("ready", "degraded", "pending", "failed", "cancelled", "none", "deactivated")


@click.command()
@click.option("--status", type=click.Choice(BRAND_STATUSES), help="Only brands in this status.")
@click.option(
    "--reason",
    type=click.Choice([r.value for r in FailureReason]),
    help="Only brands whose current attempt failed for this reason.",
)
@click.option("--after", metavar="BRAND", help="Start after this brand id (the next page).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def brands(
    *, status: str | None, reason: str | None, after: str | None, limit: int, as_json: bool
) -> None:
    """Brands from the `brand_workspaces` read model, by id: each one's status, its
    workspace, and its current attempt's state and failure reason."""
    from infrastructure.views.queries import list_brands

    with views() as store:
        rows = list_brands(store, status=status, reason=reason, after=after, limit=limit)
    shown = ("brand_id", "title", "status", "workspace_id", "attempt_state", "failure_reason")

    def render(found: list[dict[str, Any]]) -> None:
        from rich.console import Console

        more = f"; next page: --after {found[-1]['brand_id']}" if len(found) == limit else ""
        table = compact_table(None, f"{len(found)} brands{more}")
        for column in shown:
            table.add_column(column.replace("_", " "), overflow="fold")
        for row in found:
            table.add_row(*(cell(row.get(column)) for column in shown))
        Console().print(table)

    _print(
        [{k: r.get(k) for k in (*shown, "lifecycle", "attempt_id")} for r in rows], as_json, render
    )


NUMBERS = ("position", "behind", "rows")
PROJECTION_COLUMNS_EXPLAINED = (
    "copy: the table readers use now. position: the last event of the log it has "
    "applied (the head: the newest event). behind: events of its kinds it still has "
    "to apply (0: up to date). rows: rows readers see. "
    "rebuilding: the copy `projections rebuild` is filling, if any; readers move "
    "to it when it has caught up."
)


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def projections_status(as_json: bool) -> None:
    """Per projection: the copy readers use, its position in the event log, the log's
    head, the events it is behind, its rows, and a rebuild under way (explained below
    the table)."""
    from infrastructure.store.eventstore import open_event_store
    from infrastructure.views.log_source import LogSource

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

        head = report[0]["head"] if report else 0
        table = compact_table(
            f"read models; the event log's head is at {head}", caption=PROJECTION_COLUMNS_EXPLAINED
        )
        columns = ("projection", "copy", "position", "behind", "rows", "rebuilding")
        for column in columns:
            table.add_column(
                column,
                overflow="fold",
                no_wrap=column != "rebuilding",
                justify="right" if column in NUMBERS else "left",
            )
        for item in report:
            table.add_row(*(cell("" if item[c] is None else item[c]) for c in columns))
        Console().print(table)

    _print(data, as_json, render)
