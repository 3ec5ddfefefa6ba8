"""On the command line: a misspelt setting or a half-embedded default stops a
command before it writes anything; `provisioner config` shows the settings in
effect and where each came from, with every secret redacted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from infrastructure.failures import EXIT_CONFIGURATION
from worker.cli.config import hide_query_values
from worker.cli.main import main

PROVISION = ["provision", "b1", "--title", "T", "--parent", "org-parent"]
TOKEN = "tok-s3cret-9f2d41"
DB_PASSWORD = "dbpw-8c1e77"
MQ_PASSWORD = "mqpw-52ab90"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working folder (the default store is ./var/provisioner.sqlite), with
    no PROVISIONER_* variable inherited but the ones each test sets."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PROVISIONER_ALLOW_MIXED_EMBEDDED", raising=False)  # tests/conftest.py's
    return tmp_path


def test_a_misspelt_database_url_stops_provision_and_writes_nothing(here: Path) -> None:
    meant = here / "events.sqlite"
    result = CliRunner().invoke(
        main, PROVISION, env={"PROVISIONER_DATABSE_URL": f"sqlite:///{meant}"}
    )

    assert result.exit_code == EXIT_CONFIGURATION, result.output
    assert (
        "Error: unknown setting PROVISIONER_DATABSE_URL; did you mean "
        "PROVISIONER_DATABASE_URL?" in result.output
    )
    assert "started" not in result.output
    assert list(here.iterdir()) == []  # no ./var/provisioner.sqlite, nor the one meant


@pytest.mark.parametrize("command", [["demo", "--brands", "1"], ["fake-gateway"], ["config"]])
def test_every_command_refuses_an_unknown_setting(here: Path, command: list[str]) -> None:
    result = CliRunner().invoke(main, command, env={"PROVISIONER_CONCURENCY": "4"})

    assert result.exit_code == EXIT_CONFIGURATION, result.output
    assert "did you mean PROVISIONER_CONCURRENCY?" in result.output
    assert list(here.iterdir()) == []


def test_a_commands_help_shows_whatever_the_environment_holds(here: Path) -> None:
    env = {"PROVISIONER_CONCURENCY": "4"}
    shown = CliRunner().invoke(main, ["status", "--help"], env=env)
    run = CliRunner().invoke(main, ["status", "b1"], env=env)

    assert (shown.exit_code, run.exit_code) == (0, 3)
    assert "Usage: main status" in shown.output or "Usage: provisioner status" in shown.output
    assert "unknown setting PROVISIONER_CONCURENCY" in run.output


def test_a_real_broker_with_the_default_store_stops_provision_unless_asked_for(
    here: Path,
) -> None:
    env = {"PROVISIONER_BROKER_URL": "amqp://guest:guest@127.0.0.1:1//"}
    refused = CliRunner().invoke(main, PROVISION, env=env)

    assert refused.exit_code == EXIT_CONFIGURATION, refused.output
    assert "the embedded event store sqlite:///var/provisioner.sqlite with a real broker" in (
        refused.output
    )
    assert "PROVISIONER_ALLOW_MIXED_EMBEDDED=1" in refused.output
    assert list(here.iterdir()) == []

    mixed = {"PROVISIONER_ALLOW_MIXED_EMBEDDED": "1", "PROVISIONER_PARENT_IDS": "org-parent"}
    asked = CliRunner().invoke(main, PROVISION, env={**env, **mixed})
    assert asked.exit_code == 0, asked.output  # the mix on purpose: the outbox on SQLite
    assert (here / "var" / "provisioner.sqlite").exists()


def config_env() -> dict[str, str]:
    return {
        "PROVISIONER_DATABASE_URL": f"postgresql://svc:{DB_PASSWORD}@127.0.0.1:1/events",
        "PROVISIONER_BROKER_URL": f"amqp://svc:{MQ_PASSWORD}@127.0.0.1:1/vhost",
        "PROVISIONER_GATEWAY_URL": "https://gateway.example",
        "PROVISIONER_GATEWAY_TOKEN": TOKEN,
        "PROVISIONER_CONCURRENCY": "4",
    }


def test_config_shows_each_setting_and_its_source_with_secrets_redacted(here: Path) -> None:
    text = CliRunner().invoke(main, ["config"], env={**config_env(), "COLUMNS": "200"})
    as_json = CliRunner().invoke(main, ["config", "--json"], env=config_env())

    for result in (text, as_json):
        assert result.exit_code == 0, result.output
        for secret in (TOKEN, DB_PASSWORD, MQ_PASSWORD):
            assert secret not in result.output
    rows = {row["name"]: row for row in json.loads(as_json.output)["settings"]}
    assert rows["PROVISIONER_GATEWAY_TOKEN"] == {
        "name": "PROVISIONER_GATEWAY_TOKEN", "value": "***", "source": "environment",
    }  # fmt: skip
    assert rows["PROVISIONER_DATABASE_URL"]["value"] == "postgresql://svc:***@127.0.0.1:1/events"
    assert rows["PROVISIONER_BROKER_URL"]["value"] == "amqp://svc:***@127.0.0.1:1/vhost"
    assert rows["PROVISIONER_CONCURRENCY"] == {
        "name": "PROVISIONER_CONCURRENCY", "value": 4, "source": "environment",
    }  # fmt: skip
    assert rows["PROVISIONER_BACKOFF_BASE_S"] == {
        "name": "PROVISIONER_BACKOFF_BASE_S", "value": 5.0, "source": "default",
    }  # fmt: skip
    assert rows["PROVISIONER_WEB_TOKEN"]["value"] is None
    lines = {line.split()[0]: line.split()[1:] for line in text.output.splitlines() if line}
    assert lines["PROVISIONER_GATEWAY_TOKEN"] == ["***", "environment"]
    assert lines["PROVISIONER_WEB_TOKEN"] == ["(none)", "default"]
    assert lines["PROVISIONER_CONCURRENCY"] == ["4", "environment"]
    assert list(here.iterdir()) == []  # nothing connected, nothing created


def test_config_shows_the_settings_then_refuses_a_half_embedded_default(here: Path) -> None:
    env = {"PROVISIONER_DATABASE_URL": f"postgresql://svc:{DB_PASSWORD}@127.0.0.1:1/events"}
    result = CliRunner().invoke(main, ["config", "--json"], env=env)

    assert result.exit_code == EXIT_CONFIGURATION
    assert '"name": "PROVISIONER_BROKER_URL"' in result.output
    assert "Error: PostgreSQL with the in-process broker memory://" in result.output
    assert DB_PASSWORD not in result.output


def test_config_says_the_fake_was_let_run_by_the_global_flag(here: Path) -> None:
    env = {"PROVISIONER_FAKE_GATEWAY": "1"}
    flagged = CliRunner().invoke(main, ["--i-know-this-is-a-test", "config", "--json"], env=env)
    plain = CliRunner().invoke(main, ["config", "--json"], env=env)

    def fake(result: object) -> dict[str, object]:
        rows = json.loads(result.output)["settings"]  # type: ignore[attr-defined]
        return next(r for r in rows if r["name"] == "PROVISIONER_FAKE_GATEWAY")

    assert fake(flagged)["value"] == "test"
    assert fake(flagged)["source"] == "flag"
    assert fake(plain)["value"] == "1"
    assert fake(plain)["source"] == "environment"


def test_config_hides_every_query_value_not_known_to_be_harmless(here: Path) -> None:
    env = {
        **config_env(),
        "PROVISIONER_DATABASE_URL": "postgresql://svc@127.0.0.1:1/events"
        "?sslmode=require&application_name=prov&options=-c%20secret%3Ds3cr3t-opt",
        "PROVISIONER_BROKER_URL": "amqp://svc@127.0.0.1:1/vhost?heartbeat=30&auth=mq-k3y-0042",
        "PROVISIONER_GATEWAY_URL": "https://gateway.example/api?api_key=gw-k3y-7781&Region=eu-w3st-9",
    }
    result = CliRunner().invoke(main, ["config", "--json"], env=env)

    assert result.exit_code == 0, result.output
    for secret in ("s3cr3t-opt", "mq-k3y-0042", "gw-k3y-7781", "eu-w3st-9"):
        assert secret not in result.output
    rows = {row["name"]: row["value"] for row in json.loads(result.output)["settings"]}
    assert rows["PROVISIONER_DATABASE_URL"] == (
        "postgresql://svc@127.0.0.1:1/events?sslmode=require&application_name=prov&options=***"
    )
    assert rows["PROVISIONER_BROKER_URL"] == "amqp://svc@127.0.0.1:1/vhost?heartbeat=30&auth=***"
    assert rows["PROVISIONER_GATEWAY_URL"] == "https://gateway.example/api?api_key=***&Region=***"


@pytest.mark.parametrize(
    ("shown", "hidden"),
    [
        ("https://gw.example/v1", "https://gw.example/v1"),
        ("https://gw.example/?flag&token=abc", "https://gw.example/?flag&token=***"),
        ("https://gw.example/?SSLMODE=require&x=", "https://gw.example/?SSLMODE=require&x=***"),
        ("https://gw.example/?a%5Fkey=1#frag-secret", "https://gw.example/?a%5Fkey=***#***"),
        ("https://gw.example/?connect%5Ftimeout=5", "https://gw.example/?connect%5Ftimeout=5"),
        ("not a url? key=value", "not a url? key=value"),
        ("classic", "classic"),
    ],
)
def test_which_query_values_are_hidden(shown: str, hidden: str) -> None:
    assert hide_query_values(shown) == hidden


LONG_URL = (
    "postgresql://provisioner@db.example.internal:5432/provisioner"
    "?sslmode=verify-full&sslrootcert=/etc/ssl/certs/db-root.crt"
)


def test_config_never_breaks_a_value_at_80_columns(here: Path) -> None:
    env = {**config_env(), "PROVISIONER_DATABASE_URL": LONG_URL, "COLUMNS": "80"}
    result = CliRunner().invoke(main, ["config"], env=env)

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    # Too long for its column: whole, on the line after its row, which says so.
    row = next(i for i, line in enumerate(lines) if line.startswith("PROVISIONER_DATABASE_URL "))
    assert lines[row].split() == ["PROVISIONER_DATABASE_URL", "(below)", "environment"]
    assert lines[row + 1] == f"    {LONG_URL}"
    # Every other line fits the width, and every value shows whole on one line.
    assert all(len(line) <= 80 for line in lines if line != lines[row + 1])
    shown = json.loads(CliRunner().invoke(main, ["config", "--json"], env=env).output)
    for setting in shown["settings"]:
        value = "(none)" if setting["value"] is None else str(setting["value"])
        value = f"{setting['value']:g}" if isinstance(setting["value"], float) else value
        assert any(value in line for line in lines), setting


def test_the_config_table_keeps_short_values_in_their_column() -> None:
    from worker.cli.config import table_lines

    rows: list[dict[str, Any]] = [
        {"name": "PROVISIONER_A", "value": "postgresql://u@h:5432/db", "source": "default"},
        {"name": "PROVISIONER_B", "value": 8, "source": "environment"},
    ]
    # 60 columns: 13 for the names, 11 for the sources, two gaps of 3, 30 for the values.
    assert table_lines(rows, 60) == [
        f"{'setting':<13}   {'value':<30}   source",
        "\u2500" * 60,
        f"{'PROVISIONER_A':<13}   {'postgresql://u@h:5432/db':<30}   default",
        f"{'PROVISIONER_B':<13}   {'8':<30}   environment",
    ]
    # 40 columns leave the values 10: the URL goes whole on its own line.
    assert table_lines(rows, 40)[2:] == [
        f"{'PROVISIONER_A':<13}   {'(below)':<10}   default",
        "    postgresql://u@h:5432/db",
        f"{'PROVISIONER_B':<13}   {'8':<10}   environment",
    ]
