"""Database failures are classified in one place; every escaping error becomes one line."""

from __future__ import annotations

import errno
import logging
import threading

import psycopg
import pytest
from eventsourcing.persistence import OperationalError

from infrastructure.failures import EdgeFailure, ServiceRefused, ServiceUnavailable
from infrastructure.store.pg_connect import _Wait, classify, retrying, waiting_line
from worker.edges import describe

WHERE = "postgresql://app:***@db.example/events"


def connect_error(server_says: str) -> psycopg.OperationalError:
    return psycopg.OperationalError(
        f'connection failed: connection to server at "10.0.0.5", port 5432 failed: {server_says}'
    )


@pytest.mark.parametrize(
    ("server_says", "kind", "says"),
    [
        ('FATAL:  password authentication failed for user "app"', ServiceRefused, "password"),
        ('FATAL:  role "app" does not exist', ServiceRefused, "check the user"),
        ('FATAL:  database "events" does not exist', ServiceRefused, "create the database"),
        ("server does not support SSL, but SSL was required", ServiceRefused, "sslmode"),
        ("FATAL:  sorry, too many clients already", ServiceUnavailable, "max_connections"),
        ("SSL SYSCALL error: EOF detected", ServiceUnavailable, "check that the server"),
        ("SSL error: certificate verify failed", ServiceRefused, "sslrootcert"),
        ("FATAL:  the database system is starting up", ServiceUnavailable, "retry"),
        (
            "Connection refused\n\tIs the server running on that host and accepting TCP/IP?",
            ServiceUnavailable,
            "check that the server is running",
        ),
    ],
)
def test_each_connection_failure_has_one_kind_and_one_line(
    server_says: str, kind: type[EdgeFailure], says: str
) -> None:
    failure = classify(connect_error(server_says), WHERE)

    assert type(failure) is kind
    assert says in str(failure)
    assert WHERE in str(failure)
    assert "\n" not in str(failure)


def test_the_librarys_wrapped_errors_are_classified_by_their_cause() -> None:
    cause = connect_error('FATAL:  database "events" does not exist')
    wrapped = OperationalError(str(cause))
    wrapped.__cause__ = cause  # as the library raises it: `raise ... from e`

    assert isinstance(classify(wrapped, WHERE), ServiceRefused)


def test_a_querys_own_error_is_no_edge_failure() -> None:
    assert classify(psycopg.errors.UniqueViolation("duplicate key"), WHERE) is None
    assert classify(ValueError("x"), WHERE) is None


def test_unavailability_is_retried_and_refusal_is_not() -> None:
    calls: list[int] = []

    def twice_full() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise connect_error("FATAL:  sorry, too many clients already")
        return "connected"

    assert retrying(twice_full, WHERE, wait_s=10, first_pause_s=0.001) == "connected"
    assert len(calls) == 3

    def refused() -> None:
        calls.append(1)
        raise connect_error('FATAL:  role "app" does not exist')

    calls.clear()
    with pytest.raises(ServiceRefused):
        retrying(refused, WHERE, wait_s=10, first_pause_s=0.001)
    assert len(calls) == 1


def test_a_stopped_wait_gives_up_with_the_outage() -> None:
    stop = threading.Event()
    stop.set()

    def down() -> None:
        raise connect_error("Connection refused")

    with pytest.raises(ServiceUnavailable):
        retrying(down, WHERE, wait_s=None, stop=stop)


FULL = "FATAL:  sorry, too many clients already"


@pytest.mark.parametrize(
    ("server_says", "state", "todo"),
    [
        (FULL, "full (too many clients)", "raise max_connections"),
        ("FATAL:  remaining connection slots are reserved for non-replication superuser "
         "connections", "full (too many clients)", "raise max_connections"),
        ("FATAL:  the database system is starting up",
         "not accepting connections (starting up or shutting down)", "retry when the server"),
        ("Connection refused\n\tIs the server running on that host and accepting TCP/IP?",
         "unavailable (connection to server at", "check that the server is running"),
    ],
)  # fmt: skip
def test_a_waiting_process_says_what_the_database_is_and_what_to_do(
    server_says: str, state: str, todo: str
) -> None:
    line = waiting_line(connect_error(server_says), WHERE)

    assert line.startswith(f"database at {WHERE} {state}")
    assert "; waiting, retrying with backoff (" in line
    assert todo in line
    assert "\n" not in line


def test_a_pools_timeout_is_a_wait_for_an_unavailable_database() -> None:
    from psycopg_pool import PoolTimeout

    line = waiting_line(PoolTimeout("couldn't get a connection after 5.00 sec"), WHERE)

    assert line.startswith(f"database at {WHERE} unavailable (couldn't get a connection")


def test_a_long_wait_says_so_when_it_begins_every_minute_and_once_connected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    wait = _Wait(WHERE, 60.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="provisioner.connect"):
        for _ in range(3):  # the first failures: one line
            wait.failed(connect_error(FULL))
            now[0] += 10
        now[0] = 160.0
        wait.failed(connect_error(FULL))  # a minute on: said again
        now[0] = 200.0
        wait.failed(connect_error(FULL))
        now[0] = 215.0
        wait.done()

    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "WARNING", "INFO"]
    assert lines[0][1].startswith(f"database at {WHERE} full (too many clients); waiting")
    assert lines[1][1].startswith(f"database at {WHERE} still full (too many clients) after 60 s")
    assert lines[2][1] == f"database at {WHERE}: connected after waiting 115 s"


def test_a_one_shot_wait_logs_nothing_and_a_long_one_never_retries_a_refusal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    def full_once() -> str:
        calls.append(1)
        if len(calls) < 2:
            raise connect_error(FULL)
        return "connected"

    with caplog.at_level(logging.INFO, logger="provisioner.connect"):
        assert retrying(full_once, WHERE, wait_s=10, first_pause_s=0.001) == "connected"
        assert caplog.records == []

        def refused() -> None:
            raise connect_error('FATAL:  database "events" does not exist')

        with pytest.raises(ServiceRefused, match="does not exist"):
            retrying(refused, WHERE, wait_s=None, stop=threading.Event())
        assert caplog.records == []  # no wait began: a refusal is no outage


@pytest.mark.parametrize(
    ("exc", "code", "says"),
    [
        (PermissionError(errno.EACCES, "Permission denied", "/var/x.sqlite"), 4, "permission"),
        (OSError(errno.ENOSPC, "No space left on device", "/var"), 5, "free disk space"),
        (RuntimeError("boom"), 1, "--debug"),
    ],
)
def test_any_other_failure_becomes_one_line_with_a_code(
    exc: BaseException, code: int, says: str
) -> None:
    failure = describe(exc)
    assert failure.exit_code == code
    assert says in str(failure)
