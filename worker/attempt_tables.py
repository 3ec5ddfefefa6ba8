"""How `provisioner attempts` prints rows of the `attempts` projection: a table that
fits 80 columns, or every field of each row in a block (`--wide`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Group
from rich.padding import Padding
from rich.text import Text

from worker.console import cell, compact_table
from worker.logs import printable

ATTEMPT_COLUMNS = (
    "attempt_id",
    "brand_id",
    "state",
    "hops_used",
    "candidate_id",
    "provenance",
    "started_at",
    "next_hop_due",
    "last_error",
)


def table_value(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "" if value is None else str(value)


def _age(started_at: Any, now: Any) -> str:
    """How long ago, in its largest unit: 42s, 7m, 3h, 12d."""
    if started_at is None:
        return ""
    seconds = max(int((now - started_at).total_seconds()), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _last_error(row: dict[str, Any]) -> Any:
    """What a row shows as its last error: none once promoted (what the gateway said
    while it settled is no error)."""
    return None if row["state"] == "promoted" else row["last_error"]


def attempts_table(found: list[dict[str, Any]]) -> Any:
    """Fits 80 columns: the attempt id whole (to copy), its last error folded under it."""
    now = datetime.now(UTC)
    table = compact_table(f"{len(found)} attempts (`attempt ID` for one in full)")
    table.add_column("attempt / last error", overflow="fold", ratio=1, min_width=36)
    table.add_column("brand", overflow="fold", max_width=16)
    table.add_column("state", no_wrap=True)
    table.add_column("hops", justify="right", no_wrap=True)
    table.add_column("age", justify="right", no_wrap=True)
    for row in found:
        first: Any = Text(printable(str(row["attempt_id"])))
        if _last_error(row):
            error = Text(printable(str(_last_error(row))), style="dim", overflow="fold")
            first = Group(first, Padding(error, (0, 0, 0, 2)))
        table.add_row(
            first,
            cell(row["brand_id"]),
            cell(row["state"]),
            cell(row["hops_used"]),
            cell(_age(row["started_at"], now)),
        )
    return table


def attempt_blocks(found: list[dict[str, Any]]) -> Any:
    """Every field of each attempt, one block each (readable at any width)."""
    table = compact_table(f"{len(found)} attempts")
    table.show_header = False
    table.add_column("field", no_wrap=True, style="bold")
    table.add_column("value", overflow="fold", ratio=1)
    for n, row in enumerate(found):
        if n:
            table.add_row("", "")
        for column in ATTEMPT_COLUMNS:
            value = _last_error(row) if column == "last_error" else row[column]
            table.add_row(column, cell(table_value(value)))
    return table
