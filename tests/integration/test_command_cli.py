"""`provisioner provision` and `deactivate` on the command line: the command time is
the CLI's now, and a provision refused only for now says to retry in a moment."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner

from domain.attempt import ProvisioningAttempt
from domain.brand import ACTIVE, Brand
from domain.policies import Provenance
from infrastructure.store.eventstore import open_event_store
from worker.cli.main import main


def test_a_provision_while_the_workspace_is_emptied_says_retry_in_a_moment(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    brand = Brand.register("b-cli", "Cli Co", "parent")
    attempt = ProvisioningAttempt.start("b-cli", "Cli Co", "parent", None, max_hop=3)
    brand.begin_attempt(attempt.id, "Cli Co", "parent", datetime(2020, 1, 1, tzinfo=UTC))
    attempt.accept_candidate("ws-1", Provenance.CREATED, 0)
    attempt.promote(0)
    brand.bind("ws-1", attempt.id)
    app.save(brand, attempt)
    runner = CliRunner(env={"PROVISIONER_DATABASE_URL": url, "PROVISIONER_BROKER_URL": "memory://",
                            "PROVISIONER_PARENT_IDS": "parent"})  # fmt: skip

    before = datetime.now(UTC)
    deactivated = runner.invoke(main, ["deactivate", "b-cli"])
    brand = app.repository.get(Brand.create_id("b-cli"))
    brand.start_decommission()  # a worker is emptying the workspace
    app.save(brand)
    refused = runner.invoke(main, ["provision", "b-cli", "--title", "Cli Co", "--parent", "parent"])
    brand = app.repository.get(Brand.create_id("b-cli"))
    brand.unbind("decommissioned")
    app.save(brand)
    again = runner.invoke(main, ["provision", "b-cli", "--title", "Cli Co", "--parent", "parent"])
    brand = app.repository.get(Brand.create_id("b-cli"))
    app.close()

    assert deactivated.exit_code == 0, deactivated.output
    assert refused.exit_code == 1
    assert "retry in a moment" in refused.output, refused.output
    assert again.exit_code == 0, again.output
    assert brand.lifecycle == ACTIVE
    # The CLI's commands carry its clock's time.
    assert brand.last_command_at is not None
    assert before <= brand.last_command_at <= datetime.now(UTC)
