"""The worker's handling of one delivery, against fake messages and a fake publisher:
nothing a producer puts on a queue, and no failure while settling, escapes."""

from __future__ import annotations

import logging
import random
import threading
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from kombu import Connection

from domain.ports import TransientGatewayError
from infrastructure.broker import messages
from infrastructure.broker.publisher import Broker
from infrastructure.broker.topology import COMMANDS_QUEUE, DEAD_QUEUE, HOPS_QUEUE, Topology
from infrastructure.usecases.retry import ContentionError
from tests.support import GOOD, BrokerDown, FakeMessage, RecordingBroker, finished, settler
from worker.consumer import HopWorker
from worker.delivery import subject
from worker.reading import Delivery
from worker.retry_policy import DeadLetter, is_bug

POISON: list[tuple[FakeMessage, str]] = [
    (FakeMessage(b"[" * 1000 + b"]" * 1000), "too_deeply_nested"),
    (FakeMessage(b"[" * 100_000), "too_large"),
    (FakeMessage(b'{"a": ' * 1000 + b"1" + b"}" * 1000), "too_deeply_nested"),
    (FakeMessage(b" " * (64 * 1024 + 1)), "too_large"),
    (FakeMessage(b'{"type": "hop", "version": 1, "attempt_id": "\xff"}'), "not_utf8"),
    (FakeMessage("\ud800"), "not_utf8"),  # a str body py-amqp could not encode back
    (FakeMessage(GOOD, content_encoding="latin-1"), "unsupported_encoding"),
    (FakeMessage(GOOD, content_encoding=b"utf-8"), "unsupported_encoding"),
    (FakeMessage(GOOD, content_type="application/x-python-serialize"), "unsupported_content_type"),
    (FakeMessage(GOOD, {"compression": "application/x-gzip"}), "unsupported_encoding"),
    (FakeMessage(GOOD, errors=[(ValueError, ValueError("bad zlib"), None)]), "undecodable"),
    (FakeMessage(GOOD, {"x-retries": "abc"}), "bad_header"),
    (FakeMessage(GOOD, {"x-retries": True}), "bad_header"),
    (FakeMessage(GOOD, {"x-retries": -3}), "bad_header"),
    (FakeMessage(GOOD, {"x-retries": [1]}), "bad_header"),
    (FakeMessage(GOOD, "not a table"), "bad_header"),
    (FakeMessage(12345), "undecodable"),
    (FakeMessage(None), "undecodable"),
    (FakeMessage(b'{"type": "hop", "version": 1e999}'), "missing_type_or_version"),
    (FakeMessage(b'{"type": "hop", "version": 1, "hop": ' + b"9" * 5000 + b"}"), "invalid_json"),
]


@pytest.mark.parametrize(("message", "reason"), POISON)
def test_poison_is_dead_lettered_with_its_reason_and_acked(
    message: FakeMessage, reason: str
) -> None:
    publisher = RecordingBroker()

    assert settler(publisher).read(message, HOPS_QUEUE) is None

    [(_, dead_reason, errors, source)] = publisher.dead
    assert (dead_reason, source) == (reason, "work")
    assert errors
    assert message.state == "ACK"


def test_random_bodies_and_headers_never_escape_the_reader() -> None:
    rng = random.Random(9)
    alphabet = b'[]{}",:0123456789.eE+-truefalsnl \\\x00\xff'
    publisher = RecordingBroker()
    reader = settler(publisher)
    for _ in range(2000):
        body = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 200)))
        header = rng.choice([None, "1", 1.5, b"\x00", {"a": 1}, 2**70, 3])
        message = FakeMessage(body, {"x-retries": header} if header is not None else {})
        delivery = reader.read(message, HOPS_QUEUE)
        assert delivery is not None or message.state == "ACK"
    assert publisher.dead


def test_a_dead_letter_keeps_the_messages_content_type_encoding_and_id() -> None:
    publisher = RecordingBroker()
    message = FakeMessage(GOOD, {"x-dead-id": "abc123"}, content_type="text/plain",
                          content_encoding=None)  # fmt: skip

    assert settler(publisher).read(message, HOPS_QUEUE) is None

    assert [d[1] for d in publisher.dead] == ["unsupported_content_type"]
    assert publisher.kept == [{"x-dead-content-type": "text/plain", "x-dead-content-encoding": "",
                               "x-dead-id": "abc123"}]  # fmt: skip


def test_a_label_that_is_no_reason_is_dead_lettered_other_and_kept() -> None:
    publisher = RecordingBroker()

    settler(publisher).dead(FakeMessage(), "Nobody's Label", {"n": 1})

    assert [(d[1], d[2]) for d in publisher.dead] == [
        ("other", {"label": "Nobody's Label", "n": 1})
    ]


def test_a_good_delivery_is_read_with_its_retry_count() -> None:
    delivery = settler(RecordingBroker()).read(FakeMessage(GOOD, {"x-retries": 2}), HOPS_QUEUE)

    assert delivery == Delivery(messages.decode(GOOD), 2)


def test_a_failed_handler_is_retried_with_the_count_then_dead_lettered() -> None:
    publisher = RecordingBroker()
    settle = settler(publisher, delays=(1.0, 5.0))
    decoded = messages.decode(GOOD)
    failure = RuntimeError("boom")

    first, last = FakeMessage(), FakeMessage(GOOD, {"x-retries": 2})
    settle.settle(first, Delivery(decoded, 0), finished(failure))
    settle.settle(last, Delivery(decoded, 2), finished(failure))

    assert publisher.published == [(decoded, 1.0, {"x-retries": 1})]
    assert [d[1] for d in publisher.dead] == ["retries_exhausted"]
    assert first.state == last.state == "ACK"


def test_a_retry_line_names_whose_message_it_is(caplog: pytest.LogCaptureFixture) -> None:
    publisher = RecordingBroker()
    attempt_id = uuid4()
    release = messages.release(attempt_id)

    with caplog.at_level(logging.INFO, "provisioner.worker"):
        settler(publisher).settle(
            FakeMessage(), Delivery(release, 0), finished(TransientGatewayError("503"))
        )

    line = f"release attempt={attempt_id} refused for now (TransientGatewayError: 503)"
    assert line in caplog.text
    assert subject(messages.decommission("b-7")) == "decommission brand=b-7"


def test_a_replayed_message_keeps_its_dead_letter_id_through_a_retry() -> None:
    publisher = RecordingBroker()
    decoded = messages.decode(GOOD)
    replayed = FakeMessage(GOOD, {"x-dead-id": "d3adbeef0001"})

    settler(publisher).settle(replayed, Delivery(decoded, 0), finished(RuntimeError("boom")))

    assert publisher.published == [(decoded, 1.0, {"x-dead-id": "d3adbeef0001", "x-retries": 1})]


def test_a_dead_letter_from_the_handler_is_not_retried() -> None:
    publisher = RecordingBroker()
    message = FakeMessage()

    settler(publisher).settle(
        message, Delivery(messages.decode(GOOD), 0), finished(DeadLetter("UnknownBrand"))
    )

    assert [d[1] for d in publisher.dead] == ["unknown_brand"]  # its name, read as a reason
    assert not publisher.published


def test_a_retry_that_cannot_be_published_is_dead_lettered_instead() -> None:
    publisher = RecordingBroker(fail_publish=5)
    message = FakeMessage()

    settler(publisher).settle(
        message, Delivery(messages.decode(GOOD), 0), finished(RuntimeError("db"))
    )

    assert [d[1] for d in publisher.dead] == ["internal_error"]
    assert message.state == "ACK"


def test_a_dead_letter_that_cannot_be_published_is_rejected_to_the_queues_own_dead_lettering() -> (
    None
):
    publisher = RecordingBroker(fail_dead=5)
    message = FakeMessage(b"[" * 100_000)

    assert settler(publisher).read(message, HOPS_QUEUE) is None

    assert message.state == "REJECTED"


def test_an_ack_that_fails_unexpectedly_is_contained() -> None:
    publisher = RecordingBroker()
    message = FakeMessage(ack_error=RuntimeError("odd"))

    settler(publisher).settle(message, Delivery(messages.decode(GOOD), 0), finished("ok"))

    # Not acked: retried (a hop is idempotent), and the retry's own ack failed too,
    # so it was dead-lettered, and that ack failing, rejected.
    assert publisher.published
    assert message.state == "REJECTED"


def test_a_lost_connection_is_not_contained_it_reaches_the_reconnect_loop() -> None:
    message = FakeMessage(ack_error=BrokerDown("connection reset"))

    with pytest.raises(BrokerDown):
        settler(RecordingBroker()).settle(
            message, Delivery(messages.decode(GOOD), 0), finished("ok")
        )


# ---------------------------------------------------------------- on kombu's memory transport


class Handled:
    """A service that records the hops it runs."""

    secrets: tuple[str, ...] = ()  # no gateway token to scrub

    def __init__(self) -> None:
        self.hops: list[Any] = []

    def run_hop(self, attempt_id: Any, hop: int) -> Any:
        self.hops.append((attempt_id, hop))
        raise DeadLetter("UnknownAttempt")


def test_the_consuming_thread_survives_poison_on_both_queues_of_the_memory_transport() -> None:
    url = "memory://"
    with Connection(url) as conn:
        channel = conn.channel()
        Topology().declare(channel)
        for name in (HOPS_QUEUE, COMMANDS_QUEUE, DEAD_QUEUE):
            channel.queue_purge(name)
        producer = conn.Producer(channel)
        bodies = [b"[" * 100_000, b"[" * 1000 + b"]" * 1000, b"\xff", b"x" * 70_000]
        for key in ("work", "command"):
            for body in bodies:
                producer.publish(body, exchange="provisioning", routing_key=key,
                                 content_type="application/json",
                                 content_encoding="utf-8")  # fmt: skip
            producer.publish(GOOD, exchange="provisioning", routing_key=key,
                             headers={"x-retries": "abc"}, content_type="application/json",
                             content_encoding="utf-8")  # fmt: skip
        good = messages.hop(uuid4(), 0)
        Broker(url, scheduler=None).publish(good)

    service = Handled()
    worker = HopWorker(service, url, concurrency=2)  # type: ignore[arg-type]
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert worker.ready.wait(10)
        deadline = threading.Event()
        for _ in range(200):
            if worker.stats.dead_lettered >= 11:
                break
            deadline.wait(0.05)
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(10)

    assert service.hops == [(good.fields["attempt_id"], 0)]
    assert worker.stats.dead_lettered == 11  # 2 x 5 poison, and the good hop's UnknownAttempt


def test_a_hop_that_raised_a_bug_on_every_retry_fails_internal_error_then_is_dead_lettered() -> (
    None
):
    publisher = RecordingBroker()
    given_up: list[tuple[str, str]] = []
    settle = settler(publisher, delays=(1.0,))
    settle.given_up = lambda message, exc: given_up.append((message.type, type(exc).__name__))
    decoded = messages.decode(GOOD)

    settle.settle(FakeMessage(), Delivery(decoded, 0), finished(KeyError("x")))
    assert given_up == []  # a retry is left: not given up yet
    settle.settle(FakeMessage(), Delivery(decoded, 1), finished(KeyError("x")))

    assert given_up == [("hop", "KeyError")]
    assert [d[1] for d in publisher.dead] == ["retries_exhausted"]  # the message is kept


@pytest.mark.parametrize(
    ("exc", "bug"),
    [
        (KeyError("x"), True),
        (AssertionError("y"), True),
        (TransientGatewayError("503"), False),
        (ContentionError("busy"), False),
        (psycopg.OperationalError("server closed the connection"), False),
        (ConnectionResetError(), False),
    ],
)
def test_only_an_unexpected_exception_counts_as_a_bug(exc: BaseException, bug: bool) -> None:
    assert is_bug(exc) is bug


def test_a_release_the_gateway_did_not_answer_waits_on_the_long_schedule() -> None:
    """The settler's policy is the worker's: a TransientGatewayError is refused for now."""
    publisher = RecordingBroker()
    message = FakeMessage()
    decoded = messages.release(uuid4())

    settler(publisher).settle(message, Delivery(decoded, 2), finished(TransientGatewayError("503")))

    assert publisher.published == [
        (decoded, 5.0, {"x-retries": 2, "x-waits": 1, "x-waited-ms": 5000})
    ]
    assert message.state == "ACK"
