"""Secrets never reach a message, a log line or an event: URLs are redacted, and a
producer's text that holds the gateway token is refused without being echoed. A known
secret pushed through every path that shows text (libpq's parse error, log lines and
tracebacks, command output and error lines, `/readyz`, the web pages, dead letters)
is found in none of them."""

from __future__ import annotations

import io
import json
import logging
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from domain.errors import InvalidRequest
from domain.ports import Unauthorized
from infrastructure.broker import messages
from infrastructure.failures import ConfigurationError
from infrastructure.outages import Outage
from infrastructure.redaction import redact
from infrastructure.service import ProvisioningService
from infrastructure.settings.model import Settings, log_secrets
from infrastructure.settings.parsing import SettingsError
from infrastructure.store.eventstore import check_database_url, init_database, open_event_store
from infrastructure.views.store import SqlViewStore
from tests.memory_gateway import MemoryGateway
from tests.support import FakeMessage, RecordingBroker, new_service, settler
from worker import logs, runtime
from worker.cli import read as cli_read
from worker.cli.main import main
from worker.consumer import WorkerStats
from worker.delivery import Settler
from worker.edges import describe
from worker.handlers import handle
from worker.health.probes import Probes
from worker.health.results import Health
from worker.projector import Projector
from worker.reading import Delivery
from worker.retry_policy import DeadLetter
from worker.web.app import create_app

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
    svc = new_service(secrets=(TOKEN,))
    with pytest.raises(InvalidRequest) as caught:
        svc.request_provisioning(brand_id, title, parent)

    assert field in str(caught.value)
    assert TOKEN not in str(caught.value)
    assert svc.app.recorder.max_notification_id() in (None, 0)  # nothing stored


def test_a_deactivate_holding_the_token_is_refused_without_echoing_it() -> None:
    svc = new_service(secrets=(TOKEN,))
    with pytest.raises(InvalidRequest) as caught:
        svc.deactivate(f"{TOKEN}-brand")
    assert TOKEN not in str(caught.value)
    assert svc.app.recorder.max_notification_id() in (None, 0)  # no tombstone either


def test_the_consumer_dead_letters_a_command_holding_the_token() -> None:
    with pytest.raises(DeadLetter) as caught:
        handle(new_service(secrets=(TOKEN,)), messages.provision("b1", f"x{TOKEN}x", "parent"))
    assert caught.value.reason == "InvalidRequest"
    assert TOKEN not in str(caught.value.errors)


def test_ordinary_texts_and_short_tokens_are_not_refused() -> None:
    svc = new_service(secrets=(TOKEN,))
    svc.request_provisioning("b1", "Acme tok-SECRET", "parent")  # a part is no match
    short = new_service(secrets=("t",))
    short.deactivate("brand-with-a-t")


def test_the_runtime_gives_the_service_the_gateway_token() -> None:
    settings = Settings(
        database_url="memory://",
        broker_url="memory://",
        gateway_url="http://127.0.0.1:9",
        gateway_token=TOKEN,
        parent_ids=("parent",),
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
    publisher = RecordingBroker()
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
    svc = new_service(secrets=(token,))
    refused: Future[str] = Future()
    try:
        handle(svc, delivery.message)
    except DeadLetter as exc:
        refused.set_exception(exc)
    settle.settle(message, Delivery(delivery.message, 0), refused)

    [(dead_body, reason, errors, _)] = publisher.dead
    assert reason == "invalid_request"
    assert token not in json.loads(dead_body)["title"]
    assert json.loads(dead_body)["title"] == "x***x"  # the rest is kept for the operator
    assert token not in json.dumps(errors, ensure_ascii=False)


# -- every path that shows text ---------------------------------------------------------

SPACED = "pa ss-5f3a9c"  # a password libpq repeats when it cannot parse the URL
QUOTED_USER_URL = 'postgresql://u"q:pw-quoted-5f3a9c@127.0.0.1:1/db'
WEB_TOKEN = "web-SECRET-77d0e1"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u:{SPACED}@db/ev",  # "unexpected spaces found in ..."
        "postgresql://u:pa%zz-5f3a9c@db/ev",  # "invalid percent-encoded token: ..."
        f"postgresql://u:{SPACED}@db/ev?bogus=1",
    ],
)
def test_libpqs_parse_error_never_repeats_the_password(url: str) -> None:
    password = url.split(":", 2)[2].split("@", 1)[0]
    with pytest.raises(ConfigurationError) as caught:
        check_database_url(url)
    with pytest.raises(SettingsError) as settings:
        Settings.from_env({"PROVISIONER_DATABASE_URL": url})

    for message in (str(caught.value), str(settings.value)):
        assert password not in message
        assert "in the database URL postgresql://u:***@db/ev" in message


@pytest.mark.parametrize(
    ("url", "password"),
    [(f"postgresql://u:{SPACED}@127.0.0.1:1/db", SPACED),
     (QUOTED_USER_URL, "pw-quoted-5f3a9c")],
)  # fmt: skip
def test_a_password_the_pattern_misses_is_hidden_by_its_value(url: str, password: str) -> None:
    """A password with a space, or after a user name with a quote: logged, in a
    traceback, or in the one line a command fails with."""
    env = {"PROVISIONER_DATABASE_URL": url, "PROVISIONER_CONNECT_WAIT_S": "0"}
    assert password in redact(url)  # what the pattern alone leaves
    assert password in log_secrets(env)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.Redact(log_secrets(env)))
    logger = logging.getLogger("test.secrets")
    logger.addHandler(handler)
    try:
        try:
            raise RuntimeError(f"refused {url}")  # noqa: TRY301 - a traceback to log
        except RuntimeError:
            logger.exception("connected to %s", url)
    finally:
        logger.removeHandler(handler)

    result = CliRunner(env=env).invoke(main, ["status", "b1"])

    assert "Traceback" in stream.getvalue()
    assert password not in stream.getvalue()
    assert result.exit_code != 0
    assert result.output.startswith("Error: ")
    assert password not in result.output


def test_a_debug_traceback_and_the_error_line_hold_no_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"PROVISIONER_GATEWAY_TOKEN": TOKEN, "PROVISIONER_DATABASE_URL": QUOTED_USER_URL}

    def boom(**_: Any) -> Any:
        raise RuntimeError(f"boom {TOKEN} at {QUOTED_USER_URL}")

    monkeypatch.setattr(cli_read, "service_only", boom)
    debug = CliRunner(env=env).invoke(main, ["--debug", "status", "b1"])
    plain = CliRunner(env=env).invoke(main, ["status", "b1"])

    assert "Traceback" in debug.stderr
    assert "boom *** at" in debug.stderr
    assert plain.stderr.startswith("Error: unexpected RuntimeError: boom *** at")
    for result in (debug, plain):
        assert result.exit_code == 1
        assert TOKEN not in result.output
        assert "pw-quoted-5f3a9c" not in result.output


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def cli_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'events.sqlite'}"
        init_database(url)
        return url
    pg: str = request.getfixturevalue("pg_database")
    return pg


def test_provision_refuses_the_token_in_a_title_and_stores_nothing(cli_database: str) -> None:
    env = {
        "PROVISIONER_DATABASE_URL": cli_database,
        "PROVISIONER_GATEWAY_URL": "http://127.0.0.1:9",
        "PROVISIONER_GATEWAY_TOKEN": TOKEN,
        "PROVISIONER_PARENT_IDS": "parent",
    }
    app = open_event_store(cli_database)
    try:
        before = app.recorder.max_notification_id()
        refused = CliRunner(env=env).invoke(
            main, ["provision", "b-token-title", "--title", f"Acme {TOKEN}", "--parent", "parent"]
        )
        after = app.recorder.max_notification_id()
    finally:
        app.close()

    assert refused.exit_code == 1, refused.output
    assert refused.output.strip().splitlines() == [
        "Error: title contains the gateway token: refused, not stored"
    ]
    assert after == before  # not one event


def stored_with_token(directory: Path) -> tuple[str, str]:
    """A SQLite store (read models caught up) holding the token in a title and in a
    failure's message, as a service told of no secret stored them; the attempt id."""
    url = f"sqlite:///{directory / 'events.sqlite'}"
    init_database(url)
    with SqlViewStore(url) as store:
        store.setup()
    app = open_event_store(url)
    try:
        gateway = MemoryGateway("parent")
        gateway.fail["family"] = [Unauthorized(f"401 for token {TOKEN}")] * 3
        service = ProvisioningService(app, gateway)
        attempt = service.request_provisioning("b-leak", f"Acme {TOKEN}", "parent")
        service.run_hop(attempt, 0)
        with SqlViewStore(url) as store:
            Projector(app, url, database_url=url).step(store)
    finally:
        app.close()
    return url, str(attempt)


@pytest.fixture
def leaky(tmp_path: Path) -> tuple[str, str]:
    return stored_with_token(tmp_path)


@pytest.mark.parametrize(
    "args",
    [["status", "b-leak"], ["history", "b-leak"], ["attempt", "{attempt}"],
     ["attempts", "--wide"], ["attempts"]],
)  # fmt: skip
@pytest.mark.parametrize("as_json", [False, True])
def test_the_read_commands_never_print_a_stored_token(
    leaky: tuple[str, str], args: list[str], as_json: bool
) -> None:
    url, attempt = leaky
    env = {"PROVISIONER_DATABASE_URL": url, "PROVISIONER_GATEWAY_TOKEN": TOKEN,
           "COLUMNS": "60"}  # fmt: skip
    argv = [arg.format(attempt=attempt) for arg in args] + (["--json"] if as_json else [])
    result = CliRunner(env=env).invoke(main, argv)

    assert result.exit_code == 0, result.output
    assert TOKEN not in result.output
    assert TOKEN[:8] not in result.output.replace("\n", "")  # nor folded across lines
    assert "***" in result.output


def test_the_web_pages_never_show_a_stored_token(leaky: tuple[str, str]) -> None:
    url, _ = leaky
    settings = Settings.from_env({"PROVISIONER_DATABASE_URL": url,
                                  "PROVISIONER_GATEWAY_TOKEN": TOKEN})  # fmt: skip
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8080") as web:
        pages = [web.get("/"), web.get("/brands/b-leak")]

    for page in pages:
        assert page.status_code == 200
        assert TOKEN not in page.text
        assert "Acme ***" in page.text


def test_readyz_never_shows_a_secret() -> None:
    def failing() -> str:
        raise RuntimeError(f"refused token={TOKEN} at {QUOTED_USER_URL}")

    settings = Settings(gateway_token=TOKEN, database_url=QUOTED_USER_URL, web_token=WEB_TOKEN)
    probes = Probes(health=Health([("database", failing)]), token=WEB_TOKEN,
                    secrets=settings.secrets())  # fmt: skip
    status: list[str] = []
    environ = {"PATH_INFO": "/readyz", "HTTP_AUTHORIZATION": f"Bearer {WEB_TOKEN}"}
    body = b"".join(probes(environ, lambda s, _headers: status.append(s)))

    assert status == ["503 Service Unavailable"]
    assert b"refused token=***" in body
    for secret in (TOKEN, "pw-quoted-5f3a9c", WEB_TOKEN):
        assert secret.encode() not in body


LONG_TOKEN = "tok-" + "5f3a9c0d" * 8  # longer than the 50 characters an error keeps


def told(publisher: RecordingBroker, token: str) -> Settler:
    """A settler told of the token, as the worker's is."""
    return settler(publisher, (1.0,), connection_errors=(ConnectionError,), secrets=(token,))


@pytest.mark.parametrize(
    ("token", "fields"),
    [
        (TOKEN, {"type": TOKEN, "version": 1}),
        (LONG_TOKEN, {"type": LONG_TOKEN, "version": 1}),  # cut to 50 characters
        (TOKEN, {"type": "provision", "version": 1, "brand_id": "b1", "title": "t",
                 "parent_workspace_id": "p", TOKEN: 1}),  # a field name
    ],
)  # fmt: skip
def test_dead_letter_errors_lose_a_token_given_as_a_type_or_a_field_name(
    token: str, fields: dict[str, Any]
) -> None:
    body = json.dumps(fields).encode()
    with pytest.raises(messages.InvalidMessage) as caught:
        messages.decode(body)
    assert token[:40] in json.dumps(caught.value.errors)  # what the worker is handed
    publisher = RecordingBroker()

    told(publisher, token).dead(FakeMessage(body), caught.value.reason, caught.value.errors)

    [(dead_body, reason, errors, source)] = publisher.dead
    for shown in (dead_body.decode(), reason, json.dumps(errors), source):
        assert token[:20] not in shown
    assert "***" in json.dumps(errors)


@pytest.mark.parametrize(
    "title",
    ["x" + "".join(f"\\u{ord(c):04x}" for c in TOKEN) + "x",
     "x" + "".join(f"\\u{ord(c):04X}" for c in TOKEN) + "x",
     "x\\u0074ok-SECRET-5f3a9\\u0063x"],  # some characters escaped only
)  # fmt: skip
def test_a_dead_lettered_body_loses_a_u_escaped_token(title: str) -> None:
    body = ('{"type": "provision", "version": 1, "brand_id": "b1", "title": "' + title
            + '", "parent_workspace_id": "p"}').encode()  # fmt: skip
    assert json.loads(body)["title"] == f"x{TOKEN}x"
    publisher = RecordingBroker()

    told(publisher, TOKEN).dead(FakeMessage(body), "InvalidRequest", {})

    [(dead_body, _, _, _)] = publisher.dead
    assert json.loads(dead_body)["title"] == "x***x"


def test_a_dead_letter_is_shown_without_the_token() -> None:
    """What `dead-letters list/show` and the web page show of one the queue
    dead-lettered itself (nobody scrubbed it), and what a replay still sends."""
    from infrastructure.broker.dead_letter_parsing import parse

    body = json.dumps({"title": f"x{TOKEN}x"}).encode()
    headers = {"x-dead-reason": "InvalidRequest", "x-dead-errors": json.dumps({TOKEN: TOKEN}),
               "x-producer": TOKEN}  # fmt: skip
    letter = parse(body, headers)
    shown = letter.scrubbed(Settings(gateway_token=TOKEN).secrets())

    assert TOKEN not in json.dumps(shown.summary(0.0)) + shown.body.decode()
    assert TOKEN not in json.dumps(shown.headers)
    assert shown.errors == {"***": "***"}
    assert letter.body == body  # the replay sends the message as it came
