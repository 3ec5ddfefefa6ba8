"""`provisioner rollout` and `provisioner retry`: many `provision` commands at once,
published on the broker as a producer publishes them (docs/messaging.md).

`rollout FILE` reads brands from CSV (a header row: brand_id,title,parent) or JSON
lines ({"brand_id": ..., "title": ..., "parent": ...}), skips those the
`brand_workspaces` projection shows ready or pending, and publishes one
`provision` message per remaining brand, each with its own `requested_at`.
`retry --failed` re-requests brands whose current attempt failed, with that
attempt's title and parent (read from the event store).

Reading the file is pure (`parse_rollout`, unit-tested); the commands only read
the projections, publish, and report. Neither holds a database connection while
it publishes or waits.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, BinaryIO

import click

from domain.policies import FailureReason
from worker.cli_read import _Time
from worker.cli_support import Failed, echo, jsonable, load_settings
from worker.rollout_input import BadLine, Line, RolloutInput, checked_line, parse_rollout

# Where a rollout does nothing: the brand can use its workspace, or an attempt is in flight.
SKIP_STATUSES = frozenset({"ready", "pending"})
IN_CHUNK = 500  # ids per `IN (...)` query (well under SQLite's limit on parameters)
SHOWN = 5  # ids named per list in the summary paragraph (JSON has them all)


# --------------------------------------------------------------------------- shared


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), IN_CHUNK):
        yield items[start : start + IN_CHUNK]


def _rows_by(store: Any, name: str, column: str, values: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of projection `name` whose `column` is one of `values` (chunked queries)."""
    from infrastructure.views import PROJECTIONS

    found: list[dict[str, Any]] = []
    for chunk in _chunks(list(dict.fromkeys(values))):
        marks = ", ".join("?" * len(chunk))
        found += store.rows(PROJECTIONS[name], f"{column} IN ({marks})", list(chunk))
    return found


def _brand_rows(brand_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`brand_workspaces` rows of these brands, on one connection closed at once."""
    from worker.cli_support import views

    with views() as store:
        return {
            r["brand_id"]: r for r in _rows_by(store, "brand_workspaces", "brand_id", brand_ids)
        }


def _refuse_memory(command: str) -> str:
    """The broker URL to publish on; memory:// would reach no worker (exit 3)."""
    from infrastructure.broker import is_memory
    from infrastructure.failures import ConfigurationError

    url = load_settings().broker_url
    if is_memory(url):
        raise ConfigurationError(
            f"`{command}` publishes to the workers' broker, and memory:// is in-process "
            "(no worker would see the messages): set PROVISIONER_BROKER_URL=amqp://... to "
            "the broker your workers consume"
        )
    return url


def _publisher(url: str) -> Any:
    from infrastructure.broker import Topology
    from worker.cli_support import declared_broker

    return declared_broker(url, Topology(queue_type=load_settings().queue_type))


def _provision(brand_id: str, title: str, parent: str) -> Any:
    from infrastructure import messages

    return messages.provision(brand_id, title, parent, datetime.now(UTC))


def _failed_while(sent: int, total: int, exc: Exception, again: str) -> Failed:
    """A publish that failed part-way, as one line: the failure, and what was sent."""
    from worker.edges import describe

    failure = describe(exc)
    return Failed(f"{failure} ({sent} of {total} sent before that; {again})", failure.exit_code)


def _debug() -> bool:
    return bool(click.get_current_context().find_root().params.get("debug"))


def _some(items: Sequence[str]) -> str:
    """Ids for a sentence: the first few, and how many more."""
    shown = ", ".join(items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _utc(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "?" if value is None else str(value)


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
                bar[0].update(bar[1], completed=len(watch) - counts["pending"],
                              counts=_counts_line(counts))  # fmt: skip
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

    bar = Progress(TextColumn("ended"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[counts]}"), TimeElapsedColumn(),
                   console=console)  # fmt: skip
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
    try:
        with _publisher(url) as broker:
            task = bar.add_task("sent", total=len(lines)) if bar is not None else None
            if bar is not None:
                bar.start()
            for line in lines:
                broker.publish(_provision(line.brand_id, line.title, line.parent))
                sent.append(line.brand_id)
                if bar is not None:
                    bar.advance(task)
                elif len(sent) % step == 0 and len(sent) < len(lines):
                    echo(f"sent {len(sent)} of {len(lines)}", err=True)
    except Exception as exc:
        if _debug() or not sent:  # nothing sent: the failure says it all
            raise
        raise _failed_while(
            len(sent), len(lines), exc, "run the file again: brands already started are skipped"
        ) from None
    finally:
        if bar is not None:
            bar.stop()
    if bar is None:
        echo(f"sent {len(sent)} of {len(lines)}", err=True)
    return sent


def _failures(result: WaitResult) -> dict[str, dict[str, Any]]:
    """The `attempts` rows of the failed brands' current attempts (reason, message)."""
    from worker.cli_support import views

    ids = [str(result.rows[b]["attempt_id"]) for b, s in result.states.items() if s == "failed"]
    if not ids:
        return {}
    with views() as store:
        return {r["attempt_id"]: r for r in _rows_by(store, "attempts", "attempt_id", ids)}


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
                by["failed"].append({
                    "brand_id": brand_id, "attempt_id": attempt_id,
                    "reason": row.get("failure_reason"), "message": row.get("last_error"),
                })  # fmt: skip
            elif state in ("ready", "pending"):
                by[state].append(brand_id)
            else:
                by["other"].append({"brand_id": brand_id, "status": state})
        report["counts"] |= {key: len(items) for key, items in by.items()}
        report["wait"] = {
            "seconds": round(waited.seconds, 1), "timed_out": waited.timed_out, **by
        }  # fmt: skip
    return report


def rollout_summary(report: dict[str, Any]) -> str:
    """The report as one paragraph."""
    counts = report["counts"]
    head = f"{report['file']} ({report['format']}, {_plural(counts['lines'], 'line')}): "
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
        parts.append(f"{_plural(counts['bad'], 'bad line')} ({where} {_some(numbers)}, not sent)")
    text = head + ", ".join(parts) + "."
    wait = report["wait"]
    if wait is not None and not any(wait[k] for k in ("ready", "failed", "pending", "other")):
        text += " Nothing to wait for."
    elif wait is not None:
        failed = [f"{f['brand_id']}: {f['reason'] or 'failed'}" for f in wait["failed"]]
        other = [f"{o['brand_id']}: {o['status']}" for o in wait["other"]]
        said = [f"{len(wait['ready'])} ready",
                f"{len(wait['failed'])} failed" + (f" ({_some(failed)})" if failed else ""),
                f"{len(wait['pending'])} pending" + (
                    f" ({_some(wait['pending'])})" if wait["pending"] else "")]  # fmt: skip
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
    and the others go on. Exit 0 when every line was sent or skipped, 1 when a line
    was bad or (with --wait) a brand failed or was still pending.
    """
    url = _refuse_memory("rollout")
    given = getattr(file, "name", "-")  # stdin (a pipe, or click's test runner's buffer)
    name = "stdin" if given in ("-", "<stdin>") or not isinstance(given, str) else given
    parsed = parse_rollout(file.read())
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
        watch += [Watched(line.brand_id, None, any_attempt=True)
                  for line, status in skipped if status == "pending"]  # fmt: skip
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


def _attempt_of(row: dict[str, Any] | None) -> str | None:
    return None if row is None or row["attempt_id"] is None else str(row["attempt_id"])


# --------------------------------------------------------------------------- retry


@dataclass(frozen=True, slots=True)
class Redrive:
    """A brand to re-request: its failed current attempt, and that attempt's title and
    parent (None when the event store did not have them)."""

    brand_id: str
    attempt_id: str
    failure_reason: str | None
    finished_at: Any
    title: str | None = None
    parent: str | None = None
    error: str | None = None


def failed_attempts(
    store: Any, *, reason: str | None, since: datetime | None, brand_ids: Sequence[str]
) -> list[dict[str, Any]]:
    """Failed attempts of the `attempts` projection, newest end first: by failure
    reason, finished at or after `since`, of these brands (all when empty)."""
    from infrastructure.views import PROJECTIONS
    from projections.core import TS

    where, params = ["state = 'failed'"], []
    if reason is not None:
        where.append("failure_reason = ?")
        params.append(reason)
    if since is not None:
        where.append("finished_at >= ?")
        params.append(store.dialect.to_db(TS, since))
    if not brand_ids:
        return list(store.rows(PROJECTIONS["attempts"], " AND ".join(where), params,
                               order="finished_at DESC"))  # fmt: skip
    found: list[dict[str, Any]] = []
    for chunk in _chunks(list(dict.fromkeys(brand_ids))):
        clause = " AND ".join([*where, f"brand_id IN ({', '.join('?' * len(chunk))})"])
        found += store.rows(PROJECTIONS["attempts"], clause, [*params, *chunk])
    return sorted(found, key=lambda r: r["finished_at"], reverse=True)


def choose(
    attempts: Iterable[dict[str, Any]], brands: dict[str, dict[str, Any]]
) -> tuple[list[Redrive], list[dict[str, Any]]]:
    """Of the brands with a selected failed attempt, those whose current state is still
    failed, by that attempt (to re-request); the others with their status (skipped)."""
    selected: dict[str, list[dict[str, Any]]] = {}
    for row in attempts:
        selected.setdefault(row["brand_id"], []).append(row)
    chosen: list[Redrive] = []
    skipped: list[dict[str, Any]] = []
    for brand_id, rows in selected.items():
        current = brands.get(brand_id)
        status = current["status"] if current is not None else "unknown"
        mine = next((r for r in rows if current and r["attempt_id"] == current["attempt_id"]), None)
        if status == "failed" and mine is not None:
            chosen.append(Redrive(brand_id, mine["attempt_id"], mine["failure_reason"],
                                  mine["finished_at"]))  # fmt: skip
        else:
            why = status if status != "failed" else "its latest failure not selected"
            skipped.append({"brand_id": brand_id, "status": status, "why": why,
                            "attempt_id": current["attempt_id"] if current else None})  # fmt: skip
    return chosen, skipped


def _with_title_and_parent(chosen: Sequence[Redrive]) -> list[Redrive]:
    """Each failed attempt's title and parent, replayed from the event store (the
    `attempts` projection does not keep the parent), one connection at a time."""
    from dataclasses import replace
    from uuid import UUID

    from domain.attempt import ProvisioningAttempt
    from worker.cli_support import service_only

    service = service_only(read_only=True)
    done: list[Redrive] = []
    try:
        for start in range(0, len(chosen), IN_CHUNK):
            part = chosen[start : start + IN_CHUNK]
            loaded = service.load(*(UUID(r.attempt_id) for r in part))
            for redrive, attempt in zip(part, loaded, strict=True):
                if isinstance(attempt, ProvisioningAttempt):
                    done.append(replace(redrive, title=attempt.title,
                                        parent=attempt.parent_workspace_id))  # fmt: skip
                else:
                    done.append(replace(redrive, error="attempt not in the event store"))
    finally:
        service.app.close()
    return done


def _checked(redrive: Redrive) -> Redrive:
    """`redrive`, or with the reason the message schema refuses its values."""
    from dataclasses import replace

    if redrive.error is not None or redrive.title is None or redrive.parent is None:
        return redrive
    line = checked_line(0, {"brand_id": redrive.brand_id, "title": redrive.title,
                     "parent": redrive.parent})  # fmt: skip
    return replace(redrive, error=line.error) if isinstance(line, BadLine) else redrive


def _redrive_line(redrive: Redrive, verb: str) -> str:
    failed = f"attempt {redrive.attempt_id} failed {redrive.failure_reason or ''}".rstrip()
    if redrive.error is not None:
        return f"not re-requested {redrive.brand_id}: {redrive.error} ({failed})"
    return (
        f"{verb} {redrive.brand_id}: {redrive.title!r} under {redrive.parent} "
        f"({failed} at {_utc(redrive.finished_at)})"
    )


def _retry_counts(done: Sequence[Redrive], skipped: Sequence[dict[str, Any]], dry_run: bool) -> str:
    good = sum(1 for r in done if r.error is None)
    line = (f"dry run: {_plural(good, 'brand')} would be re-requested, nothing was published"
            if dry_run else f"{_plural(good, 'brand')} re-requested")  # fmt: skip
    bad = len(done) - good
    if bad:
        line += f"; {bad} could not be (see above)"
    if skipped:
        by: dict[str, int] = {}
        for s in skipped:
            by[s["why"]] = by.get(s["why"], 0) + 1
        said = ", ".join(f"{n} {why}" for why, n in sorted(by.items()))
        line += f"; {len(skipped)} skipped, failed before but not now ({said})"
    return line


@click.command()
@click.option("--failed", is_flag=True, help="Brands whose current attempt failed (required).")
@click.option(
    "--reason",
    type=click.Choice([reason.value for reason in FailureReason]),
    help="Only attempts that failed for this reason.",
)
@click.option("--since", type=_Time(), help="Only attempts that ended at or after this time.")
@click.option("--brand", "brand_ids", multiple=True, help="Only this brand (repeatable).")
@click.option("--dry-run", is_flag=True, help="List what would be re-requested; publish nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead.")
def retry(
    *,
    failed: bool,
    reason: str | None,
    since: datetime | None,
    brand_ids: tuple[str, ...],
    dry_run: bool,
    as_json: bool,
) -> None:
    """Re-request brands whose current attempt failed: one `provision` each, with that
    attempt's title and parent and a fresh time.

    Reads the `attempts` projection for failed attempts (filtered by --reason, --since,
    --brand) and keeps the brands that `brand_workspaces` still shows failed (not
    ready, pending or deactivated). Exit 1 if a brand could not be re-requested.
    """
    if not failed:
        raise click.UsageError("say what to retry: --failed (the only selector for now)")
    url = None if dry_run else _refuse_memory("retry")
    from worker.cli_support import views

    with views() as store:
        attempts = failed_attempts(store, reason=reason, since=since, brand_ids=brand_ids)
        brands = {
            r["brand_id"]: r
            for r in _rows_by(
                store, "brand_workspaces", "brand_id", [a["brand_id"] for a in attempts]
            )
        }
    chosen, skipped = choose(attempts, brands)
    done = [_checked(r) for r in _with_title_and_parent(chosen)] if chosen else []
    sendable = [r for r in done if r.error is None]
    if url is not None and sendable:
        _publish_redrives(sendable, url)
    if as_json:
        echo(json.dumps(_retry_report(done, skipped, dry_run), indent=2, default=jsonable))
    else:
        verb = "would re-request" if dry_run else "re-requested"
        for redrive in done:
            echo(_redrive_line(redrive, verb))
        echo(_retry_counts(done, skipped, dry_run))
    sys.exit(1 if len(sendable) < len(done) else 0)


def _publish_redrives(redrives: Sequence[Redrive], url: str) -> None:
    sends = [(r.brand_id, r.title, r.parent) for r in redrives if r.title and r.parent]
    sent = 0
    try:
        with _publisher(url) as broker:
            for brand_id, title, parent in sends:
                broker.publish(_provision(brand_id, title, parent))
                sent += 1
    except Exception as exc:
        if _debug() or not sent:  # nothing sent: the failure says it all
            raise
        raise _failed_while(sent, len(sends), exc, "run it again for the rest") from None


def _retry_report(
    done: Sequence[Redrive], skipped: Sequence[dict[str, Any]], dry_run: bool
) -> dict[str, Any]:
    def item(r: Redrive) -> dict[str, Any]:
        return {"brand_id": r.brand_id, "title": r.title, "parent": r.parent,
                "failed_attempt_id": r.attempt_id, "failure_reason": r.failure_reason,
                "finished_at": r.finished_at}  # fmt: skip

    good = [item(r) for r in done if r.error is None]
    refused = [item(r) | {"error": r.error} for r in done if r.error is not None]
    return {
        "dry_run": dry_run,
        "published": not dry_run and bool(good),
        "counts": {"re_requested": len(good), "refused": len(refused), "skipped": len(skipped)},
        "re_requested": good,
        "refused": refused,
        "skipped": list(skipped),
    }
