"""The worker's retry policy (worker/retry_policy.py): what becomes of a delivery,
from its type, its counts and how its handler ended; every branch, as a table."""

from __future__ import annotations

import psycopg
import pytest

from domain.dead_letter_rules import Reason
from domain.errors import RetryLater
from domain.ports import TransientGatewayError
from domain.waits import RETRY_DELAYS_S, WAIT_DELAYS_S
from infrastructure.usecases.retry import ContentionError
from worker.retry_policy import (
    Ack,
    Dead,
    DeadLetter,
    Decision,
    DeliveryFacts,
    Republish,
    RetryPolicy,
    decide,
)

POLICY = RetryPolicy(retry_delays_s=(1.0, 5.0), wait_delays_s=(10.0, 20.0))
DB_DOWN = psycopg.OperationalError("server closed the connection")
BUG = KeyError("x")
BUSY = ContentionError("busy")
LATER = RetryLater("decommission in progress")
UNANSWERED = TransientGatewayError("503")
HELD = TransientGatewayError("held: circuit open", retry_after_s=2.0)
PACED = TransientGatewayError("paced at 2 calls/s", retry_after_s=2.0, paced=True)
TOLD_15 = TransientGatewayError("throttled (HTTP 429)", retry_after_s=15.0)
TOLD_AN_HOUR = TransientGatewayError("throttled (HTTP 429)", retry_after_s=3600.0)


def exhausted(exc: BaseException, *, give_up: bool = False) -> Dead:
    return Dead(Reason.RETRIES_EXHAUSTED, {"error": repr(exc)}, give_up=give_up)


def waited(exc: BaseException) -> Dead:
    return Dead(Reason.RETRIES_EXHAUSTED, {"error": repr(exc), "waited_s": 30.0})


@pytest.mark.parametrize(
    ("facts", "failure", "decision"),
    [
        # Handled.
        (DeliveryFacts("hop"), None, Ack()),
        (DeliveryFacts("provision", 2, 2), None, Ack()),
        # A DeadLetter: never retried, whatever the counts; its reason, or the name
        # of the refusal, read as a Reason, and a label that is none kept as it was.
        (DeliveryFacts("hop"), DeadLetter("UnknownAttempt", {"error": "no attempt"}),
         Dead(Reason.UNKNOWN_ATTEMPT, {"error": "no attempt"})),
        (DeliveryFacts("provision", 9, 9), DeadLetter("InvalidRequest"),
         Dead(Reason.INVALID_REQUEST, {})),
        (DeliveryFacts("hop"), DeadLetter(Reason.SCHEMA_ERROR, {"fields": {}}),
         Dead(Reason.SCHEMA_ERROR, {"fields": {}})),
        (DeliveryFacts("hop"), DeadLetter("no such thing", {"n": 1}),
         Dead(Reason.OTHER, {"label": "no such thing", "n": 1})),
        # Infrastructure failures: x-retries on the retry schedule, x-waits kept.
        (DeliveryFacts("hop"), DB_DOWN, Republish(1.0, {"x-retries": 1})),
        (DeliveryFacts("release", 1), BUSY, Republish(5.0, {"x-retries": 2})),
        (DeliveryFacts("provision", 1, 3), DB_DOWN, Republish(5.0, {"x-retries": 2, "x-waits": 3})),
        # ... then dead once spent.
        (DeliveryFacts("hop", 2), DB_DOWN, exhausted(DB_DOWN)),
        (DeliveryFacts("hop", 2), BUSY, exhausted(BUSY)),
        (DeliveryFacts("deactivate", 2, 1), DB_DOWN, exhausted(DB_DOWN)),
        # A bug is retried like the rest (it may pass) ...
        (DeliveryFacts("hop", 1), BUG, Republish(5.0, {"x-retries": 2})),
        # ... and a hop that raised one every time fails its attempt before it goes.
        (DeliveryFacts("hop", 2), BUG, exhausted(BUG, give_up=True)),
        (DeliveryFacts("release", 2), BUG, exhausted(BUG)),
        (DeliveryFacts("provision", 2), AssertionError(), exhausted(AssertionError())),
        # Refused for now: x-waits on the wait schedule, apart from x-retries.
        (DeliveryFacts("provision"), LATER,
         Republish(10.0, {"x-retries": 0, "x-waits": 1, "x-waited-ms": 10_000}, waiting=True)),
        (DeliveryFacts("provision", 2, 1), LATER,
         Republish(20.0, {"x-retries": 2, "x-waits": 2, "x-waited-ms": 30_000}, waiting=True)),
        (DeliveryFacts("release", 2), UNANSWERED,
         Republish(10.0, {"x-retries": 2, "x-waits": 1, "x-waited-ms": 10_000}, waiting=True)),
        (DeliveryFacts("decommission", 0, 1), UNANSWERED,
         Republish(20.0, {"x-retries": 0, "x-waits": 2, "x-waited-ms": 30_000}, waiting=True)),
        # Told when (Retry-After): not sooner, at least a short step, at most the
        # schedule's longest; the fleet's own turn (paced): that long, as a hop waits ...
        (DeliveryFacts("release", 0, 1, 10_000), HELD,
         Republish(5.0, {"x-retries": 0, "x-waits": 2, "x-waited-ms": 15_000}, waiting=True)),
        (DeliveryFacts("release", 0, 1, 10_000), PACED,
         Republish(2.0, {"x-retries": 0, "x-waits": 2, "x-waited-ms": 12_000}, waiting=True)),
        (DeliveryFacts("release", 0, 0), TOLD_15,
         Republish(15.0, {"x-retries": 0, "x-waits": 1, "x-waited-ms": 15_000}, waiting=True)),
        (DeliveryFacts("release", 0, 0), TOLD_AN_HOUR,
         Republish(20.0, {"x-retries": 0, "x-waits": 1, "x-waited-ms": 20_000}, waiting=True)),
        # ... and dead once the waits add up to the schedule, however many they were.
        (DeliveryFacts("release", 0, 5, 29_000), HELD,
         Republish(5.0, {"x-retries": 0, "x-waits": 6, "x-waited-ms": 34_000}, waiting=True)),
        (DeliveryFacts("release", 0, 6, 34_000), HELD,
         Dead(Reason.RETRIES_EXHAUSTED, {"error": repr(HELD), "waited_s": 34.0})),
        # ... then dead once spent, saying how long it waited.
        (DeliveryFacts("provision", 0, 2), LATER, waited(LATER)),
        (DeliveryFacts("hop", 0, 2), UNANSWERED, waited(UNANSWERED)),
    ],
)  # fmt: skip
def test_each_delivery_gets_its_decision(
    facts: DeliveryFacts, failure: BaseException | None, decision: Decision
) -> None:
    assert POLICY.decide(facts, failure) == decision


def test_the_default_schedules_are_the_workers() -> None:
    assert decide(DeliveryFacts("hop"), DB_DOWN) == Republish(RETRY_DELAYS_S[0], {"x-retries": 1})
    assert decide(DeliveryFacts("hop", len(RETRY_DELAYS_S)), BUG) == exhausted(BUG, give_up=True)
    assert decide(DeliveryFacts("provision"), LATER) == Republish(
        WAIT_DELAYS_S[0],
        {"x-retries": 0, "x-waits": 1, "x-waited-ms": WAIT_DELAYS_S[0] * 1000},
        waiting=True,
    )
    assert decide(DeliveryFacts("provision", 0, len(WAIT_DELAYS_S)), LATER) == Dead(
        Reason.RETRIES_EXHAUSTED, {"error": repr(LATER), "waited_s": sum(WAIT_DELAYS_S)}
    )


def test_an_error_is_cut_to_what_a_header_holds() -> None:
    long = RuntimeError("x" * 1000)

    decision = POLICY.decide(DeliveryFacts("hop", 2), long)

    assert isinstance(decision, Dead)
    assert len(decision.errors["error"]) == 300


def test_what_may_be_retried_when_settling_fails() -> None:
    """The settler retries a delivery whose settling failed while it has retries left."""
    assert POLICY.can_retry(DeliveryFacts("hop", 1))
    assert not POLICY.can_retry(DeliveryFacts("hop", 2))
    reset = OSError("reset")
    assert POLICY.failed(DeliveryFacts("hop", 1), reset) == Republish(5.0, {"x-retries": 2})
