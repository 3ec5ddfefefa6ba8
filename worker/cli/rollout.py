"""`provisioner rollout`: many `provision` commands at once, published on the
broker as a producer publishes them (docs/messaging.md).

`rollout FILE` reads brands from CSV (a header row: brand_id,title,parent) or JSON
lines ({"brand_id": ..., "title": ..., "parent": ...}), skips those the
`brand_workspaces` projection shows ready or pending, and publishes one
`provision` message per remaining brand, each with its own `requested_at`.
`retry --failed` lives in worker/cli/retry.py.

Reading the file is pure (`parse_rollout`, unit-tested); the command only reads
the projections, publishes, and reports. It holds no database connection while
it publishes or waits.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import click

from worker.console import echo, jsonable, load_settings
from worker.publish import partial_sends, plural, provision, publisher, refuse_memory, rows_by
from worker.rollout_input import ROLLOUT_MAX_BYTES, Line, RolloutInput, parse_rollout

__all__ = [
    "Watched",
    "rollout",
    "wait_state",
]

# Where a rollout does nothing: the brand can use its workspace, or an attempt is in flight.
SKIP_STATUSES = frozenset({"ready", "pending"})
SHOWN = 5  # ids named per list in the summary paragraph (JSON has them all)


def _brand_rows(brand_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`brand_workspaces` rows of these brands, on one connection closed at once."""
    from worker.console import views

    with views() as store:
        return {r["brand_id"]: r for r in rows_by(store, "brand_workspaces", "brand_id", brand_ids)}


def _some(items: Sequence[str]) -> str:
    """Ids for a sentence: the first few, and how many more."""
    shown = ", ".join(items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


# --------------------------------------------------------------------------- rollout


@dataclass
class Watched:
    """A brand `--wait` follows: its attempt before the rollout (`before`), or, for a
    brand that was already pending, any attempt (`any_attempt`)."""

    brand_id: str
    before: str | None
    any_attempt: bool = False


def wait_state(item: Watched, row: dict[str, Any] | None) -> str:
    """ready, failed, pending or another status (cancelled, deactivated, none) of a
    watched brand; pending until its command was handled (a new attempt shows)."""
    if row is None or (not item.any_attempt and row["attempt_id"] == item.before):
        return "pending"
    return str(row["status"])


@dataclass
class WaitResult:
    states: dict[str, str]
    rows: dict[str, dict[str, Any]]
    seconds: float
    timed_out: bool


def _wait_states(watch: Sequence[Watched]) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    rows = _brand_rows([w.brand_id for w in watch])
    return {w.brand_id: wait_state(w, rows.get(w.brand_id)) for w in watch}, rows


def _tally(states: dict[str, str]) -> dict[str, int]:
    counts = {"ready": 0, "failed": 0, "pending": 0, "other": 0}
    for state in states.values():
        counts[state if state in counts else "other"] += 1
    return counts


def _counts_line(counts: dict[str, int]) -> str:
    line = f"{counts['ready']} ready, {counts['failed']} failed, {counts['pending']} pending"
    return line + (f", {counts['other']} other" if counts["other"] else "")


def _wait(watch: Sequence[Watched], timeout: float, console: Any) -> WaitResult:
    """Poll `brand_workspaces` (a connection per poll, none between) until no watched
    brand is pending or `timeout`; show the counts as they change."""
    started = time.monotonic()
    deadline, pause = started + timeout, 0.25
    bar = _wait_bar(console, len(watch)) if console.is_terminal else None
    shown: dict[str, int] | None = None
    try:
        while True:
            states, rows = _wait_states(watch)
            counts = _tally(states)
            if bar is not None:
                bar[0].update(
                    bar[1], completed=len(watch) - counts["pending"], counts=_counts_line(counts)
                )
            elif counts != shown:
                echo(f"waiting: {_counts_line(counts)}", err=True)
            shown = counts
            left = deadline - time.monotonic()
            if not counts["pending"] or left <= 0:
                return WaitResult(states, rows, time.monotonic() - started, counts["pending"] > 0)
            time.sleep(min(pause, left))
            pause = min(pause * 1.5, 2.0)
    finally:
        if bar is not None:
            bar[0].stop()


def _wait_bar(console: Any, total: int) -> tuple[Any, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("ended"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
        console=console,
    )
    task = bar.add_task("ended", total=total, counts="")
    bar.start()
    return bar, task


def _send(lines: Sequence[Line], url: str, console: Any) -> list[str]:
    """Publish one `provision` per line, each with its own time; the brands sent."""
    sent: list[str] = []
    if not lines:
        return sent
    step = max(100, len(lines) // 10)
    bar: Any = None
    if console.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        bar = Progress(TextColumn("sent"), BarColumn(), MofNCompleteColumn(), console=console)
    again = "run the file again: brands already started are skipped"
    try:
        with partial_sends(sent, len(lines), again), publisher(url) as broker:
            task = bar.add_task("sent", total=len(lines)) if bar is not None else None
            if bar is not None:
                bar.start()
            for line in lines:
                broker.publish(provision(line.brand_id, line.title, line.parent))
                sent.append(line.brand_id)
                if bar is not None:
                    bar.advance(task)
                elif len(sent) % step == 0 and len(sent) < len(lines):
                    echo(f"sent {len(sent)} of {len(lines)}", err=True)
    finally:
        if bar is not None:
            bar.stop()
    if bar is None:
        echo(f"sent {len(sent)} of {len(lines)}", err=True)
    return sent


def _failures(result: WaitResult) -> dict[str, dict[str, Any]]:
    """The `attempts` rows of the failed brands' current attempts (reason, message)."""
    from worker.console import views

    ids = [str(result.rows[b]["attempt_id"]) for b, s in result.states.items() if s == "failed"]
    if not ids:
        return {}
    with views() as store:
        return {r["attempt_id"]: r for r in rows_by(store, "attempts", "attempt_id", ids)}


def rollout_report(
    name: str,
    parsed: RolloutInput,
    *,
    sent: Sequence[str],
    skipped: Sequence[tuple[Line, str]],
    waited: WaitResult | None,
    failures: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """What `rollout` did, as the object `--json` prints."""
    report: dict[str, Any] = {
        "file": name,
        "format": parsed.format,
        "counts": {
            "lines": len(parsed.lines) + len(parsed.bad),
            "sent": len(sent),
            "skipped": len(skipped),
            "bad": len(parsed.bad),
        },
        "sent": list(sent),
        "skipped": [
            {"line": line.number, "brand_id": line.brand_id, "status": status}
            for line, status in skipped
        ],
        "bad": [{"line": bad.number, "error": bad.error} for bad in parsed.bad],
        "wait": None,
    }
    if waited is not None:
        by: dict[str, list[Any]] = {"ready": [], "failed": [], "pending": [], "other": []}
        for brand_id, state in waited.states.items():
            if state == "failed":
                attempt_id = waited.rows[brand_id]["attempt_id"]
                row = failures.get(str(attempt_id), {})
                by["failed"].append(
                    {
                        "brand_id": brand_id,
                        "attempt_id": attempt_id,
                        "reason": row.get("failure_reason"),
                        "message": row.get("last_error"),
                    }
                )
            elif state in ("ready", "pending"):
                by[state].append(brand_id)
            else:
                by["other"].append({"brand_id": brand_id, "status": state})
        report["counts"] |= {key: len(items) for key, items in by.items()}
        report["wait"] = {"seconds": round(waited.seconds, 1), "timed_out": waited.timed_out, **by}
    return report


def rollout_summary(report: dict[str, Any]) -> str:
    """The report as one paragraph."""
    counts = report["counts"]
    head = f"{report['file']} ({report['format']}, {plural(counts['lines'], 'line')}): "
    parts = [f"{counts['sent']} sent" + (f" ({_some(report['sent'])})" if report["sent"] else "")]
    if report["skipped"]:
        whys = []
        for status, why in (("ready", "already ready"), ("pending", "an attempt in flight")):
            ids = [s["brand_id"] for s in report["skipped"] if s["status"] == status]
            if ids:
                whys.append(f"{len(ids)} {why}: {_some(ids)}")
        parts.append(f"{counts['skipped']} skipped ({'; '.join(whys)})")
    else:
        parts.append("none skipped")
    if report["bad"]:
        numbers = [str(b["line"]) for b in report["bad"]]
        where = "line" if len(numbers) == 1 else "lines"
        parts.append(f"{plural(counts['bad'], 'bad line')} ({where} {_some(numbers)}, not sent)")
    text = head + ", ".join(parts) + "."
    wait = report["wait"]
    if wait is not None and not any(wait[k] for k in ("ready", "failed", "pending", "other")):
        text += " Nothing to wait for."
    elif wait is not None:
        failed = [f"{f['brand_id']}: {f['reason'] or 'failed'}" for f in wait["failed"]]
        other = [f"{o['brand_id']}: {o['status']}" for o in wait["other"]]
        said = [
            f"{len(wait['ready'])} ready",
            f"{len(wait['failed'])} failed" + (f" ({_some(failed)})" if failed else ""),
            f"{len(wait['pending'])} pending"
            + (f" ({_some(wait['pending'])})" if wait["pending"] else ""),
        ]
        if other:
            said.append(f"{len(other)} ended otherwise ({_some(other)})")
        text += f" After {wait['seconds']:.0f}s: {', '.join(said)}."
        if wait["timed_out"]:
            text += (
                " Timed out with brands pending: are the workers, the relay and the "
                "projections running?"
            )
        if failed:
            text += " `provisioner retry --failed` re-requests failed brands."
    if report["bad"]:
        text += " Fix the bad lines and run the file again: what is ready or pending is skipped."
    return text


def _skip_or_send(
    lines: Sequence[Line], rows: dict[str, dict[str, Any]]
) -> tuple[list[Line], list[tuple[Line, str]]]:
    to_send: list[Line] = []
    skipped: list[tuple[Line, str]] = []
    for line in lines:
        row = rows.get(line.brand_id)
        status = row["status"] if row is not None else None
        if status in SKIP_STATUSES:
            skipped.append((line, str(status)))
        else:
            to_send.append(line)
    return to_send, skipped


@click.command()
@click.argument("file", type=click.File("rb"))
@click.option("--wait", is_flag=True, help="Then follow the brands until none is pending.")
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds to wait with --wait.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead.")
def rollout(file: BinaryIO, wait: bool, timeout: float, as_json: bool) -> None:
    """Provision the brands of FILE (`-`: stdin): CSV with a header row
    brand_id,title,parent, or JSON lines with those keys.

    Brands the `brand_workspaces` projection shows ready or pending are skipped, so
    running a file again starts nothing new; every other brand gets a `provision`
    message on the broker, for the workers. A bad line is reported with its number
    and the others go on. A file is read up to 16 MiB: past it the rest is one bad
    line, and the lines before go on. Exit 0 when every line was sent or skipped, 1
    when a line was bad or (with --wait) a brand failed or was still pending.
    """
    url = refuse_memory("rollout")
    given = getattr(file, "name", "-")  # stdin (a pipe, or click's test runner's buffer)
    name = "stdin" if given in ("-", "<stdin>") or not isinstance(given, str) else given
    data, unread_from = read_bounded(file)
    parsed = parse_rollout(data, load_settings().parent_ids, unread_from=unread_from)
    if not as_json:
        for bad in parsed.bad:
            echo(f"line {bad.number}: {bad.error}", err=True)
    rows = _brand_rows([line.brand_id for line in parsed.lines]) if parsed.lines else {}
    to_send, skipped = _skip_or_send(parsed.lines, rows)
    console = _stderr_console()
    sent = _send(to_send, url, console)
    waited, failures = None, {}
    if wait:
        watch = [Watched(line.brand_id, _attempt_of(rows.get(line.brand_id))) for line in to_send]
        watch += [
            Watched(line.brand_id, None, any_attempt=True)
            for line, status in skipped
            if status == "pending"
        ]
        waited = _wait(watch, timeout, console) if watch else WaitResult({}, {}, 0.0, False)
        failures = _failures(waited)
    report = rollout_report(
        name, parsed, sent=sent, skipped=skipped, waited=waited, failures=failures
    )
    if as_json:
        echo(json.dumps(report, indent=2, default=jsonable))
    else:
        echo(rollout_summary(report))
    unfinished = waited is not None and any(s != "ready" for s in waited.states.values())
    sys.exit(1 if parsed.bad or unfinished else 0)


def read_bounded(file: BinaryIO, limit: int = ROLLOUT_MAX_BYTES) -> tuple[bytes, int | None]:
    """The file's whole lines within `limit` bytes, read a line at a time (never more
    than the bound of one line), and the number of the first line left unread, if any."""
    lines: list[bytes] = []
    size = 0
    while line := file.readline(limit - size + 1):
        if size + len(line) > limit:
            return b"".join(lines), len(lines) + 1
        lines.append(line)
        size += len(line)
    return b"".join(lines), None


def _attempt_of(row: dict[str, Any] | None) -> str | None:
    return None if row is None or row["attempt_id"] is None else str(row["attempt_id"])
