"""The command line at its edges: settings, start-up, and every failure in one line.

Start-up cases run the real `provisioner` in a subprocess; the others go
through click's CliRunner.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from infrastructure.failures import (
    EXIT_CONFIGURATION,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    ServiceRefused,
)
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.store.eventstore import open_event_store
from infrastructure.views.store import SqlViewStore
from tests.conftest import PARENT, PG_ADMIN
from tests.integration.cli_support import (
    PROVISIONER,
    clean_env,
    forwarder,
    one_line,
    pg_url,
    run_cli,
)
from tests.readmodels import catch_up_all
from tests.services import free_port
from worker import runtime
from worker.cli.main import main

READ_COMMANDS = [
    ["status", "b1"],
    ["history", "b1"],
    ["attempt", str(uuid.UUID(int=1))],
    ["pointer", "b1", "--at", "now"],
    ["attempts"],
    ["projections", "status"],
]


# --------------------------------------------------------------------------- SQLite, settings


@pytest.mark.parametrize("args", READ_COMMANDS, ids=lambda a: "-".join(a[:2]))
def test_a_read_command_on_a_missing_sqlite_store_creates_nothing(
    tmp_path: Path, args: list[str]
) -> None:
    where = tmp_path / "not-yet" / "events.sqlite"
    runner = CliRunner(env={"PROVISIONER_DATABASE_URL": f"sqlite:///{where}"})

    result = runner.invoke(main, args)

    assert result.exit_code == 1
    assert f"no event store at {where}: run `provisioner db init`" in result.output
    assert not where.parent.exists()


def test_a_read_command_on_an_uninitialised_sqlite_file_creates_no_tables(
    tmp_path: Path,
) -> None:
    where = tmp_path / "events.sqlite"
    where.touch()
    runner = CliRunner(env={"PROVISIONER_DATABASE_URL": f"sqlite:///{where}"})

    for args in READ_COMMANDS:
        result = runner.invoke(main, args)
        assert result.exit_code == 1, (args, result.output)
        assert "run `provisioner db init`" in result.output
    assert where.stat().st_size == 0


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"PROVISIONER_DATABASE_URL": ""}, "PROVISIONER_DATABASE_URL is set but empty"),
        ({"PROVISIONER_CONCURRENCY": ""}, "PROVISIONER_CONCURRENCY is set but empty"),
        (
            {"PROVISIONER_DATABASE_URL": "postgresql://127.0.0.1/x?sslmod=require"},
            'invalid URI query parameter: "sslmod"',
        ),
        ({"PROVISIONER_BROKER_URL": "redis://x/"}, "PROVISIONER_BROKER_URL has scheme 'redis'"),
    ],
)
def test_a_bad_setting_stops_a_command_in_one_line_with_the_configuration_code(
    settings: dict[str, str], says: str
) -> None:
    result = run_cli(clean_env(**settings), "status", "b1")

    assert result.returncode == EXIT_CONFIGURATION
    assert says in one_line(result)


def test_no_gateway_outside_the_embedded_default_refuses_to_start() -> None:
    env = clean_env(
        PROVISIONER_DATABASE_URL=pg_url("any"),
        PROVISIONER_BROKER_URL="amqp://guest:guest@127.0.0.1:5672//",
    )
    for command in ("worker", "run"):
        result = run_cli(env, command)
        assert result.returncode == EXIT_CONFIGURATION
        line = one_line(result)
        assert "PROVISIONER_GATEWAY_URL is not set" in line
        assert "PROVISIONER_FAKE_GATEWAY=1" in line


def test_the_embedded_default_uses_the_fake_only_when_asked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    result = run_cli(clean_env(PROVISIONER_DATABASE_URL=url), "run")
    assert result.returncode == EXIT_CONFIGURATION
    assert "PROVISIONER_FAKE_GATEWAY=1" in one_line(result)

    env = clean_env(PROVISIONER_DATABASE_URL=url, PROVISIONER_FAKE_GATEWAY="1")
    with subprocess.Popen([PROVISIONER, "run"], env=env, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert "running" in proc.stdout.readline()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0


LEFTOVER = "the in-process fake gateway with PostgreSQL/RabbitMQ: this looks like production"


@pytest.mark.parametrize(
    "where",
    [
        {"PROVISIONER_DATABASE_URL": pg_url("any")},
        {"PROVISIONER_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//"},
    ],
)
def test_a_leftover_fake_with_postgresql_or_rabbitmq_refuses_to_start(
    where: dict[str, str], tmp_path: Path
) -> None:
    embedded = {"PROVISIONER_DATABASE_URL": f"sqlite:///{tmp_path / 'events.sqlite'}"}
    env = clean_env(**{**embedded, **where}, PROVISIONER_FAKE_GATEWAY="1")
    real_broker = "PROVISIONER_BROKER_URL" in where  # `worker` refuses memory:// anyway
    for command in ("worker", "run") if real_broker else ("run",):
        result = run_cli(env, command)
        assert result.returncode == EXIT_CONFIGURATION
        line = one_line(result)
        assert LEFTOVER in line
        assert "pass --i-know-this-is-a-test" in line
        assert "pw" not in line


@pytest.mark.postgres
@pytest.mark.rabbitmq
@pytest.mark.parametrize("opt_in", ["flag", "env"])
def test_the_fake_runs_with_postgresql_and_rabbitmq_when_the_test_says_so(
    pg_database: str, rabbit_url: str, opt_in: str
) -> None:
    fake = "test" if opt_in == "env" else "1"
    env = clean_env(PROVISIONER_DATABASE_URL=pg_database, PROVISIONER_BROKER_URL=rabbit_url,
                    PROVISIONER_FAKE_GATEWAY=fake)  # fmt: skip
    flags = ["--i-know-this-is-a-test"] if opt_in == "flag" else []
    command = [PROVISIONER, *flags, "run"]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert "running" in proc.stdout.readline()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0


# --------------------------------------------------------------------------- Rich


def test_ids_from_producers_are_shown_as_text_not_markup(
    tmp_path: Path, http_gateway: HttpGateway, fake: FakeGateway
) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    service = ProvisioningService(app, http_gateway)
    service.request_provisioning("[/x]", "Closing Tag Co", PARENT)
    service.request_provisioning("[red]styled", "Styled Co", PARENT)
    with SqlViewStore(url) as store:
        store.setup()
        catch_up_all(app, store)
    app.close()
    runner = CliRunner(env={"PROVISIONER_DATABASE_URL": url, "COLUMNS": "300", "TERM": "dumb"})

    listed = runner.invoke(main, ["attempts"], color=True)
    history = runner.invoke(main, ["history", "[red]styled"], color=True)

    assert listed.exit_code == 0, listed.output
    assert "[/x]" in listed.output
    assert "[red]styled" in listed.output
    assert history.exit_code == 0, history.output


# --------------------------------------------------------------------------- PostgreSQL start-up


@pytest.mark.postgres
@pytest.mark.parametrize(
    "command",
    [["status", "b1"], ["provision", "b1", "--title", "T", "--parent", "p"], ["attempts"]],
)
def test_an_unknown_role_is_refused_in_one_line(pg_database: str, command: list[str]) -> None:
    dbname = pg_database.rsplit("/", 1)[1]
    env = clean_env(PROVISIONER_DATABASE_URL=pg_url(dbname, user="nobody_here"))

    result = run_cli(env, *command)

    assert result.returncode == EXIT_REFUSED
    line = one_line(result)
    assert 'role "nobody_here" does not exist' in line
    assert "PROVISIONER_DATABASE_URL" in line
    assert ":pw@" not in line


@pytest.mark.postgres
def test_a_missing_database_is_refused_at_once_even_by_long_running_processes(
    pg_database: str, fake: FakeGateway
) -> None:
    env = clean_env(
        PROVISIONER_DATABASE_URL=pg_url(f"missing_{uuid.uuid4().hex[:8]}"),
        PROVISIONER_BROKER_URL="amqp://guest:guest@127.0.0.1:5672//",
        PROVISIONER_GATEWAY_URL=fake.url,
        PROVISIONER_PARENT_IDS=",".join(fake.parents),
        PROVISIONER_GATEWAY_TOKEN="t",
    )
    for command in (["status", "b1"], ["projections", "run"], ["worker"]):
        result = run_cli(env, *command, timeout=30)
        assert result.returncode == EXIT_REFUSED, (command, result.stderr)
        assert "does not exist" in one_line(result)


@pytest.mark.postgres
def test_a_database_that_is_down_fails_a_one_shot_command_with_the_unavailable_code() -> None:
    env = clean_env(
        PROVISIONER_DATABASE_URL=pg_url("x", port=free_port()), PROVISIONER_CONNECT_WAIT_S="0.5"
    )

    result = run_cli(env, "status", "b1")

    assert result.returncode == EXIT_UNAVAILABLE
    assert "Connection refused" in one_line(result)


ONE_SHOT_COMMANDS = [
    ["db", "init"],
    ["provision", "b1", "--title", "T", "--parent", "p"],
    ["provision", "b1", "--title", "T", "--parent", "p", "--wait"],
    ["deactivate", "b1"],
    *READ_COMMANDS,
    ["projections", "rebuild"],
    ["reconcile", "--once"],
]


@pytest.mark.postgres
@pytest.mark.parametrize("args", ONE_SHOT_COMMANDS, ids=lambda a: "-".join(a[:2]))
def test_every_one_shot_command_on_a_database_that_is_down_says_so_in_one_line(
    args: list[str],
) -> None:
    env = clean_env(
        PROVISIONER_DATABASE_URL=pg_url("x", port=free_port()),
        PROVISIONER_BROKER_URL=f"amqp://guest:guest@127.0.0.1:{free_port()}//",
        PROVISIONER_CONNECT_WAIT_S="0",
    )

    result = run_cli(env, *args, timeout=30)

    assert result.returncode == EXIT_UNAVAILABLE, result.stderr
    line = one_line(result)
    assert "unavailable" in line
    assert ":pw@" not in line


@pytest.mark.parametrize("args", [["broker", "init"], ["reconcile", "--once"]])
def test_a_broker_that_is_down_fails_a_one_shot_command_in_one_line(
    args: list[str], tmp_path: Path
) -> None:
    env = clean_env(
        PROVISIONER_DATABASE_URL=f"sqlite:///{tmp_path / 'events.sqlite'}",
        PROVISIONER_BROKER_URL=f"amqp://guest:secret@127.0.0.1:{free_port()}//",
        PROVISIONER_PARENT_IDS="org-parent",
    )
    assert run_cli(env, "db", "init").returncode == 0

    result = run_cli(env, *args, timeout=30)

    assert result.returncode == EXIT_UNAVAILABLE, result.stderr
    line = one_line(result)
    assert "RabbitMQ" in line
    assert "secret" not in line


@pytest.mark.postgres
def test_debug_shows_the_traceback(pg_database: str) -> None:
    env = clean_env(PROVISIONER_DATABASE_URL=pg_url("x", user="nobody_here"))
    result = run_cli(env, "--debug", "status", "b1")
    assert result.returncode != 0
    assert "Traceback" in result.stderr


@pytest.mark.postgres
def test_tls_required_against_a_server_without_it_fails_in_one_line(pg_database: str) -> None:
    dbname = pg_database.rsplit("/", 1)[1]
    env = clean_env(PROVISIONER_DATABASE_URL=pg_url(dbname, query="sslmode=require"))

    result = run_cli(env, "status", "b1")

    assert result.returncode == EXIT_REFUSED
    assert "SSL" in one_line(result)


@pytest.mark.postgres
def test_a_long_running_process_waits_for_the_database_and_says_when_connected(
    pg_database: str, tmp_path: Path
) -> None:
    """The database is down when `projections run` starts, and comes up 2 s later."""
    dbname = pg_database.rsplit("/", 1)[1]
    port = free_port()
    name = f"prov-test-{uuid.uuid4().hex[:8]}"
    url = pg_url(dbname, port=port, query=f"application_name={name}")
    log = tmp_path / "projections.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [PROVISIONER, "projections", "run"],
            env=clean_env(PROVISIONER_DATABASE_URL=url), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        # The database is down meanwhile: the process must say it retries and wait, not
        # exit. (Waited for by its log, not a fixed time: on a loaded machine the
        # interpreter's start alone can take seconds.)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "retrying with backoff" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        assert proc.poll() is None, log.read_text()
        host, pg_port = psycopg.conninfo.conninfo_to_dict(pg_database)["host"], 5432
        with forwarder(port, (str(host), pg_port)):
            # Three connections once settled: the event store's pool (one), the read
            # models' and the LISTEN connection. The pool is the library's, which
            # knows no options: a steady three shows the URL's option reached it.
            deadline, readings = time.monotonic() + 30, [0]
            while time.monotonic() < deadline and readings[-2:] != [3, 3]:
                time.sleep(0.2)
                with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
                    row = admin.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                        (name,),
                    ).fetchone()
                readings.append(row[0] if row else 0)
            text = log.read_text()
            assert readings[-2:] == [3, 3], (readings, text)
            assert f"connected to postgresql://root:***@127.0.0.1:{port}/{dbname}" in text
            assert ":pw@" not in text
            assert text.count("retrying with backoff") == 1
            assert proc.poll() is None
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# --------------------------------------------------------------------------- components


def test_a_component_that_raises_stops_the_process_with_its_reason_and_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Refusing:
        def run(self, stop: threading.Event) -> None:
            raise ServiceRefused("RabbitMQ refused the login: check PROVISIONER_BROKER_URL")

    monkeypatch.setattr(runtime.ProjectorRuntime, "projector", lambda self, batch: Refusing())
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    result = CliRunner(env={"PROVISIONER_DATABASE_URL": url}).invoke(main, ["projections", "run"])

    assert result.exit_code == EXIT_REFUSED
    assert "projections stopped: RabbitMQ refused the login" in result.output
    assert "stopped unexpectedly" not in result.output


@pytest.mark.rabbitmq
def test_a_broker_that_refuses_stops_long_running_processes_at_start_up(
    rabbit_url: str, tmp_path: Path, fake: FakeGateway
) -> None:
    """Wrong credentials or a missing vhost: one line and exit 4, not a retry forever."""
    base = rabbit_url.rsplit("/", 1)[0]
    cases = {
        "worker": f"{base}/missing_{uuid.uuid4().hex[:8]}",
        "relay": rabbit_url.replace("guest:guest@", "guest:wrong@"),
    }
    for command, broker_url in cases.items():
        env = clean_env(
            PROVISIONER_DATABASE_URL=f"sqlite:///{tmp_path / 'events.sqlite'}",
            PROVISIONER_BROKER_URL=broker_url,
            PROVISIONER_GATEWAY_URL=fake.url,
            PROVISIONER_PARENT_IDS=",".join(fake.parents),
            PROVISIONER_GATEWAY_TOKEN="t",
        )
        result = run_cli(env, command, timeout=30)
        assert result.returncode == EXIT_REFUSED, (command, result.stderr)
        line = one_line(result)
        assert line.startswith(f"Error: {command} stopped: RabbitMQ at")
        assert "refused" in line
        assert "wrong" not in line


@pytest.mark.rabbitmq
@pytest.mark.parametrize("command", ["worker", "relay"])
def test_queues_declared_with_other_arguments_stop_long_running_processes_at_start_up(
    rabbit_url: str, tmp_path: Path, fake: FakeGateway, command: str
) -> None:
    """406 "inequivalent arg" (quorum asked for, classic queues there): retrying cannot
    fix it, so one line and exit 4, not an outage retried forever."""
    # The fixture has declared the project's queues as classic queues in this vhost.
    env = clean_env(
        PROVISIONER_DATABASE_URL=f"sqlite:///{tmp_path / 'events.sqlite'}",
        PROVISIONER_BROKER_URL=rabbit_url,
        PROVISIONER_QUEUE_TYPE="quorum",
        PROVISIONER_GATEWAY_URL=fake.url,
        PROVISIONER_PARENT_IDS=",".join(fake.parents),
        PROVISIONER_GATEWAY_TOKEN="t",
    )
    result = run_cli(env, command, timeout=30)

    assert result.returncode == EXIT_REFUSED, result.stderr
    line = one_line(result)
    assert line.startswith(f"Error: {command} stopped: RabbitMQ at")
    assert "406" in line
    assert "inequivalent arg" in line
    assert "PROVISIONER_QUEUE_TYPE" in line
