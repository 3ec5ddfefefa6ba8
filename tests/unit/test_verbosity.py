"""-v raises the project's loggers, -vv the libraries' too."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import click
import pytest

from worker import logs
from worker.cli.main import main


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """The root logger as a process has it: no handler until `setup` makes one."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    levels = {name: logging.getLogger(name).level for name in ("", logs.PROJECT, *logs.LIBRARIES)}
    stream = io.StringIO()
    handler = logs.setup(logging.WARNING, "text", [], stream=stream)
    assert handler is not None
    yield stream
    root.removeHandler(handler)
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)


def emit(verbose: int, stream: io.StringIO) -> str:
    """As `main` does (`setup` sets the root's level to `root_level`)."""
    logging.getLogger().setLevel(logs.root_level(verbose))
    logs.raise_loggers(verbose)
    for name in ("provisioner.engine", "httpx", "kombu", "amqp", "eventsourcing", "psycopg"):
        logging.getLogger(name).debug("%s debug", name)
        logging.getLogger(name).info("%s info", name)
        logging.getLogger(name).warning("%s warning", name)
    return stream.getvalue()


def test_without_v_only_warnings(captured: io.StringIO) -> None:
    text = emit(0, captured)
    assert "provisioner.engine warning" in text
    assert "httpx warning" in text
    assert "info" not in text
    assert "debug" not in text


def test_v_raises_the_projects_loggers_not_the_libraries(captured: io.StringIO) -> None:
    text = emit(1, captured)
    assert "provisioner.engine debug" in text
    assert "provisioner.engine info" in text
    assert "httpx warning" in text
    for library in ("httpx", "kombu", "amqp", "eventsourcing", "psycopg"):
        assert f"{library} info" not in text
        assert f"{library} debug" not in text


def test_vv_raises_both(captured: io.StringIO) -> None:
    text = emit(2, captured)
    assert "provisioner.engine debug" in text
    for library in ("httpx", "kombu", "amqp", "eventsourcing", "psycopg"):
        assert f"{library} debug" in text


def test_v_is_counted_on_the_command_line() -> None:
    [option] = [p for p in main.params if p.name == "verbose"]
    assert isinstance(option, click.Option)
    assert option.count
    assert "-v" in option.opts
