"""`provisioner demo` runs on the embedded default and tells the story it promises."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from domain.policies import AttemptState, FailureReason, Provenance
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.store.eventstore import open_event_store
from worker.cli.main import main


def test_the_demo_provisions_every_brand_to_its_scripted_end(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.sqlite'}"

    result = CliRunner(env={"COLUMNS": "80"}).invoke(main, ["demo", "--database-url", url])
    words = " ".join(result.output.split())  # as read across wrapped lines

    assert result.exit_code == 0, result.output
    assert "…" not in result.output  # folded at 80 columns, never cut
    assert all(len(line.rstrip()) <= 80 for line in result.output.splitlines())
    assert "17 promoted" in words
    assert "brand_workspaces: 20 rows, 0 behind; attempts: 20 rows, 0 behind" in words
    assert "17 brands ready in brand_workspaces" in words
    app = open_event_store(url)
    service = ProvisioningService(app, HttpGateway("http://127.0.0.1:9", "unused"))

    def attempt_of(n: int):  # type: ignore[no-untyped-def]
        brand = service.brand(f"demo-{n:02d}")
        assert brand.current_attempt_id is not None
        return service.attempt(brand.current_attempt_id)

    zombie, terminal, cancelled = attempt_of(7), attempt_of(9), attempt_of(13)
    assert zombie.failure_reason is FailureReason.EXHAUSTED
    assert zombie.released_ids == (zombie.candidate_id,)
    # creation_failed: safe to create again, so each shell is released and re-created.
    assert terminal.failure_reason is FailureReason.EXHAUSTED
    assert len(terminal.created_ids) > 1
    assert set(terminal.released_ids) == set(terminal.created_ids)
    assert cancelled.state is AttemptState.CANCELLED
    assert cancelled.released_ids == (cancelled.candidate_id,)
    assert attempt_of(15).provenance is Provenance.ADOPTED
    assert attempt_of(5).state is AttemptState.PROMOTED
    app.close()


def test_a_small_demo_runs_without_the_brands_it_does_not_have(tmp_path: Path) -> None:
    """Fewer brands than the scripted deactivation (13) and stories (5, 7)."""
    url = f"sqlite:///{tmp_path / 'demo.sqlite'}"

    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        main, ["demo", "--brands", "3", "--database-url", url]
    )

    assert result.exit_code == 0, result.output
    assert "brand_workspaces: 3 rows, 0 behind" in result.output
