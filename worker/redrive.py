"""Re-requesting brands whose current attempt failed, with that attempt's title and
parent (read from the event store), published on the broker as a producer publishes
them (docs/messaging.md): what `provisioner retry --failed` and the web view's retry
form both do. It reads the projections, then publishes, holding no database
connection while it publishes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from infrastructure.settings.model import Settings
from worker.publish import IN_CHUNK, chunks, provision, publisher, rows_by
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
    from infrastructure.views.store import PROJECTIONS
    from projections.core import TS

    where, params = ["state = 'failed'"], []
    if reason is not None:
        where.append("failure_reason = ?")
        params.append(reason)
    if since is not None:
        where.append("finished_at >= ?")
        params.append(store.dialect.to_db(TS, since))
    if not brand_ids:
        return list(
            store.rows(
                PROJECTIONS["attempts"], " AND ".join(where), params, order="finished_at DESC"
            )
        )
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
            chosen.append(
                Redrive(brand_id, mine["attempt_id"], mine["failure_reason"], mine["finished_at"])
            )
        else:
            why = status if status != "failed" else "its latest failure not selected"
            skipped.append(
                {
                    "brand_id": brand_id,
                    "status": status,
                    "why": why,
                    "attempt_id": current["attempt_id"] if current else None,
                }
            )
    return chosen, skipped


def _with_title_and_parent(settings: Settings, chosen: Sequence[Redrive]) -> list[Redrive]:
    """Each failed attempt's title and parent, replayed from the event store (the
    `attempts` projection does not keep the parent), one connection at a time."""
    from domain.attempt import ProvisioningAttempt
    from worker.actions import request_service

    service = request_service(settings, read_only=True)
    done: list[Redrive] = []
    try:
        for start in range(0, len(chosen), IN_CHUNK):
            part = chosen[start : start + IN_CHUNK]
            loaded = service.load(*(UUID(r.attempt_id) for r in part))
            for redrive, attempt in zip(part, loaded, strict=True):
                if isinstance(attempt, ProvisioningAttempt):
                    done.append(
                        replace(redrive, title=attempt.title, parent=attempt.parent_workspace_id)
                    )
                else:
                    done.append(replace(redrive, error="attempt not in the event store"))
    finally:
        service.app.close()
    return done


def _checked(redrive: Redrive) -> Redrive:
    """`redrive`, or with the reason the message schema refuses its values."""
    if redrive.error is not None or redrive.title is None or redrive.parent is None:
        return redrive
    line = checked_line(
        0, {"brand_id": redrive.brand_id, "title": redrive.title, "parent": redrive.parent}
    )
    return replace(redrive, error=line.error) if isinstance(line, BadLine) else redrive


@contextmanager
def _views(settings: Settings) -> Iterator[Any]:
    from infrastructure.views.store import SqlViewStore

    with SqlViewStore(
        settings.database_url, read_only=True, wait_s=settings.connect_wait_s
    ) as store:
        store.check()
        yield store


def select(
    settings: Settings,
    *,
    reason: str | None = None,
    since: datetime | None = None,
    brand_ids: Sequence[str] = (),
) -> tuple[list[Redrive], list[dict[str, Any]]]:
    """The brands to re-request, each with its failed attempt's title and parent (or
    the reason it cannot be: `error`), and those skipped: the `attempts` projection's
    failed attempts (by `reason`, ended at or after `since`, of `brand_ids`: all when
    empty) of brands that `brand_workspaces` still shows failed."""
    with _views(settings) as store:
        attempts = failed_attempts(store, reason=reason, since=since, brand_ids=brand_ids)
        brands = {
            r["brand_id"]: r
            for r in rows_by(
                store, "brand_workspaces", "brand_id", [a["brand_id"] for a in attempts]
            )
        }
    chosen, skipped = choose(attempts, brands)
    done = [_checked(r) for r in _with_title_and_parent(settings, chosen)] if chosen else []
    return done, skipped


def publish(settings: Settings, redrives: Sequence[Redrive], url: str, sent: list[str]) -> None:
    """One `provision` a brand, with its failed attempt's title and parent and a fresh
    time; each brand appended to `sent` once the broker took it."""
    sends = [(r.brand_id, r.title, r.parent) for r in redrives if r.title and r.parent]
    with publisher(url, settings) as broker:
        for brand_id, title, parent in sends:
            broker.publish(provision(brand_id, title, parent))
            sent.append(brand_id)


def redrive_line(redrive: Redrive, verb: str) -> str:
    """What was done with one brand, as `retry` prints it."""
    failed = f"attempt {redrive.attempt_id} failed {redrive.failure_reason or ''}".rstrip()
    if redrive.error is not None:
        return f"not re-requested {redrive.brand_id}: {redrive.error} ({failed})"
    return (
        f"{verb} {redrive.brand_id}: {redrive.title!r} under {redrive.parent} "
        f"({failed} at {_utc(redrive.finished_at)})"
    )
