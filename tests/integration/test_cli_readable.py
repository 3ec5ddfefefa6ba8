"""What a person reads on an 80-column terminal: nothing cut with "…", lines that fit,
the failure message, the brand's own events between its attempts, whole sentences."""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from click.testing import CliRunner, Result

from domain.outcomes import Outcome
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import open_event_store
from infrastructure.views.store import SqlViewStore
from tests.conftest import PARENT
from tests.readmodels import catch_up_all
from tests.support import ManualClock, words
from worker.attempt_progress import FIELDS
from worker.cli.main import _wait_for, main

LONG_BRAND = "b-" + "long-brand-name-" * 4


def _read(runner: CliRunner, *args: str) -> str:
    result: Result = runner.invoke(main, list(args))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), result.output
    assert "…" not in result.output, result.output
    return result.output


@pytest.fixture
def story(tmp_path: Path, fake: FakeGateway, http_gateway: HttpGateway) -> dict[str, Any]:
    """One brand promoted, deactivated, emptied and provisioned again; one whose
    attempt failed; the read models caught up."""
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    clock = ManualClock()
    app = open_event_store(url)
    now = EngineSettings(decommission_delay_s=0.0)  # emptied at once
    service = ProvisioningService(app, http_gateway, clock=clock, settings=now)
    first = service.request_provisioning("b-read", "Read Co", PARENT)
    created = service.run_hop(first, 0)  # created; first polled by the next hop
    assert (created.outcome, created.next_hop) == (Outcome.SCHEDULED, 1)
    promoted = service.run_hop(first, 1)
    assert promoted.outcome is Outcome.PROMOTED
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
        "clock": clock,
        "url": url,
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
    assert f"{story['workspace']}; decommissioned" in words(text)  # folded or not


def test_attempt_shows_why_it_failed(story: dict[str, Any]) -> None:
    text = _read(story["runner"], "attempt", story["failed"])

    assert "failed (exhausted)" in text
    assert f"failed (exhausted): {story['message']}" in words(text)
    assert story["message"].startswith("not confirmed after")


def test_attempts_fit_80_columns_with_whole_ids_and_errors(story: dict[str, Any]) -> None:
    text = _read(story["runner"], "attempts")
    wide = _read(story["runner"], "attempts", "--wide")

    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("attempt / last error"))
    brand_at, state_at = header.index("brand"), header.index("state")
    first_column = words(" ".join(line[:brand_at] for line in lines[2:]))
    brand_column = "".join(line[brand_at:state_at].strip() for line in lines[2:])
    for attempt_id in (story["first"], story["second"], story["failed"]):
        assert attempt_id in text  # whole, on one line: it can be copied
    assert f"{story['failed']} {story['message']}" in first_column  # under its attempt
    assert LONG_BRAND in brand_column  # folded, not cut
    assert "failed" in text
    assert "pending" in text
    assert f"candidate_id {story['workspace']}" in words(wide)
    assert "started_at 20" in words(wide)


def test_projections_status_explains_its_columns(story: dict[str, Any]) -> None:
    text = words(_read(story["runner"], "projections", "status"))

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


def test_status_says_why_and_what_next(story: dict[str, Any], fake: FakeGateway) -> None:
    runner, service = story["runner"], story["service"]
    fake.configure(terminal_rate=0.0, unauthorized_rate=1.0)
    service.run_hop(service.request_provisioning("b-token", "Token Co", PARENT), 0)
    fake.configure(unauthorized_rate=0.0)
    # Nothing answers on port 9: the hop is deferred, the settle budget untouched.
    silent = HttpGateway("http://127.0.0.1:9", "unused", retry_backoff_s=0.0)
    deferring = ProvisioningService(service.app, silent, clock=story["clock"])
    deferring.run_hop(deferring.request_provisioning("b-silent", "Silent Co", PARENT), 0)

    failed = words(_read(runner, "status", LONG_BRAND))
    pending = words(_read(runner, "status", "b-read"))
    token = words(_read(runner, "status", "b-token"))
    deferred = words(_read(runner, "status", "b-silent"))
    as_json = json.loads(runner.invoke(main, ["status", "b-read", "--json"]).output)
    silent_json = json.loads(runner.invoke(main, ["status", "b-silent", "--json"]).output)

    assert "status: failed reason: exhausted advice: the workspace was not ready" in failed
    assert f"parent: {PARENT}" in failed
    assert "progress:" not in failed  # an ended attempt has no next hop
    assert "reason: unauthorized" in token
    assert "rotate the token (PROVISIONER_GATEWAY_TOKEN)" in token
    at = r"(?:\d{4}-\d{2}-\d{2} )?[0-9:]{8}"  # with its date when not today's (near midnight)
    assert re.search(rf"progress: hop 1 of 6, next at {at}.*, fails after "
                     rf"{at} unless confirmed", pending), pending  # fmt: skip
    assert "budget_left: 5" in pending
    assert "reason: deferred" in deferred
    assert "deferral: deferred ×1: gateway unavailable" in deferred
    assert "progress: hop 1 of 6 (hop #1 in all), next at" in deferred
    assert set(FIELDS) <= set(as_json)  # the JSON has every field, null where none
    assert (as_json["hop"], as_json["settle_hops"], as_json["max_hop"]) == (0, 0, 5)
    assert as_json["progress"].startswith("hop 1 of 6, next at ")
    assert (silent_json["reason"], silent_json["deferred_row"]) == ("deferred", 1)
    assert silent_json["down_since"] is not None
    assert silent_json["fails_after"] is not None


def test_attempts_show_their_age_and_no_error_once_promoted(
    story: dict[str, Any], fake: FakeGateway
) -> None:
    service, clock = story["service"], story["clock"]
    fake.configure(terminal_rate=0.0, settle_polls=1)
    settled = service.request_provisioning("b-settles", "Settles Co", PARENT)
    outcome, hop = service.run_hop(settled, 0), 0
    while outcome.next_hop is not None:
        clock.advance(60)
        hop = outcome.next_hop
        outcome = service.run_hop(settled, hop)
    assert service.attempt(settled).state.value == "promoted"
    assert service.attempt(settled).last_status  # what it said while it settled
    with SqlViewStore(story["url"]) as views:
        catch_up_all(service.app, views)

    text = _read(story["runner"], "attempts")
    wide = words(_read(story["runner"], "attempts", "--wide"))
    raw = json.loads(story["runner"].invoke(main, ["attempts", "--json"]).output)

    header = next(line for line in text.splitlines() if line.startswith("attempt / last error"))
    row = next(line for line in text.splitlines() if str(settled) in line)
    said = next(r for r in raw if r["attempt_id"] == str(settled))["last_error"]
    block = wide.split(f"attempt_id {settled}")[1].split("attempt_id ")[0]

    assert header.rstrip().endswith("age")
    assert re.search(r" promoted +\d+ +\d+[smhd]$", row.rstrip()), row
    assert said  # the projection keeps what it said while it settled ...
    assert said not in words(text)  # ... which a promoted row does not show as an error
    assert said not in block
    assert "last_error" in block
