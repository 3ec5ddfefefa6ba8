"""The one line a long-running process logs when it stops, with the reason."""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest

from infrastructure.stopping import stopping


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "provisioner.process"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_sets_the_event_and_names_itself_in_the_line(
    sig: signal.Signals, caplog: pytest.LogCaptureFixture
) -> None:
    before = signal.getsignal(sig)
    with caplog.at_level("INFO"), stopping("relay") as stop:
        os.kill(os.getpid(), sig)
        assert stop.wait(5)
    assert lines(caplog) == [f"relay stopped ({sig.name})"]
    assert signal.getsignal(sig) is before  # given back


def test_an_error_logs_nothing_here_and_is_still_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The command line prints it as the process's one error line, which says why."""
    with caplog.at_level("INFO"), pytest.raises(RuntimeError), stopping("worker"):
        raise RuntimeError("the broker refused: ACCESS_REFUSED")
    with caplog.at_level("INFO"), pytest.raises(SystemExit), stopping("web"):
        raise SystemExit(3)
    assert lines(caplog) == []

    def stopped_then_failed() -> None:
        with stopping("run") as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.wait(5)
            raise RuntimeError("a part failed while stopping")

    with caplog.at_level("INFO"), pytest.raises(RuntimeError):
        stopped_then_failed()
    assert lines(caplog) == ["run stopped (SIGTERM)"]


def test_a_block_that_returns_or_exits_0_ended(caplog: pytest.LogCaptureFixture) -> None:
    given = threading.Event()
    with caplog.at_level("INFO"):
        with stopping("web", given) as stop:
            assert stop is given
        with pytest.raises(SystemExit), stopping("web"):
            raise SystemExit(0)
    assert lines(caplog) == ["web stopped (ended)", "web stopped (ended)"]


def test_the_line_shows_without_verbose() -> None:
    """Without -v the root logger is at WARNING and the project's inherit it."""
    loggers = [logging.getLogger(name) for name in (None, "provisioner", "provisioner.process")]
    before = [logger.level for logger in loggers]
    for logger, level in zip(
        loggers, (logging.WARNING, logging.NOTSET, logging.NOTSET), strict=True
    ):
        logger.setLevel(level)
    try:
        assert not loggers[2].isEnabledFor(logging.INFO)
        with stopping("fake-gateway"):
            assert loggers[2].isEnabledFor(logging.INFO)
    finally:
        for logger, level in zip(loggers, before, strict=True):
            logger.setLevel(level)


def test_a_server_that_takes_the_signals_over_hands_the_one_it_caught_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As uvicorn does: its own handler meanwhile, then ours again, the signal raised."""
    with caplog.at_level("INFO"), stopping("web") as stop:
        ours = signal.signal(signal.SIGTERM, lambda *_: None)
        os.kill(os.getpid(), signal.SIGTERM)
        assert not stop.is_set()
        signal.signal(signal.SIGTERM, ours)
        signal.raise_signal(signal.SIGTERM)
        assert stop.is_set()
    assert lines(caplog) == ["web stopped (SIGTERM)"]
