"""What a person reads on an 80-column terminal: nothing cut with "…", lines that fit,
the failure message, the brand's own events between its attempts, whole sentences."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from click.testing import CliRunner, Result

from infrastructure.eventstore import open_event_store
from infrastructure.fake_gateway import FakeGateway
from infrastructure.gateway import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.views import SqlViewStore
from tests.conftest import PARENT, ManualClock
from tests.integration.test_read_models import catch_up_all
from worker.cli import _wait_for, main

LONG_BRAND = "b-" + "long-brand-name-" * 4


def _read(runner: CliRunner, *args: str) -> str:
    result: Result = runner.invoke(main, list(args))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), result.output
    assert "…" not in result.output, result.output
    return result.output


def _words(text: str) -> str:
    """The text as read across folded lines and table rules: words, single-spaced."""
    return " ".join(re.sub(r"[│─]", " ", text).split())


@pytest.fixture
def story(tmp_path: Path, fake: FakeGateway, http_gateway: HttpGateway) -> dict[str, Any]:
    """One brand promoted, deactivated, emptied and provisioned again; one whose
    attempt failed; the read models caught up."""
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    clock = ManualClock()
    app = open_event_store(url)
    service = ProvisioningService(app, http_gateway, clock=clock)
    first = service.request_provisioning("b-read", "Read Co", PARENT)
    promoted = service.run_hop(first, 0)
    service.deactivate("b-read")
    service.decommission("b-read")
    second = service.request_provisioning("b-read", "Read Co", PARENT)
    fake.configure(terminal_rate=1.0)
    failed, hop = service.request_provisioning(LONG_BRAND, "Long Co", PARENT), 0
    while (outcome := service.run_hop(failed, hop)).next_hop is not None:
        hop = outcome.next_hop
    with SqlViewStore(url) as views:
        views.setup()
        catch_up_all(app, views)
    return {
        "runner": CliRunner(env={"PROVISIONER_DATABASE_URL": url, "COLUMNS": "80"}),
        "service": service,
        "first": str(first),
        "second": str(second),
        "failed": str(failed),
        "workspace": promoted.workspace_id,
        "message": service.attempt(failed).last_status,
    }


def test_version_is_the_package_version() -> None:
    result = CliRunner().invoke(main, ["--version"])

    assert result.exit_code == 0
    assert result.output.strip() == f"provisioner, version {version('workspace-provisioner')}"


def test_history_shows_the_brands_own_events_between_its_attempts(story: dict[str, Any]) -> None:
    text = _read(story["runner"], "history", "b-read")

    order = [
        "Registered",
        f"attempt {story['first']} of brand b-read: promoted",
        "WorkspaceBound",
        "Deactivated",
        "WorkspaceUnbound",
        "Reactivated",
        f"attempt {story['second']} of brand b-read: pending",
    ]
    places = [text.index(marker) for marker in order]
    assert places == sorted(places), text
    assert f"{story['workspace']}; decommissioned" in text


def test_attempt_shows_why_it_failed(story: dict[str, Any]) -> None:
    text = _read(story["runner"], "attempt", story["failed"])

    assert "failed (exhausted)" in text
    assert f"failed (exhausted): {story['message']}" in _words(text)
    assert story["message"].startswith("not confirmed after")


def test_attempts_fit_80_columns_with_whole_ids_and_errors(story: dict[str, Any]) -> None:
    text = _read(story["runner"], "attempts")
    wide = _read(story["runner"], "attempts", "--wide")

    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("attempt / last error"))
    brand_at, state_at = header.index("brand"), header.index("state")
    first_column = _words(" ".join(line[:brand_at] for line in lines[2:]))
    brand_column = "".join(line[brand_at:state_at].strip() for line in lines[2:])
    for attempt_id in (story["first"], story["second"], story["failed"]):
        assert attempt_id in text  # whole, on one line: it can be copied
    assert f"{story['failed']} {story['message']}" in first_column  # under its attempt
    assert LONG_BRAND in brand_column  # folded, not cut
    assert "failed" in text
    assert "pending" in text
    assert f"candidate_id {story['workspace']}" in _words(wide)
    assert "started_at 20" in _words(wide)


def test_projections_status_explains_its_columns(story: dict[str, Any]) -> None:
    text = _words(_read(story["runner"], "projections", "status"))

    assert "the event log's head is at" in text
    for column in ("copy:", "position:", "behind:", "rows:", "rebuilding:"):
        assert column in text


def test_wait_and_deactivate_print_whole_sentences(
    story: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    service = story["service"]
    runner = story["runner"]

    promoted = _wait_for(service, UUID(story["first"]), timeout=1.0)
    said_promoted = capsys.readouterr().out
    failed = _wait_for(service, UUID(story["failed"]), timeout=1.0)
    said_failed = capsys.readouterr().out
    deactivated = runner.invoke(main, ["deactivate", "b-read"])
    again = runner.invoke(main, ["deactivate", "b-read"])

    assert promoted == 0
    assert said_promoted.strip() == (
        f"attempt {story['first']} for brand b-read promoted: "
        f"the brand is ready in workspace {story['workspace']}."
    )
    assert failed == 1
    assert f"failed (exhausted): {story['message']}" in said_failed
    assert deactivated.exit_code == 0, deactivated.output
    assert deactivated.output.strip() == (
        f"brand b-read deactivated; its pending attempt {story['second']} was cancelled, "
        "and it has no workspace to empty."
    )
    assert again.output.strip() == "brand b-read was already deactivated; nothing changed."
    assert "None" not in deactivated.output + said_promoted + said_failed


def test_status_reads_as_aligned_fields_without_none(story: dict[str, Any]) -> None:
    text = _read(story["runner"], "status", LONG_BRAND)

    lines = [line.rstrip() for line in text.splitlines()]
    assert lines[0] + lines[1].strip() == f"brand_id:      {LONG_BRAND}"  # folded, aligned
    assert lines[1].startswith(" " * 15)
    assert "workspace_id:  none" in lines
    assert "attempt_state: failed" in lines
    assert "None" not in text
