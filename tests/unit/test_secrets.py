"""Secrets never reach a message, a log line or an event: URLs are redacted, and a
producer's text that holds the gateway token is refused without being echoed."""

from __future__ import annotations

import json
import logging
from concurrent.futures import Future

import httpx
import pytest

from domain.errors import InvalidRequest
from infrastructure import messages
from infrastructure.eventstore import open_event_store, redact
from infrastructure.outages import Outage
from infrastructure.service import ProvisioningService
from infrastructure.settings import Settings
from tests.unit.test_delivery import FakeMessage, FakePublisher
from worker import runtime
from worker.consumer import DeadLetter, WorkerStats, _handle
from worker.delivery import Delivery, Settler
from worker.edges import describe

TOKEN = "tok-SECRET-5f3a9c"


@pytest.mark.parametrize(
    ("url", "shown", "hidden"),
    [
        ("postgresql://alice:pw1@db:5432/ev", "postgresql://alice:***@db:5432/ev", "pw1"),
        ("postgresql://db/ev?sslmode=verify-full&sslpassword=k3y", "sslpassword=***", "k3y"),
        ("postgresql://db/ev?password=s3cret&sslmode=require", "password=***&sslmode", "s3cret"),
        ("postgresql://db/ev?PGPASSWORD=s3cret", "PGPASSWORD=***", "s3cret"),
        ("amqp://guest:p@ss@rabbit:5672/v", "amqp://guest:***@rabbit:5672/v", "p@ss"),
        ("https://svc:g4te@gw.example/api", "https://svc:***@gw.example/api", "g4te"),
        ("postgresql://u:pw9@[::1/db", "u:***@", "pw9"),  # not even a valid URL
        ("failed for url 'http://u:pw8@h:80/x'", "http://u:***@h:80/x", "pw8"),
        ("postgresql://u:pa/ss@db/ev", "postgresql://u:***@db/ev", "pa/ss"),
        ("amqp://guest:a?b#c@rabbit/v", "amqp://guest:***@rabbit/v", "a?b#c"),
        ('{"url": "amqp://g:x/y@h/v", "n": 1}', '"amqp://g:***@h/v", "n": 1}', "x/y"),
        ("postgresql://u:pa'ss@h/db", "postgresql://u:***@h/db", "pa'ss"),
        ('postgresql://u:p"a<s>s@h/db', "postgresql://u:***@h/db", 'p"a<s>s'),
    ],
)
def test_redact_hides_every_password_of_a_url(url: str, shown: str, hidden: str) -> None:
    assert shown in redact(url)
    assert hidden not in redact(url)


@pytest.mark.parametrize(
    "url",
    [
        "memory://",
        "sqlite:///var/x.sqlite",
        "postgresql://alice@db/ev?sslmode=require",
        "http://gw.example:8080/workspaces/ws-1",
        "see http://a:1/x and http://b/y@z",
    ],
)
def test_redact_leaves_urls_without_passwords_alone(url: str) -> None:
    assert redact(url) == url


def test_a_gateway_failure_names_the_gateway_without_its_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PROVISIONER_GATEWAY_URL", "https://svc:g4te-pw@gw.example/api")
    request = httpx.Request("GET", "https://svc:g4te-pw@gw.example/api/workspaces")
    failure = describe(httpx.ConnectError("connection refused", request=request))

    assert "https://svc:***@gw.example/api" in str(failure)
    assert "g4te-pw" not in str(failure)


def service() -> ProvisioningService:
    return ProvisioningService(open_event_store("memory://"), gateway=None, secrets=(TOKEN,))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("brand_id", "title", "parent", "field"),
    [
        (f"b-{TOKEN}", "Acme", "parent", "brand_id"),
        ("b1", f"Acme {TOKEN}", "parent", "title"),
        ("b1", "Acme", TOKEN, "parent_workspace_id"),
    ],
)
def test_a_provision_holding_the_token_is_refused_without_echoing_it(
    brand_id: str, title: str, parent: str, field: str
) -> None:
    svc = service()
    with pytest.raises(InvalidRequest) as caught:
        svc.request_provisioning(brand_id, title, parent)

    assert field in str(caught.value)
    assert TOKEN not in str(caught.value)
    assert svc.app.recorder.max_notification_id() in (None, 0)  # nothing stored


def test_a_deactivate_holding_the_token_is_refused_without_echoing_it() -> None:
    svc = service()
    with pytest.raises(InvalidRequest) as caught:
        svc.deactivate(f"{TOKEN}-brand")
    assert TOKEN not in str(caught.value)
    assert svc.app.recorder.max_notification_id() in (None, 0)  # no tombstone either


def test_the_consumer_dead_letters_a_command_holding_the_token() -> None:
    with pytest.raises(DeadLetter) as caught:
        _handle(service(), messages.provision("b1", f"x{TOKEN}x", "parent"))
    assert caught.value.reason == "InvalidRequest"
    assert TOKEN not in str(caught.value.errors)


def test_ordinary_texts_and_short_tokens_are_not_refused() -> None:
    svc = service()
    svc.request_provisioning("b1", "Acme tok-SECRET", "parent")  # a part is no match
    short = ProvisioningService(open_event_store("memory://"), gateway=None, secrets=("t",))  # type: ignore[arg-type]
    short.deactivate("brand-with-a-t")


def test_the_runtime_gives_the_service_the_gateway_token() -> None:
    settings = Settings(
        database_url="memory://",
        broker_url="memory://",
        gateway_url="http://127.0.0.1:9",
        gateway_token=TOKEN,
    )
    with runtime.build(settings, parts=("worker",)) as built:
        assert built.service.secrets == (TOKEN,)
        with pytest.raises(InvalidRequest):
            built.service.request_provisioning("b1", TOKEN, "parent")


@pytest.mark.parametrize(
    ("token", "ensure_ascii"),
    [(TOKEN, True), ('tok-"quoted"\\-5f3a9c', True), ("tok-\u00e9t\u00e9-5f3a9c", True),
     ("tok-\u00e9t\u00e9-5f3a9c", False)],
)  # fmt: skip
def test_a_dead_lettered_body_loses_the_token_it_held(token: str, ensure_ascii: bool) -> None:
    """Raw or as JSON writes it (escaped quotes and backslashes, \\u escapes or not)."""
    publisher = FakePublisher()
    settle = Settler(
        publisher,  # type: ignore[arg-type]
        stats=WorkerStats(),
        retry_delays_s=(1.0,),
        connection_errors=(ConnectionError,),
        database=Outage(logging.getLogger("test"), "worker", "db", announce_start=False),
        dead_letter=DeadLetter,
        secrets=(token,),
    )
    fields = {"type": "provision", "version": 1, "brand_id": "b1", "title": f"x{token}x",
              "parent_workspace_id": "p"}  # fmt: skip
    message = FakeMessage(json.dumps(fields, ensure_ascii=ensure_ascii).encode())
    delivery = settle.read(message, messages.HOPS_QUEUE)
    assert delivery is not None
    svc = ProvisioningService(open_event_store("memory://"), gateway=None, secrets=(token,))  # type: ignore[arg-type]
    refused: Future[str] = Future()
    try:
        _handle(svc, delivery.message)
    except DeadLetter as exc:
        refused.set_exception(exc)
    settle.settle(message, Delivery(delivery.message, 0), refused)

    [(dead_body, reason, errors, _)] = publisher.dead
    assert reason == "InvalidRequest"
    assert token not in json.loads(dead_body)["title"]
    assert json.loads(dead_body)["title"] == "x***x"  # the rest is kept for the operator
    assert token not in json.dumps(errors, ensure_ascii=False)
