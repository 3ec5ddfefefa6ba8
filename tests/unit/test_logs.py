"""Log lines (worker/logs.py): JSON or text, the level of each hop decision, and a
known secret pushed through every path that logs never reaches a line."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from uuid import uuid4

import httpx
import pytest

from domain.outcomes import HopOutcome, Outcome, StandDown
from domain.policies import FailureReason
from domain.ports import TransientGatewayError, Unauthorized
from infrastructure.failures import ConfigurationError
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.outages import Outage
from infrastructure.service import hop_line
from infrastructure.settings.model import Settings, log_format, log_secrets
from infrastructure.settings.parsing import SettingsError
from tests.memory_gateway import MemoryGateway
from tests.support import FakeMessage, RecordingBroker, drive, new_service, pace_rules, settler
from worker import logs

TOKEN = "tok-LOGSECRET-93ab1"
PASSWORD = "pw-LOGSECRET-77"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """The process's logging as `provisioner` sets it up (JSON, DEBUG), into a buffer."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    stream = io.StringIO()
    handler = logs.setup(logging.DEBUG, "json", [TOKEN], stream=stream)
    assert handler is not None
    yield stream
    root.removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_json_line_has_every_field(captured: io.StringIO) -> None:
    logging.getLogger("provisioner.engine").info(
        "hop done", extra={"brand": "b1", "attempt": "a1", "hop": 2, "outcome": "scheduled"}
    )
    logging.getLogger("provisioner.worker").warning("plain %s", "words")

    first, second = lines(captured)
    assert set(first) == {"time", "level", "logger", "brand", "attempt", "hop", "outcome",
                          "reason", "message"}  # fmt: skip
    assert first["level"] == "INFO"
    assert first["logger"] == "provisioner.engine"
    assert (first["brand"], first["attempt"], first["hop"]) == ("b1", "a1", 2)
    assert first["reason"] is None
    assert second["message"] == "plain words"


def test_auto_is_text_on_a_terminal_and_json_elsewhere() -> None:
    assert isinstance(logs.formatter("auto", io.StringIO()), logs.JsonFormatter)
    assert not isinstance(logs.formatter("auto", Tty()), logs.JsonFormatter)
    assert not isinstance(logs.formatter("text", io.StringIO()), logs.JsonFormatter)
    assert isinstance(logs.formatter("json", Tty()), logs.JsonFormatter)


def test_the_log_format_setting_is_checked() -> None:
    assert log_format({}) == "auto"
    assert Settings.from_env({"PROVISIONER_LOG_FORMAT": "JSON"}).log_format == "json"
    with pytest.raises(SettingsError, match="PROVISIONER_LOG_FORMAT must be one of"):
        Settings.from_env({"PROVISIONER_LOG_FORMAT": "xml"})
    with pytest.raises(SettingsError, match="PROVISIONER_LOG_FORMAT is set but empty"):
        log_format({"PROVISIONER_LOG_FORMAT": " "})
    assert log_secrets({"PROVISIONER_GATEWAY_TOKEN": TOKEN}) == (TOKEN,)


def outcome(
    kind: Outcome,
    detail: str,
    stand_down: StandDown | None = None,
    failure: FailureReason | None = None,
) -> HopOutcome:
    return HopOutcome(kind, uuid4(), "b1", 1, detail, stand_down=stand_down, failure=failure)


@pytest.mark.parametrize(
    ("hop", "level", "reason"),
    [
        (outcome(Outcome.FAILED, "unauthorized: gateway refused: x",
                 failure=FailureReason.UNAUTHORIZED), logging.ERROR, "unauthorized"),
        (outcome(Outcome.FAILED, "terminal_status: failed", failure=FailureReason.TERMINAL_STATUS),
         logging.ERROR, "terminal_status"),
        # The kind decides, never the detail's words.
        (outcome(Outcome.FAILED, "unauthorized: reworded", failure=FailureReason.DEADLINE),
         logging.ERROR, "deadline"),
        (outcome(Outcome.FAILED, "", failure=FailureReason.INTERNAL_ERROR), logging.ERROR,
         "internal_error"),
        # A deferral is INFO: the pace logs the outage once, when its circuit opens.
        (outcome(Outcome.DEFERRED, "gateway unavailable: create: throttled (HTTP 429)"),
         logging.INFO, "deferred"),
        (outcome(Outcome.SCHEDULED, "gateway unavailable: status: timed out"), logging.INFO,
         None),
        (outcome(Outcome.SCHEDULED, "provisioning"), logging.INFO, None),
        (outcome(Outcome.PROMOTED, ""), logging.INFO, None),
        (outcome(Outcome.STOOD_DOWN, "", StandDown.CANCELLED), logging.INFO, "cancelled"),
        (outcome(Outcome.DUPLICATE, "hop 1 already done", StandDown.STALE_HOP), logging.INFO,
         "stale_hop"),
    ],
)  # fmt: skip
def test_each_hop_decision_has_its_level(hop: HopOutcome, level: int, reason: str | None) -> None:
    assert hop_line(hop)[:2] == (level, reason)
    assert ("rotate" in hop_line(hop)[2]) == (reason == "unauthorized")


def test_a_known_secret_never_reaches_a_line(captured: io.StringIO) -> None:
    url = f"amqp://guest:{PASSWORD}@rabbit:5672/v"

    # Gateway errors: a retried call whose failure names the token and a URL's password.
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"refused for https://svc:{PASSWORD}@gw/ Bearer {TOKEN}",
                                 request=request)  # fmt: skip

    with HttpGateway("http://gw.test", TOKEN, retries=1, retry_backoff_s=0,
                     transport=httpx.MockTransport(refuse)) as gateway:  # fmt: skip
        gateway._sleep = lambda _s: None
        with pytest.raises(TransientGatewayError):
            gateway.status("ws-1")
    # Settings errors, as a command or a process reports them.
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"PROVISIONER_BROKER_URL": f"ftp://u:{PASSWORD}@h/", "X": TOKEN})
    logging.getLogger("provisioner").error("settings: %s (%s)", caught.value, url)
    # Connection URLs: an outage and its recovery.
    outage = Outage(logging.getLogger("provisioner.connect"), "worker", url)
    outage.failed(url, ConnectionError(f"refused {url} token={TOKEN}"), 1.0)
    outage.up()
    # Dead letters, their errors holding the token and an Authorization header.
    settler(RecordingBroker()).dead(
        FakeMessage(), "unexpected error",
        {"error": f"Authorization: Bearer {TOKEN}", "headers": {"Authorization": TOKEN}},
    )  # fmt: skip
    # Hop logs: a gateway that refuses, its message holding the token.
    memory = MemoryGateway("parent")
    memory.fail["family"] = [Unauthorized(f"401 for token {TOKEN}")] * 3
    memory.creates = [Unauthorized(f"401 for token {TOKEN}")]
    service = new_service(memory)  # type: ignore[arg-type]
    attempt = service.request_provisioning("b1", "Acme", "parent")
    service.run_hop(attempt, 0)
    # A traceback, and an Authorization header in a message.
    try:
        raise RuntimeError(f"boom {TOKEN} at {url}")  # noqa: TRY301 - a traceback to log
    except RuntimeError:
        logging.getLogger("provisioner.worker").exception(
            "crashed; headers %s", {"authorization": f"Basic {TOKEN}"}
        )

    text = captured.getvalue()
    got = lines(captured)
    assert TOKEN not in text
    assert PASSWORD not in text
    assert "guest:***@rabbit" in text
    loggers = {line["logger"] for line in got}
    assert {"infrastructure.gateway.adapter", "provisioner", "provisioner.connect",
            "provisioner.worker", "provisioner.engine"} <= loggers  # fmt: skip
    dead = [x for x in got if "dead-lettered" in str(x["message"])]
    assert dead[0]["level"] == "ERROR"
    assert dead[0]["reason"] == "internal_error"
    hop = [x for x in got if str(x["message"]).startswith("hop done")]
    assert (hop[0]["level"], hop[0]["reason"], hop[0]["hop"]) == ("ERROR", "unauthorized", 0)
    assert any("exception" in x for x in got)


def test_every_handler_gets_the_redaction() -> None:
    other = logging.getLogger("some.library")
    handler = logging.StreamHandler(io.StringIO())
    other.addHandler(handler)
    try:
        logs.protect([TOKEN])
        other.warning("token %s", TOKEN)
        assert TOKEN not in handler.stream.getvalue()
        assert "***" in handler.stream.getvalue()
    finally:
        other.removeHandler(handler)


def test_a_text_line_writes_control_characters_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A terminal gets no escape sequence from an id or a gateway's message; JSON keeps
    the text as it is (json.dumps escapes it)."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    for fmt in ("text", "json"):
        stream = Tty()
        handler = logs.setup(logging.INFO, fmt, [], stream=stream)
        assert handler is not None
        try:
            logging.getLogger("provisioner.test").info("workspace %s", "ws-\x1b[31mred\x07")
        finally:
            root.removeHandler(handler)
        out = stream.getvalue()
        assert "\x1b" not in out
        assert "\x07" not in out
        assert ("ws-\\x1b[31mred\\x07" if fmt == "text" else "ws-\\u001b[31mred\\u0007") in out


def test_each_lifecycle_edge_shows_once_at_the_default_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without -v (root at WARNING): a promotion, and the gateway's circuit closing
    after an outage, each show one line; a hop's routine lines do not."""
    from domain.pacing import Result
    from infrastructure.gateway.pacing import MemoryPaceStore, Pace
    from worker.cli.serve import SHOWN_AT_INFO, show_lifecycle

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    for name in ("provisioner", *(f"provisioner.{n}" for n in SHOWN_AT_INFO)):
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "level", logging.NOTSET)
    stream = io.StringIO()
    handler = logs.setup(logging.WARNING, "json", [], stream=stream)
    assert handler is not None
    show_lifecycle()
    try:
        gateway = MemoryGateway("org-p")
        service = new_service(gateway)
        attempt_id = service.request_provisioning("b1", "Acme", "org-p")
        # Created, a wait for its first poll (a routine line), then promoted.
        ran = [o.outcome for o in drive(service, attempt_id)]
        assert ran == [Outcome.SCHEDULED, Outcome.PROMOTED]
        pace = Pace(MemoryPaceStore(), pace_rules(open_after=1, probe_every_s=0.001),
                    sleep=lambda s: None)  # fmt: skip
        pace.before()
        pace.after(Result.UNREACHABLE, error="503")  # opens the circuit: a WARNING
        pace.before()  # the probe
        pace.after(Result.ANSWERED)  # closes it
        for _ in range(12):  # 429s dense enough to be a rate limit: a rate is learned
            pace.before()
            pace.after(Result.THROTTLED, retry_after_s=0.001)
    finally:
        root.removeHandler(handler)

    shown = [(line["level"], line["message"]) for line in lines(stream)]
    messages = [message for _, message in shown]
    assert sum("brand promoted brand=b1" in m for m in messages) == 1, shown
    assert sum("gateway circuit open" in m for m in messages) == 1, shown
    assert sum("gateway circuit closed" in m for m in messages) == 1, shown
    assert sum("gateway pace learned" in m for m in messages) == 1, shown
    assert len(shown) == 4, shown  # nothing else: a hop's routine lines stay at DEBUG
