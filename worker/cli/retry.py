"""`provisioner retry --failed`: re-requests brands whose current attempt failed,
with that attempt's title and parent, published on the broker as a producer
publishes them (worker/redrive.py, which the web view's retry form calls too), and
reports what it did.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import click

from domain.policies import FailureReason
from worker.console import TimeParam, echo, jsonable, load_settings
from worker.publish import partial_sends, plural, refuse_memory
from worker.redrive import Redrive, publish, redrive_line, select

__all__ = [
    "retry",
]


def _retry_counts(done: Sequence[Redrive], skipped: Sequence[dict[str, Any]], dry_run: bool) -> str:
    good = sum(1 for r in done if r.error is None)
    line = (
        f"dry run: {plural(good, 'brand')} would be re-requested, nothing was published"
        if dry_run
        else f"{plural(good, 'brand')} re-requested"
    )
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
@click.option("--since", type=TimeParam(), help="Only attempts that ended at or after this time.")
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
    settings = load_settings()
    url = None if dry_run else refuse_memory("retry", settings)
    done, skipped = select(settings, reason=reason, since=since, brand_ids=brand_ids)
    sendable = [r for r in done if r.error is None]
    if url is not None and sendable:
        sent: list[str] = []
        with partial_sends(sent, len(sendable), "run it again for the rest"):
            publish(settings, sendable, url, sent)
    if as_json:
        echo(json.dumps(_retry_report(done, skipped, dry_run), indent=2, default=jsonable))
    else:
        verb = "would re-request" if dry_run else "re-requested"
        for redrive in done:
            echo(redrive_line(redrive, verb))
        echo(_retry_counts(done, skipped, dry_run))
    sys.exit(1 if len(sendable) < len(done) else 0)


def _retry_report(
    done: Sequence[Redrive], skipped: Sequence[dict[str, Any]], dry_run: bool
) -> dict[str, Any]:
    def item(r: Redrive) -> dict[str, Any]:
        return {
            "brand_id": r.brand_id,
            "title": r.title,
            "parent": r.parent,
            "failed_attempt_id": r.attempt_id,
            "failure_reason": r.failure_reason,
            "finished_at": r.finished_at,
        }

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
