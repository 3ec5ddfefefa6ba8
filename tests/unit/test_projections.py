"""Projection logic without a database: events in, rows out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import click
import pytest

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.policies import FailureReason, Provenance
from projections.attempts import Attempts
from projections.brand_workspaces import BrandWorkspaces, brand_status
from projections.core import ReadAhead
from tests.readmodels import project
from worker.console import TimeParam

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_brand_status_follows_the_current_attempt_and_the_pointer() -> None:
    assert brand_status("active", None, None) == "none"
    assert brand_status("active", "pending", None) == "pending"
    assert brand_status("active", "superseded", None) == "pending"
    assert brand_status("active", "promoted", "ws-1") == "ready"
    assert brand_status("active", "promoted", None) == "none"  # unbound since
    assert brand_status("active", "failed", None) == "failed"
    assert brand_status("active", "cancelled", None) == "cancelled"


def test_a_brand_row_tracks_its_current_attempt_only() -> None:
    brand = Brand.register("b-1", "Acme", "parent")
    first = ProvisioningAttempt.start("b-1", "Acme", "parent", None, max_hop=3)
    brand.begin_attempt(first.id, "Acme", "parent", datetime(2030, 1, 1, tzinfo=UTC))
    second = ProvisioningAttempt.start("b-1", "Acme", "parent", None, max_hop=3)
    brand.begin_attempt(second.id, "Acme", "parent", datetime(2030, 1, 2, tzinfo=UTC))
    first.supersede(second.id)
    second.accept_candidate("ws-9", Provenance.CREATED, 0)
    second.promote(0)
    brand.bind("ws-9", second.id)
    events = sorted(
        [*brand.collect_events(), *first.collect_events(), *second.collect_events()],
        key=lambda e: e.timestamp,
    )

    [row] = project(BrandWorkspaces(), events)

    assert row["brand_id"] == "b-1"
    assert row["attempt_id"] == str(second.id)
    assert (row["status"], row["workspace_id"]) == ("ready", "ws-9")


def test_a_bound_brand_reads_degraded_only_after_a_terminal_status() -> None:
    terminal = FailureReason.TERMINAL_STATUS.value
    assert brand_status("active", "failed", "ws-1", terminal) == "degraded"
    assert brand_status("active", "failed", "ws-1", "unauthorized") == "ready"
    assert brand_status("active", "failed", None, terminal) == "failed"  # nothing bound
    assert brand_status("deactivated", "failed", "ws-1", terminal) == "deactivated"


def reconfirm(brand: Brand, at: datetime) -> ProvisioningAttempt:
    """A new attempt for the brand's title and parent: its candidate is the bound one."""
    attempt = ProvisioningAttempt.start("b-3", "Acme", "parent", brand.workspace_id, max_hop=3)
    brand.begin_attempt(attempt.id, "Acme", "parent", at)
    return attempt


def test_a_reconfirm_that_sees_a_terminal_status_degrades_the_row_and_keeps_the_id() -> None:
    brand = Brand.register("b-3", "Acme", "parent")
    first = reconfirm(brand, datetime(2030, 1, 1, tzinfo=UTC))
    first.accept_candidate("ws-3", Provenance.CREATED, 0)
    first.promote(0)
    brand.bind("ws-3", first.id)
    broken = reconfirm(brand, datetime(2030, 1, 2, tzinfo=UTC))
    broken.fail(FailureReason.TERMINAL_STATUS, "workspace ws-3 reported status 'failed'", 0)
    history = [*brand.collect_events(), *first.collect_events(), *broken.collect_events()]
    history.sort(key=lambda e: e.timestamp)
    [degraded] = project(BrandWorkspaces(), history)
    healed = reconfirm(brand, datetime(2030, 1, 3, tzinfo=UTC))
    healed.promote(0)
    brand.bind("ws-3", healed.id)
    [ready] = project(
        BrandWorkspaces(), [*history, *brand.collect_events(), *healed.collect_events()]
    )

    assert (degraded["status"], degraded["workspace_id"]) == ("degraded", "ws-3")
    assert (degraded["attempt_state"], degraded["failure_reason"]) == ("failed", "terminal_status")
    assert (ready["status"], ready["workspace_id"], ready["failure_reason"]) == (
        "ready",
        "ws-3",
        None,
    )


def test_an_attempt_row_counts_hops_and_what_it_owes() -> None:
    attempt = ProvisioningAttempt.start("b-2", "Acme", "parent", None, max_hop=3)
    attempt.request_create(0, [], NOW)
    attempt.accept_candidate("ws-1", Provenance.CREATED, 0)
    attempt.schedule_hop(1, NOW + timedelta(seconds=5), "creating")
    attempt.fail(FailureReason.EXHAUSTED, "status stayed creating", 1)
    history = list(attempt.collect_events())
    [owing] = project(Attempts(), history)
    attempt.record_release("ws-1", 2)
    [row] = project(Attempts(), [*history, *attempt.collect_events()])

    assert (owing["state"], owing["hops_used"], owing["release_owed"]) == ("failed", 2, 1)
    assert owing["next_hop_due"] is None
    assert owing["last_error"] == "status stayed creating"
    assert (row["release_owed"], row["released"], row["released_ids"]) == (0, 1, ["ws-1"])


def test_read_ahead_serves_the_prefetched_batch_and_reads_anew_otherwise() -> None:
    calls: list[tuple[int, int]] = []

    class Source:
        def read(self, after: int, limit: int, topics: Any) -> list[tuple[int, Any]]:
            calls.append((after, limit))
            return [(n, None) for n in range(after + 1, min(after + limit, 7) + 1)]

        def head(self) -> int:
            return 7

        def count(self, after: int, topics: Any) -> int:
            return 7 - after

    ahead = ReadAhead(Source())  # type: ignore[arg-type]
    first = ahead.read(0, 3, ())
    second = ahead.read(3, 3, ())  # prefetched while the first was applied
    other = ahead.read(1, 2, ())  # not the prefetched request: read now
    ahead.close()

    assert [n for n, _ in first] == [1, 2, 3]
    assert [n for n, _ in second] == [4, 5, 6]
    assert [n for n, _ in other] == [2, 3]
    assert calls[:2] == [(0, 3), (3, 3)]


@pytest.mark.parametrize(
    ("text", "seconds_ago"), [("90s", 90), ("15m", 900), ("2h", 7200), ("1.5d", 129600)]
)
def test_times_may_be_ages(text: str, seconds_ago: float) -> None:
    parsed = TimeParam().convert(text, None, None)
    assert abs((datetime.now(UTC) - parsed).total_seconds() - seconds_ago) < 5


def test_times_may_be_iso_and_naive_ones_are_utc() -> None:
    assert TimeParam().convert("2026-11-30T12:00:00", None, None) == NOW
    assert TimeParam().convert("2026-11-30T13:00:00+01:00", None, None) == NOW


def test_a_bad_time_says_what_is_accepted() -> None:
    with pytest.raises(click.BadParameter, match="ISO 8601"):
        TimeParam().convert("yesterday-ish", None, None)
