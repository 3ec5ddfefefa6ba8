"""Every text the CLI prints is printable: a control character that came from a
producer or the gateway (ESC starting a colour or cursor sequence, BEL, a C1 CSI)
is written out as `\\xNN`, never sent to the terminal raw."""

from __future__ import annotations

import io
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from rich.console import Console

from domain.ports import RequestRejected
from infrastructure.service import ProvisioningService
from infrastructure.store.eventstore import init_database, open_event_store
from tests.memory_gateway import MemoryGateway
from worker.cli.main import main
from worker.console import CommandFailed, cell, compact_table, echo
from worker.logs import printable

HOSTILE = "ws-1\x1b[31m red\x07\x9b2J\x7f"
RAW = ("\x1b", "\x07", "\x9b", "\x7f")


def assert_printable(text: str) -> None:
    assert not any(char in text for char in RAW), repr(text)
    assert not any(ord(char) < 0x20 and char != "\n" for char in text), repr(text)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (HOSTILE, "ws-1\\x1b[31m red\\x07\\x9b2J\\x7f"),
        ("a\rb\bc\td\x00e", "a\\x0db\\x08c\\x09d\\x00e"),
        ("line one\nline two", "line one\nline two"),  # a text of several lines stays so
        ("Brand é 🚀 日本", "Brand é 🚀 日本"),  # printable Unicode passes as it is
    ],
)
def test_printable_writes_control_characters_out(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_echo_and_error_lines_are_printable(capsys: pytest.CaptureFixture[str]) -> None:
    echo(f"attempt for {HOSTILE}")
    echo(HOSTILE, err=True)
    out, err = capsys.readouterr()
    assert_printable(out + err)
    assert "ws-1\\x1b[31m red" in out
    assert_printable(CommandFailed(f"failed: {HOSTILE}", 1).format_message())


def test_a_table_cell_is_printable_and_not_markup() -> None:
    table = compact_table(f"brand {HOSTILE}")
    table.add_column("id")
    table.add_row(cell(HOSTILE))
    table.add_row(cell("[bold]not markup[/bold]"))
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(table)
    assert_printable(out.getvalue())
    assert "\\x1b[31m" in out.getvalue()
    assert "[bold]not markup[/bold]" in out.getvalue()


@pytest.fixture
def store(tmp_path: Path) -> str:
    """A SQLite event store holding brand b1, whose create the gateway refused with a
    text full of terminal escapes."""
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    init_database(url)
    gateway = MemoryGateway("org-parent")
    gateway.creates = [RequestRejected(f"create_child: HTTP 409: {HOSTILE}")]
    app = open_event_store(url)
    try:
        service = ProvisioningService(app, gateway)
        attempt_id = service.request_provisioning("b1", "Acme", "org-parent")
        service.run_hop(attempt_id, 0)
    finally:
        app.close()
    return url


@pytest.mark.parametrize("command", [["history", "b1"], ["status", "b1"], ["history", "nope"]])
def test_commands_print_what_the_gateway_said_printable(store: str, command: list[str]) -> None:
    env = {"PROVISIONER_DATABASE_URL": store, "PROVISIONER_PARENT_IDS": "org-parent"}
    result = CliRunner().invoke(main, command, env=env)
    assert_printable(result.output)
    if command == ["history", "b1"]:
        assert result.exit_code == 0, result.output
        assert "\\x1b[31m" in result.output.replace("\n", "")  # shown, written out


def test_a_click_error_quoting_an_argument_is_printable() -> None:
    @click.command()
    def boom() -> None:
        raise click.ClickException(f"no such thing: {HOSTILE}")

    main.add_command(boom, "boom-for-test")
    try:
        result = CliRunner().invoke(main, ["boom-for-test"])
    finally:
        main.commands.pop("boom-for-test")
    assert result.exit_code == 1
    assert_printable(result.output)
    assert "no such thing: ws-1\\x1b[31m red" in result.output
