"""Telling outages from refusals, backing off, and logging an outage once."""

from __future__ import annotations

import logging
from uuid import uuid4

import amqp
import psycopg
import pytest
from eventsourcing import persistence
from kombu.exceptions import OperationalError

from infrastructure.broker import messages
from infrastructure.broker.failures import broker_refusal, is_broker_error
from infrastructure.failures import ReconnectPauses, ServiceRefused
from infrastructure.outages import (
    Outage,
    database_refusal,
    is_database_error,
    refusal,
    which_service,
)
from worker.reconciler import Reconciler

BROKER = "amqp://guest:s3cret@rabbit:5672/prov"
DATABASE = "postgresql://app:s3cret@db:5432/prov"


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (amqp.exceptions.AccessRefused(403, "ACCESS_REFUSED - Login was refused"), "password"),
        (amqp.exceptions.NotAllowed(530, "NOT_ALLOWED - vhost prov not found"), "vhost"),
    ],
)
def test_a_broker_refusal_is_for_good_and_says_what_to_do(exc: Exception, words: str) -> None:
    refused = broker_refusal(exc, BROKER)

    assert isinstance(refused, ServiceRefused)
    assert words in str(refused)
    assert "s3cret" not in str(refused)
    assert "guest:***@rabbit" in str(refused)
    assert "\n" not in str(refused)


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connection refused"),
        OperationalError("[Errno 111] Connection refused"),
        amqp.exceptions.ConnectionForced(320, "CONNECTION_FORCED - broker forced shutdown"),
        amqp.exceptions.RecoverableConnectionError("connection already closed"),
    ],
)
def test_an_unreachable_broker_is_an_outage_not_a_refusal(exc: Exception) -> None:
    assert broker_refusal(exc, BROKER) is None
    assert is_broker_error(exc)


_INEQUIVALENT = (
    "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'provisioning.hops' "
    "in vhost 'prov': received the value 'quorum' of type 'longstr' but current is none"
)


def test_a_queue_declared_with_other_arguments_is_refused_for_good() -> None:
    exc = amqp.exceptions.PreconditionFailed(_INEQUIVALENT, (50, 10), "Queue.declare")
    wrapped = OperationalError("declare failed")
    wrapped.__cause__ = exc

    for raised in (exc, wrapped):
        refused = broker_refusal(raised, BROKER)
        assert isinstance(refused, ServiceRefused)
        assert "406" in str(refused)
        assert "inequivalent arg" in str(refused)
        assert "PROVISIONER_QUEUE_TYPE" in str(refused)
        assert "s3cret" not in str(refused)
        assert refusal(raised, broker_url=BROKER) is not None


@pytest.mark.parametrize(
    "reply_text",
    [
        "PRECONDITION_FAILED - unknown delivery tag 7",
        "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out",
    ],
)
def test_other_precondition_failures_stay_recoverable(reply_text: str) -> None:
    exc = amqp.exceptions.PreconditionFailed(reply_text, (60, 80), "Basic.ack")
    assert broker_refusal(exc, BROKER) is None
    assert is_broker_error(exc)


def test_a_refusal_wrapped_by_kombu_is_still_found() -> None:
    wrapped = OperationalError("NOT_ALLOWED")
    wrapped.__cause__ = amqp.exceptions.NotAllowed(530, "NOT_ALLOWED - vhost x not found")
    assert broker_refusal(wrapped, BROKER) is not None


def _wrapped(cause: Exception) -> Exception:
    """As eventsourcing raises a driver's error: its own, caused by the driver's."""
    exc = persistence.OperationalError(str(cause))
    exc.__cause__ = cause
    return exc


def test_database_refusals_and_outages() -> None:
    login = psycopg.OperationalError('FATAL:  password authentication failed for user "app"')
    missing = psycopg.OperationalError('FATAL:  database "prov" does not exist')
    down = psycopg.OperationalError("connection refused")
    shutting = psycopg.errors.AdminShutdown("terminating connection due to administrator command")

    assert isinstance(database_refusal(_wrapped(login), DATABASE), ServiceRefused)
    assert "does not exist" in str(database_refusal(missing, DATABASE))
    assert database_refusal(_wrapped(down), DATABASE) is None
    assert database_refusal(shutting, DATABASE) is None
    assert all(is_database_error(e) for e in (_wrapped(down), shutting, down))
    assert not is_database_error(ValueError("x"))
    assert "s3cret" not in str(refusal(login, database_url=DATABASE))


def test_the_service_named_in_an_outage() -> None:
    urls = {"broker_url": BROKER, "database_url": DATABASE}
    assert which_service(ConnectionRefusedError(), **urls) == BROKER
    assert which_service(_wrapped(psycopg.OperationalError("x")), **urls) == DATABASE


def test_backoff_doubles_with_jitter_up_to_its_bound_and_resets() -> None:
    backoff = ReconnectPauses(first_s=0.5, max_s=15.0, rng=lambda: 1.0)
    assert [backoff.next() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    low = ReconnectPauses(first_s=0.5, max_s=15.0, rng=lambda: 0.0)
    assert low.next() == 0.25
    backoff.reset()
    assert backoff.next() == 0.5


def test_an_outage_is_logged_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage(logging.getLogger("provisioner.test"), "relay", BROKER)
    with caplog.at_level(logging.DEBUG, logger="provisioner.test"):
        outage.up()  # first up: connected
        for _ in range(5):
            outage.failed(BROKER, ConnectionRefusedError(111, "Connection refused"), 1.0)
        for _ in range(3):
            outage.up()

    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert lines == [
        ("INFO", "relay: connected to amqp://guest:***@rabbit:5672/prov"),
        (
            "WARNING",
            "relay: amqp://guest:***@rabbit:5672/prov unavailable (ConnectionRefusedError: "
            "[Errno 111] Connection refused); retrying with backoff until it is back",
        ),
        ("INFO", "relay: connected to amqp://guest:***@rabbit:5672/prov"),
    ]
    assert outage.outages == 1


class _BrokerDown:
    def publish(self, message: object) -> None:
        raise ConnectionRefusedError(111, "Connection refused")


def test_a_message_the_reconciler_could_not_publish_is_sent_again_next_sweep() -> None:
    reconciler = Reconciler("sqlite:///unused.sqlite", resend_s=300.0)
    attempt = str(uuid4())
    assert reconciler._fresh("hop", attempt, 2)
    with pytest.raises(ConnectionRefusedError):
        reconciler._send(_BrokerDown(), messages.hop(uuid4(), 2), ("hop", attempt, 2))  # type: ignore[arg-type]

    assert reconciler._fresh("hop", attempt, 2), "remembered as sent during the outage"
