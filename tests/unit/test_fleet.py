"""The fleet: per-process beats, what the deployment's liveness comes to (a table of
states and verdicts), the gateway that never answered, and the workers view."""

from __future__ import annotations

import logging
import socket
import sqlite3
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from domain.liveness import Beat, FleetVerdict, gateway_silence, newest, workers_verdict
from domain.ports import TransientGatewayError, WorkspaceGone
from infrastructure.gateway.contact import GatewayContact, cause
from infrastructure.settings.model import Settings
from infrastructure.views.connection import ViewConnection
from infrastructure.views.heartbeats import Heartbeat, read_beats, read_processes
from worker.fleet import fleet_rows
from worker.gateway_watch import GatewayWatch
from worker.health.checks import GatewayCheck, stuck_check
from worker.health.liveness import as_warning, fleet_checks, heartbeat_check, workers_check
from worker.health.report import gateway_check
from worker.health.results import Degraded, Unhealthy

NOW = 1_900_000_000.0
MAX_AGE = 60.0


def worker(at: float, process: str = "w1:7", *, in_flight: int = 0) -> Beat:
    return Beat("worker", process, at - 100, at, "w1", 7, "0.1.0", 8, in_flight, 12)


def verdict(state: dict[str, Any]) -> FleetVerdict:
    """The deployment's verdict on its workers and its gateway, as `health` makes it:
    the worse of the two."""
    judged = workers_verdict(state["workers"], NOW, MAX_AGE, state["pending"], state["queued"])
    gateway = FleetVerdict.OK
    if not state["gateway_answers_now"]:
        gateway = gateway_silence(state["gateway_ever_answered"])
    order = [FleetVerdict.OK, FleetVerdict.DEGRADED, FleetVerdict.FAILING]
    return max(judged.verdict, gateway, key=order.index)


GATEWAY_OK = {"gateway_answers_now": True, "gateway_ever_answered": True}
TABLE: list[tuple[str, dict[str, Any], FleetVerdict]] = [
    ("no work and no worker ever", {"workers": [], "pending": 0, "queued": 0, **GATEWAY_OK},
     FleetVerdict.OK),
    ("no work and the workers gone", {"workers": [worker(NOW - 600)], "pending": 0, "queued": 0,
                                      **GATEWAY_OK}, FleetVerdict.OK),
    ("attempts pending, a worker alive", {"workers": [worker(NOW - 3)], "pending": 5,
                                          "queued": None, **GATEWAY_OK}, FleetVerdict.OK),
    ("attempts pending, no worker beat", {"workers": [worker(NOW - 600)], "pending": 1,
                                          "queued": 0, **GATEWAY_OK}, FleetVerdict.FAILING),
    ("commands queued, no worker ever", {"workers": [], "pending": 0, "queued": 3, **GATEWAY_OK},
     FleetVerdict.FAILING),
    ("attempts pending, the queues unknown, no worker", {"workers": [], "pending": 2,
                                                         "queued": None, **GATEWAY_OK},
     FleetVerdict.FAILING),
    ("gateway never answered", {"workers": [worker(NOW)], "pending": 0, "queued": 0,
                                "gateway_answers_now": False, "gateway_ever_answered": False},
     FleetVerdict.FAILING),
    ("gateway answered once, now silent", {"workers": [worker(NOW)], "pending": 0, "queued": 0,
                                           "gateway_answers_now": False,
                                           "gateway_ever_answered": True}, FleetVerdict.DEGRADED),
]  # fmt: skip


@pytest.mark.parametrize(("state", "expected"), [(s, v) for _, s, v in TABLE],
                         ids=[name for name, _, _ in TABLE])  # fmt: skip
def test_the_deployments_verdict_in_every_state(
    state: dict[str, Any], expected: FleetVerdict
) -> None:
    assert verdict(state) is expected


def test_no_worker_alive_while_work_waits_says_what_waits_and_who_beat_last() -> None:
    judged = workers_verdict([worker(NOW - 600, "host-a:41")], NOW, MAX_AGE, 3, 2)
    assert judged.detail == (
        "no worker alive: 3 attempts pending, 2 messages queued, last worker beat 10 min ago "
        "(host-a:41); start `provisioner worker`"
    )
    assert judged.since == NOW - 600 + MAX_AGE
    never = workers_verdict([], NOW, MAX_AGE, 1, None)
    assert "no worker has ever beaten in this database" in never.detail
    alive = workers_verdict([worker(NOW - 1, in_flight=3), worker(NOW - 900, "old:1")], NOW,
                            MAX_AGE, 9, 9)  # fmt: skip
    assert alive.detail == "1 alive (8 threads, 3 in flight)"


def facts(processes: list[Beat] | None, pending: int = 0) -> Any:
    found = {"processes": processes, "pending": pending,
             "heartbeats": newest(processes or [])}  # fmt: skip
    return lambda: found


def test_the_workers_check_reads_the_queues_only_when_no_worker_is_alive() -> None:
    asked: list[bool] = []

    def queued() -> int:
        asked.append(True)
        return 4

    alive = workers_check(facts([worker(NOW - 1)], 1), MAX_AGE, queued, clock=lambda: NOW)
    assert alive().startswith("1 alive")
    assert not asked
    gone = workers_check(facts([worker(NOW - 300)], 0), MAX_AGE, queued, clock=lambda: NOW)
    with pytest.raises(Unhealthy, match="no worker alive: 4 messages queued") as failed:
        gone()
    assert not isinstance(failed.value, Degraded)
    assert failed.value.since == datetime.fromtimestamp(NOW - 240, UTC)
    assert asked

    def broken() -> int:
        raise ConnectionRefusedError("down")

    idle = workers_check(facts([], 0), MAX_AGE, broken, clock=lambda: NOW)
    assert idle().startswith("no worker alive, and no work waits")
    assert workers_check(facts(None), MAX_AGE)() == "not tracked in an in-process store"


def test_a_part_waited_on_only_degrades_and_each_process_checks_the_workers() -> None:
    silent = {"relay": Beat("relay", "r:1", NOW - 500, NOW - 400)}
    check = heartbeat_check(lambda: {"heartbeats": silent}, "relay", MAX_AGE, clock=lambda: NOW)
    with pytest.raises(Unhealthy):
        check()
    with pytest.raises(Degraded, match="the relay has not beaten for 400 s") as warned:
        as_warning(check)()
    assert warned.value.since == datetime.fromtimestamp(NOW - 340, UTC)

    def names(*parts: str) -> list[str]:
        return [name for name, _ in fleet_checks(facts([]), parts, MAX_AGE)]

    assert names("worker") == ["relay_heartbeat", "reconciler_heartbeat", "workers"]
    assert names("relay") == ["relay_heartbeat", "workers"]
    assert names("reconciler") == ["relay_heartbeat", "projections_heartbeat",
                                   "reconciler_heartbeat", "workers"]  # fmt: skip
    assert names("projections") == ["projections_heartbeat"]


class Probe:
    """A status reader that answers as told; notes an answer as the adapter would."""

    def __init__(self, contact: GatewayContact, answers: list[int | None]) -> None:
        self.contact = contact
        self.answers = answers

    def status(self, workspace_id: str) -> str:
        code = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        self.contact.note(code)
        if code == 404:
            raise WorkspaceGone(f"{workspace_id}: HTTP 404")
        if code is None:
            raise TransientGatewayError("status: ConnectError: [Errno 111] Connection refused")
        raise TransientGatewayError(f"status: HTTP {code} after 3 attempt(s)")


def test_the_gateway_check_fails_until_any_process_had_an_answer_then_degrades() -> None:
    contact = GatewayContact()
    fleet: list[bool] = [False]  # what the beats of the other processes say

    def answered() -> bool:
        return contact.answered_at is not None or fleet[0]

    def check(answers: list[int | None]) -> GatewayCheck:
        return GatewayCheck(Probe(contact, answers), ttl_s=0, answered=answered,
                            url="https://user:pw@gw.example:8443/")  # fmt: skip

    with pytest.raises(Unhealthy) as never:
        check([None])()
    assert not isinstance(never.value, Degraded)
    assert str(never.value) == (
        "the gateway at https://user:***@gw.example:8443/ has never answered any process of "
        "this deployment, nor this check (connection refused): check PROVISIONER_GATEWAY_URL"
    )
    fleet[0] = True  # another process had an answer: this silence is an outage
    with pytest.raises(Degraded, match="no answer"):
        check([None])()
    fleet[0] = False
    with pytest.raises(Degraded, match="HTTP 503"):  # a 503 is an answer: an outage
        check([503])()
    assert contact.answered_at is not None
    assert check([404])() == "reachable, token accepted"


@pytest.mark.parametrize(("text", "said"), [
    ("ConnectError: [Errno 111] Connection refused", "connection refused"),
    ("ConnectError: [Errno -2] Name or service not known", "the name does not resolve (DNS)"),
    ("ConnectError: [SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1000)",
     "the TLS handshake failed: is it a plain http:// server?"),
    ("ConnectTimeout: timed out", "timed out"),
    ("something else entirely", "something else entirely"),
])  # fmt: skip
def test_a_silence_is_worded_by_its_cause(text: str, said: str) -> None:
    assert cause(f"status: {text} after 3 attempt(s)") == said or cause(text) == said


def test_the_watch_logs_an_error_while_the_gateway_never_answered_then_one_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    contact = GatewayContact()
    probe = Probe(contact, [None, None, 404])
    watch = GatewayWatch(probe, contact, "http://127.0.0.1:9/", every_s=0.05)
    stop = threading.Event()
    with caplog.at_level(logging.INFO, "provisioner.gateway.lifecycle"):
        watch.run(stop)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines[:2] == [("ERROR", "the gateway at http://127.0.0.1:9/ has never answered since "
                          "this process started (connection refused); check "
                          "PROVISIONER_GATEWAY_URL")] * 2  # fmt: skip
    assert lines[2:] == [("INFO", "the gateway at http://127.0.0.1:9/ answered now; it is "
                          "reachable")]  # fmt: skip


def test_each_process_beats_its_own_row_and_a_component_lives_by_its_newest(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    first, second = iter([100.0, 101.0]), iter([200.0, 201.0])
    one = Heartbeat(url, "worker", every_s=0, clock=lambda: next(first),
                    gauges=lambda: (8, 2, 40), answered_at=lambda: 150.0)  # fmt: skip
    two = Heartbeat(url, "worker", every_s=0, clock=lambda: next(second))
    two.process = "other-host:9"
    assert one.beat()  # started 100, beat 101
    assert two.beat()  # started 200, beat 201
    with ViewConnection(url) as conn:
        rows = read_processes(conn)
        assert [(b.process, b.beat_at) for b in rows] == [("other-host:9", 201.0),
                                                          (one.process, 101.0)]  # fmt: skip
        mine = rows[1]
        assert (mine.concurrency, mine.in_flight, mine.handled) == (8, 2, 40)
        assert mine.gateway_answered_at == 150.0
        assert mine.version
        assert (mine.host, mine.pid) == (one.host, one.pid)
        assert rows[0].concurrency is None
        assert read_beats(conn)["worker"].process == "other-host:9"
    one.close()
    two.close()
    late = Heartbeat(url, "relay", every_s=0, clock=lambda: 101.0 + 86_400 + 1)
    assert late.beat()  # a process's first beat prunes rows a day old
    with ViewConnection(url) as conn:
        assert [b.component for b in read_processes(conn)] == ["relay", "worker"]
    late.close()


def test_the_rows_of_the_view_say_alive_or_silent() -> None:
    rows = fleet_rows([worker(NOW - 3), worker(NOW - 90, "w2:8"),
                       Beat("relay", "r:1", NOW - 50, NOW - 1)], NOW, MAX_AGE)  # fmt: skip
    assert [(r["kind"], r["process"], r["state"]) for r in rows] == [
        ("relay", "r:1", "alive"), ("worker", "w1:7", "alive"), ("worker", "w2:8", "silent"),
    ]  # fmt: skip
    assert rows[1]["last_beat_s"] == 3
    assert rows[1]["handled"] == 12
    assert rows[0]["concurrency"] is None


def test_the_health_pages_gateway_check_reads_the_beats_itself(tmp_path: Path) -> None:
    """`gateway_check` without facts (the web view's health page): a gateway nothing
    answers fails while no beat says it ever answered, and degrades once one does."""
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed
    settings = Settings.from_env({"PROVISIONER_DATABASE_URL": url, "PROVISIONER_GATEWAY_URL":
                                  closed, "PROVISIONER_GATEWAY_TOKEN": "t0ken-page"})  # fmt: skip
    sqlite3.connect(tmp_path / "events.sqlite").close()  # a database no process beat in
    with pytest.raises(Unhealthy, match="has never answered any process") as never:
        gateway_check(settings)()
    assert not isinstance(never.value, Degraded)
    worker = Heartbeat(url, "worker", every_s=0, answered_at=lambda: 1.0)
    assert worker.beat()
    worker.close()
    with pytest.raises(Degraded, match="no answer"):
        gateway_check(settings)()


def test_stuck_attempts_do_not_read_well_while_no_worker_can_run_them() -> None:
    found = {"pending": 2, "stuck": 0, "oldest_stuck_due": None, "oldest_stuck_id": None,
             "processes": [worker(time.time() - 600)]}  # fmt: skip
    with pytest.raises(Degraded, match="no worker is alive to run them"):
        stuck_check(lambda: found, 900, MAX_AGE)()
    found["processes"] = [worker(time.time())]
    assert stuck_check(lambda: found, 900, MAX_AGE)().startswith("none of 2 pending attempts")
    found["pending"], found["processes"] = 0, []
    assert stuck_check(lambda: found, 900, MAX_AGE)().startswith("none of 0 pending attempts")
