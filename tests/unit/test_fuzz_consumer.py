"""A fuzzer for what the worker reads and the handlers it runs (hypothesis).

Random and mutated bodies (valid messages with bytes flipped, cut or spliced, JSON
with fields of the wrong kind, unknown types and versions, huge or deep values),
random headers (`x-retries`, `x-waits`, `compression` of any kind, not a table at
all), content types and encodings, and kombu's own decode errors go through what
the consumer does with a delivery (`Settler.read`, then `handle` on a service over
the memory event store and the in-memory gateway, then `Settler.settle`). Valid
messages arrive on either queue the worker consumes: an internal one (hop, release,
decommission) on the producers' commands queue is dead-lettered unhandled.

Each delivery must end settled: acked after it was handled, re-published for a
retry, or dead-lettered with a reason (rejected only when dead-lettering itself
fails); nothing may escape the consumer. A handler may fail only in the ways the
settler has a rule for: `DeadLetter` (never retried), `RetryLater` (its own
schedule) or an infrastructure failure (the gateway's, retried).
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import pytest
from hypothesis import event, example, given, note, settings
from hypothesis import strategies as st

from domain.dead_letter_rules import Reason, reason_of
from domain.errors import RetryLater
from domain.ports import GatewayError
from infrastructure.broker import messages
from infrastructure.broker.messages import COMMANDS_QUEUE, HOPS_QUEUE
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from tests.memory_gateway import MemoryGateway
from tests.strategies import scaled
from tests.support import FakeMessage, ManualClock, RecordingBroker, new_service, settler
from worker.delivery import Settler
from worker.handlers import handle
from worker.reading import Delivery
from worker.retry_policy import DeadLetter

PARENT = "parent-1"
TYPES = ("hop", "release", "decommission", "provision", "deactivate")

texts = st.text(max_size=30) | st.sampled_from(["b1", "b2", "Acme", PARENT, " b1", "b\n1", ""])
json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | texts
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
times = st.one_of(
    st.datetimes(timezones=st.just(UTC)).map(datetime.isoformat),
    st.datetimes().map(datetime.isoformat),  # no offset: refused
    texts,
)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`good` four times in five, else `bad`."""
    return st.integers(0, 4).flatmap(lambda n: bad if n == 4 else good)


brand_ids = st.sampled_from(["b1", "b2", "b3", "nobody"])


@st.composite
def fields(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    """A message's fields: mostly of the right kind, sometimes not, sometimes extra."""
    values: dict[str, Any] = {}
    if kind in ("hop", "release"):
        good = st.sampled_from(["KNOWN", "KNOWN", str(uuid4())])
        values["attempt_id"] = draw(mostly(good, json_values))
    if kind == "hop":
        values["hop"] = draw(mostly(st.integers(0, 4), st.integers(-2, 1002) | json_values))
    if kind in ("decommission", "provision", "deactivate"):
        values["brand_id"] = draw(mostly(brand_ids, texts | json_values))
    if kind == "provision":
        values["title"] = draw(mostly(st.sampled_from(["Acme", "Bolt"]), texts))
        values["parent_workspace_id"] = draw(mostly(st.sampled_from([PARENT, "elsewhere"]), texts))
    if kind in ("provision", "deactivate") and draw(st.booleans()):
        values["requested_at"] = draw(times)
    if draw(st.integers(0, 9)) == 0:
        values[draw(texts)] = draw(json_values)
    if values and draw(st.integers(0, 9)) == 0:
        del values[draw(st.sampled_from(sorted(values)))]
    return values


@st.composite
def bodies(draw: st.DrawFn) -> bytes | str | object:
    shape = draw(st.sampled_from(["message"] * 6 + ["mutated", "mutated", "bytes", "odd"]))
    if shape in ("message", "mutated"):
        kind = draw(mostly(st.sampled_from(TYPES), st.sampled_from(["explode", "HOP", ""])))
        version = draw(mostly(st.just(1), st.sampled_from([2, 0, True, "1", None, 1.0])))
        document = {"type": kind, "version": version, **draw(fields(kind))}
        if draw(st.integers(0, 19)) == 0:
            del document[draw(st.sampled_from(["type", "version"]))]
        raw = json.dumps(document).encode()
        if shape == "message":
            return raw
        at = draw(st.integers(0, len(raw)))
        cut = draw(st.integers(0, 4))
        splice = draw(st.binary(max_size=4))
        return raw[:at] + splice + raw[at + cut :]
    if shape == "bytes":
        return draw(st.binary(max_size=200))
    return draw(
        st.sampled_from(
            [None, 12345, "\ud800", b"[" * 70_000, b"{" * 20 + b"}" * 20, "{}", bytearray(b"{}")]
        )
    )


odd_headers = st.one_of(
    st.none(),
    st.just("not a table"),
    st.dictionaries(
        st.sampled_from(["x-retries", "x-waits", "compression", "x-death", "other"]),
        st.one_of(st.integers(-5, 2000), texts, st.booleans(), st.floats(), st.none()),
        max_size=3,
    ),
)
good_headers = st.fixed_dictionaries(
    {}, optional={"x-retries": st.integers(0, 3), "x-waits": st.integers(0, 40)}
)
odd_content_types = st.sampled_from(
    [None, "APPLICATION/JSON", "text/plain", b"application/json", 7]
) | st.text(max_size=10)
odd_encodings = st.sampled_from([None, "UTF8", "latin-1", "binary", b"utf-8"]) | st.text(max_size=6)


@st.composite
def envelopes(draw: st.DrawFn) -> tuple[Any, Any, Any, Any]:
    """(headers, content type, encoding, kombu's decode errors): mostly what a producer
    sends, sometimes anything."""
    odd = draw(st.integers(0, 3)) == 0
    header = draw(odd_headers if odd and draw(st.booleans()) else good_headers)
    content_type = draw(odd_content_types if odd else st.just("application/json"))
    encoding = draw(odd_encodings if odd else st.just("utf-8"))
    errors = [(ValueError, ValueError("bad zlib"), None)] if odd and draw(st.booleans()) else None
    return header, content_type, encoding, errors


def a_service() -> tuple[ProvisioningService, UUID]:
    gateway = MemoryGateway(PARENT)
    gateway.new_statuses = ["not ready"]
    service = new_service(gateway, ManualClock())
    service.settings = EngineSettings()
    attempt_id = service.request_provisioning("b1", "Acme", PARENT)
    service.run_hop(attempt_id, 0)
    return service, attempt_id


def _run(service: ProvisioningService, message: messages.Message) -> Future[str]:
    """What a pool thread does: the handler's result or exception in a future."""
    future: Future[str] = Future()
    try:
        future.set_result(handle(service, message))
    except Exception as exc:
        future.set_exception(exc)
    return future


CLEAN = ({}, "application/json", "utf-8", None)


@settings(max_examples=scaled(3))
@given(body=bodies(), envelope=envelopes())
@example(b'{"type": "hop", "version": 1, "attempt_id": "KNOWN", "hop": 1}', CLEAN)
@example(b'{"type": "provision", "version": 1, "brand_id": "b2", "title": "Acme", '
         b'"parent_workspace_id": "parent-1"}', (None, None, None, None))  # fmt: skip
@example(b'{"type": "decommission", "version": 1, "brand_id": "nobody"}', CLEAN)
@example(
    b'{"type": "provision", "version": 1, "brand_id": "b2", "title": "Bolt", '
    b'"parent_workspace_id": "elsewhere"}',
    ({"x-waits": 32}, "application/json", "utf-8", None),
)  # RetryLater (b2 is bound: moving it waits for a deactivate), its hour spent
# JSON may escape a lone surrogate, which no UTF-8 store can hold: refused, not retried.
@example(b'{"type": "provision", "version": 1, "brand_id": "b\\ud800", "title": "Acme", '
         b'"parent_workspace_id": "parent-1"}', CLEAN)  # fmt: skip
@example(b'{"type": "decommission", "version": 1, "brand_id": "b\\udc00"}', CLEAN)
@example(b'{"type": "deactivate", "version": 1, "brand_id": "\\ud83d"}', CLEAN)
def test_every_delivery_ends_handled_retried_or_dead_lettered_with_a_reason(
    body: Any, envelope: tuple[Any, Any, Any, Any]
) -> None:
    header, content_type, encoding, errors = envelope
    service, attempts = a_busier_service()
    attempt_id = attempts[0]
    if isinstance(body, bytes):
        body = body.replace(b"KNOWN", str(attempt_id).encode())
    delivery_message = FakeMessage(
        body, header, content_type=content_type, content_encoding=encoding, errors=errors
    )
    if header is None:
        delivery_message.headers = None
    publisher = RecordingBroker()
    reader = settler(publisher, delays=(1.0, 5.0))

    delivery = reader.read(delivery_message, HOPS_QUEUE)  # raises nothing, whatever it holds

    if delivery is None:
        [(_, reason, why, _)] = publisher.dead
        assert reason, why
        assert why, reason
        assert delivery_message.state == "ACK"
        event(f"refused: {reason}")
        return
    _handle_and_settle(service, reader, publisher, delivery_message, delivery)


def _handle_and_settle(
    service: ProvisioningService,
    reader: Settler,
    publisher: RecordingBroker,
    delivery_message: FakeMessage,
    delivery: Delivery,
) -> None:
    future = _run(service, delivery.message)
    failure = future.exception()
    note(f"{delivery.message.type}: {failure!r}" if failure else future.result())
    assert failure is None or isinstance(failure, DeadLetter | RetryLater | GatewayError), (
        f"{delivery.message.type} {delivery.message.fields} raised {failure!r}"
    )

    reader.settle(delivery_message, delivery, future)  # raises nothing either

    assert delivery_message.state == "ACK"
    if isinstance(failure, DeadLetter):
        [(_, reason, _, _)] = publisher.dead
        assert reason == reason_of(failure.reason) != Reason.OTHER
        event(f"dead-lettered by the handler: {reason}")
    elif publisher.dead:  # a failure retried as often as its schedule allows
        [(_, reason, _, _)] = publisher.dead
        assert reason == "retries_exhausted"
        assert publisher.published == []
        event(f"retries exhausted: {type(failure).__name__}")
    elif failure is not None:
        [(_, _, retry_headers)] = publisher.published
        assert retry_headers
        assert retry_headers.get("x-retries") or retry_headers.get("x-waits")
        event(f"retried: {type(failure).__name__}")
    else:
        assert publisher.dead == publisher.published == []
        event(f"handled: {delivery.message.type}")


# Messages the decoder accepts, with the values a producer may put in them.

any_text = mostly(
    st.sampled_from(["b1", "b2", "b3", "b4", "Acme", "Bolt"]), st.text(min_size=1, max_size=200)
)
aware_times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


@st.composite
def valid_messages(draw: st.DrawFn, attempts: list[UUID]) -> messages.Message:
    kind = draw(st.sampled_from(TYPES))
    attempt_id = draw(mostly(st.sampled_from(attempts), st.uuids()))
    at = draw(st.none() | aware_times)
    if kind == "hop":
        return messages.hop(attempt_id, draw(mostly(st.integers(0, 5), st.integers(0, 1000))))
    if kind == "release":
        return messages.release(attempt_id)
    if kind == "decommission":
        return messages.decommission(draw(any_text))
    if kind == "provision":
        parent = draw(mostly(st.just(PARENT), st.text(min_size=1, max_size=200)))
        return messages.provision(draw(any_text), draw(any_text), parent, at)
    return messages.deactivate(draw(any_text), at)


def a_busier_service() -> tuple[ProvisioningService, list[UUID]]:
    """b1 pending, b2 bound, b3 deactivated while bound, each with its attempts."""
    service, first = a_service()
    gateway = service.gateway
    assert isinstance(gateway, MemoryGateway)
    gateway.new_statuses = ["created"]
    second = service.request_provisioning("b2", "Bolt", PARENT)
    service.run_hop(second, 0)
    third = service.request_provisioning("b3", "Bolt", PARENT)
    service.run_hop(third, 0)
    service.deactivate("b3")
    return service, [first, second, third]


@settings(max_examples=scaled(3))
@given(data=st.data())
def test_every_message_the_decoder_accepts_is_handled_retried_or_dead_lettered(
    data: st.DataObject,
) -> None:
    service, attempts = a_busier_service()
    publisher = RecordingBroker()
    reader = settler(publisher, delays=(1.0, 5.0))
    for _ in range(data.draw(st.integers(1, 4), label="messages")):
        message = data.draw(valid_messages(attempts))
        body = message.encode()
        delivery_message = FakeMessage(body, data.draw(good_headers))
        queue = data.draw(st.sampled_from([HOPS_QUEUE, COMMANDS_QUEUE]), label="queue")
        publisher.dead.clear()
        publisher.published.clear()
        head = _head(service)
        delivery = reader.read(delivery_message, queue)
        if message.type not in messages.QUEUE_RULES[queue].accepts:
            _assert_refused_unhandled(service, publisher, delivery_message, delivery, head)
            event(f"refused on the commands queue: {message.type}")
            continue
        assert delivery is not None, publisher.dead
        assert delivery.message == messages.decode(body)
        _handle_and_settle(service, reader, publisher, delivery_message, delivery)


def _head(service: ProvisioningService) -> int:
    return service.app.recorder.max_notification_id() or 0


def _assert_refused_unhandled(
    service: ProvisioningService,
    publisher: RecordingBroker,
    delivery_message: FakeMessage,
    delivery: Delivery | None,
    head: int,
) -> None:
    """Dead-lettered as internal on the commands queue, acked, and nothing recorded."""
    assert delivery is None
    [(_, reason, errors, _)] = publisher.dead
    assert reason == "wrong_queue"
    assert errors["queue"] == COMMANDS_QUEUE
    assert errors["accepts"] == ["deactivate", "provision"]
    assert delivery_message.state == "ACK"
    assert publisher.published == []
    assert _head(service) == head


@pytest.mark.parametrize("kind", ["hop", "release", "decommission"])
def test_an_internal_message_on_the_commands_queue_is_dead_lettered_and_has_no_effect(
    kind: str,
) -> None:
    """What a producer allowed to publish commands could send: a hop of a pending
    attempt, a release, a decommission of a bound brand's workspace. Each one would
    act on the hops queue; on the commands queue none reaches a handler."""
    service, attempts = a_busier_service()
    message = {
        "hop": messages.hop(attempts[0], 1),
        "release": messages.release(attempts[1]),
        "decommission": messages.decommission("b3"),
    }[kind]
    publisher = RecordingBroker()
    reader = settler(publisher)
    head = _head(service)

    refused = FakeMessage(message.encode())
    delivery = reader.read(refused, COMMANDS_QUEUE)
    _assert_refused_unhandled(service, publisher, refused, delivery, head)

    # The same message from the service's own queue is handed to its handler.
    assert reader.read(FakeMessage(message.encode()), HOPS_QUEUE) == Delivery(message, 0)
