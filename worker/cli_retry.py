"""`provisioner retry --failed`: re-requests brands whose current attempt failed,
with that attempt's title and parent (read from the event store), published on
the broker as a producer publishes them (docs/messaging.md). It reads the
projections, publishes, and reports; it holds no database connection while it
publishes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click

from domain.policies import FailureReason
from worker.cli_publish import (
    IN_CHUNK,
    chunks,
    partial_sends,
    plural,
    provision,
    publisher,
    refuse_memory,
    rows_by,
)
from worker.cli_read import _Time
from worker.cli_support import echo, jsonable
from worker.rollout_input import BadLine, checked_line


def _utc(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "?" if value is None else str(value)


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
    for chunk in chunks(list(dict.fromkeys(brand_ids))):
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
    line = (f"dry run: {plural(good, 'brand')} would be re-requested, nothing was published"
            if dry_run else f"{plural(good, 'brand')} re-requested")  # fmt: skip
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
    url = None if dry_run else refuse_memory("retry")
    from worker.cli_support import views

    with views() as store:
        attempts = failed_attempts(store, reason=reason, since=since, brand_ids=brand_ids)
        brands = {
            r["brand_id"]: r
            for r in rows_by(
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
    sent: list[str] = []
    with partial_sends(sent, len(sends), "run it again for the rest"), publisher(url) as broker:
        for brand_id, title, parent in sends:
            broker.publish(provision(brand_id, title, parent))
            sent.append(brand_id)


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
