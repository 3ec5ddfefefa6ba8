"""Flags and waits at their edges: a concurrency that would run nothing is a usage
error naming the flag; PROVISIONER_CONNECT_WAIT_S=0 means one try, no wait."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from infrastructure.failures import ServiceUnavailable
from infrastructure.store import eventstore
from worker.cli.main import main

# A broker URL the settings refuse (exit 3): the command body never gets far.
ENV = {"PROVISIONER_BROKER_URL": "bogus://x", "PROVISIONER_DATABASE_URL": "memory://"}


@pytest.mark.parametrize("command", ["worker", "run"])
@pytest.mark.parametrize("value", ["0", "-1", "513"])
def test_a_concurrency_out_of_range_is_refused_naming_the_flag(command: str, value: str) -> None:
    result = CliRunner(env=ENV).invoke(main, [command, "--concurrency", value])

    assert result.exit_code == 2, result.output  # click's usage error, before anything runs
    assert "Invalid value for '--concurrency'" in result.output
    assert "1<=x<=512" in result.output


@pytest.mark.parametrize("command", ["worker", "run"])
def test_a_concurrency_in_range_is_accepted(command: str) -> None:
    result = CliRunner(env=ENV).invoke(main, [command, "--concurrency", "512"])
    assert result.exit_code == 3, result.output  # past the flag: the bad setting stops it
    assert "PROVISIONER_BROKER_URL" in result.output


class _KeepsEnv:
    """Stands in for the application: keeps the environment it was given."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env


@pytest.mark.parametrize(("wait_s", "expected"), [(0.0, 0.0), (None, 30.0), (2.5, 2.5)])
def test_a_one_shot_store_waits_as_long_as_asked(
    monkeypatch: pytest.MonkeyPatch, wait_s: float | None, expected: float
) -> None:
    monkeypatch.setattr(eventstore, "_tables_exist", lambda *_, **__: True)
    monkeypatch.setattr(eventstore, "ProvisionerApplication", _KeepsEnv)
    url = "postgresql://u@127.0.0.1:1/db"
    app: Any = eventstore.open_event_store(url, one_shot=True, wait_s=wait_s)
    assert float(app.env["POSTGRES_CONNECT_WAIT_S"]) == expected


def test_connect_wait_zero_fails_a_one_shot_command_after_one_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tries: list[str] = []

    def refused(*_: Any, **__: Any) -> psycopg.Connection[Any]:
        tries.append("connect")
        raise psycopg.OperationalError("connection failed: Connection refused")

    monkeypatch.setattr(eventstore, "_tables_exist", lambda *_, **__: True)
    monkeypatch.setattr(psycopg, "connect", refused)
    with pytest.raises(ServiceUnavailable):
        eventstore.open_event_store("postgresql://u@127.0.0.1:1/db", one_shot=True, wait_s=0)
    assert tries == ["connect"]


def test_a_closed_pipe_ends_a_command_quietly() -> None:
    """`provisioner dead-letters list | head -1`: no "Broken pipe" error, exit 0."""
    import click
    from click.testing import CliRunner

    from worker.cli.main import _Main

    @click.group(cls=_Main)
    def group() -> None:
        pass

    @group.command()
    def listing() -> None:
        click.echo("first line")
        raise BrokenPipeError(32, "Broken pipe")

    result = CliRunner().invoke(group, ["listing"])

    assert result.exit_code == 0, result.output
    assert "Broken pipe" not in result.output
