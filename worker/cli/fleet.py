"""`provisioner workers`: each process of the deployment and each part it runs, from
their heartbeats, alive or silent as the health checks judge them."""

from __future__ import annotations

from typing import Any

import click

from worker.console import cell, compact_table, echo, load_settings


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def workers(as_json: bool) -> None:
    """Each process of the deployment and each part it runs (worker, relay, projections,
    reconciler): host:pid, version, deliveries in flight of its threads, handled, its
    last beat, and alive or silent (its beat older than PROVISIONER_HEARTBEAT_MAX_AGE_S);
    --json has every field apart."""
    import json

    from worker.fleet import read_fleet

    settings = load_settings()
    if settings.database_url.startswith("memory:"):
        raise click.ClickException(
            "memory:// keeps the beats in its one process: its /readyz and the web view "
            "of that process show them"
        )
    rows = read_fleet(
        settings.database_url, settings.heartbeat_max_age_s, wait_s=settings.connect_wait_s
    )
    if as_json:
        echo(json.dumps(rows, indent=2))
        return
    _table(rows, settings.heartbeat_max_age_s)


# At 80 columns: host and pid as one "process" (host:pid), and in flight of the threads.
HEADERS = (
    ("kind", "kind"),
    ("process", "process"),
    ("version", "version"),
    ("in_flight", "in flight"),
    ("handled", "handled"),
    ("last_beat_s", "beat ago"),
    ("state", "state"),
)


def _shown(row: dict[str, Any], key: str) -> str:
    from worker.fleet import ago

    if key == "last_beat_s":
        return ago(row[key])
    if key == "in_flight" and row["concurrency"] is not None:
        return f"{row['in_flight'] or 0}/{row['concurrency']}"
    return "" if row[key] is None else str(row[key])


def _table(rows: list[dict[str, Any]], max_age_s: float) -> None:
    from rich.console import Console

    alive = sum(1 for r in rows if r["state"] == "alive")
    caption = (
        f"{alive} of {len(rows)} alive; silent: no beat for more than {max_age_s:g} s "
        "(PROVISIONER_HEARTBEAT_MAX_AGE_S); in flight: deliveries/threads"
    )
    if not rows:
        caption = "no process has beaten in this database yet"
    table = compact_table(None, caption)
    for key, header in HEADERS:
        numeric = key in ("in_flight", "handled", "last_beat_s")
        table.add_column(
            header,
            justify="right" if numeric else "left",
            overflow="fold",
            no_wrap=key != "process",
        )
    for row in rows:
        table.add_row(*(cell(_shown(row, key)) for key, _ in HEADERS))
    Console().print(table)
