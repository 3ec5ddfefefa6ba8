"""Configuration that cannot silently miss: an unknown PROVISIONER_* name is refused,
naming the setting it resembles; the embedded default is all or nothing unless
PROVISIONER_ALLOW_MIXED_EMBEDDED=1; the known names are the settings table's."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from infrastructure.settings.checks import (
    ELSEWHERE,
    PREFIX,
    check_environment,
    check_mix,
    closest,
    embedded_mix,
)
from infrastructure.settings.model import Settings
from infrastructure.settings.parsing import SettingsError
from infrastructure.settings.table import SETTINGS, VARIABLES

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
PG = "postgresql://root@127.0.0.1:5432/provisioner"
AMQP = "amqp://guest:guest@127.0.0.1:5672//"


class Recording(Mapping[str, str]):
    """An empty environment that remembers every name asked of it."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __getitem__(self, key: str) -> str:
        self.asked.append(key)
        raise KeyError(key)

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.asked.append(key)
        return default

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def test_a_misspelt_setting_is_refused_naming_the_one_meant() -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"PROVISIONER_DATABSE_URL": "postgresql://u:pw@db/x"})

    message = str(caught.value)
    assert message.startswith(
        "unknown setting PROVISIONER_DATABSE_URL; did you mean PROVISIONER_DATABASE_URL?"
    )
    assert "pw" not in message  # the value is never shown
    assert "\n" not in message


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("PROVISIONER_CONCURENCY", "PROVISIONER_CONCURRENCY"),
        ("PROVISIONER_GATEWAYTOKEN", "PROVISIONER_GATEWAY_TOKEN"),
        ("PROVISIONER_BROKER_URI", "PROVISIONER_BROKER_URL"),
        ("PROVISIONER_PARENT_ID", "PROVISIONER_PARENT_IDS"),
    ],
)
def test_the_suggestion_is_the_closest_known_name(typo: str, meant: str) -> None:
    assert closest(typo, VARIABLES) == meant
    with pytest.raises(SettingsError, match=f"did you mean {meant}\\?"):
        check_environment({typo: "1"})


def test_a_name_like_no_setting_is_refused_without_a_guess() -> None:
    with pytest.raises(SettingsError, match="unknown setting PROVISIONER_FOO; no setting"):
        Settings.from_env({"PROVISIONER_FOO": "1"})


def test_every_unknown_name_is_named_in_one_line() -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"PROVISIONER_FOO": "1", "PROVISIONER_CONCURENCY": "2"})
    message = str(caught.value)
    assert "PROVISIONER_CONCURENCY (did you mean PROVISIONER_CONCURRENCY?)" in message
    assert "PROVISIONER_FOO" in message
    assert "\n" not in message


def test_other_variables_and_those_read_elsewhere_are_not_settings_errors() -> None:
    env = dict.fromkeys(ELSEWHERE, "1") | {"PROVISIONERS": "x", "HOME": "/root"}
    assert Settings.from_env(env).database_url  # no error
    check_environment(env)


def test_the_known_settings_are_exactly_the_ones_from_env_reads() -> None:
    """The table is the list: a setting added without its row (or a row without its
    setting) fails here, before any operator's variable is refused for it."""
    env = Recording()
    Settings.from_env(env)
    read = {key for key in env.asked if key.startswith("PROVISIONER_")}
    assert read == set(VARIABLES)
    assert len(VARIABLES) == len(set(VARIABLES)) > 30


def test_every_provisioner_name_the_repository_reads_is_known() -> None:
    """The tests, benchmarks, CI and the service itself read no PROVISIONER_* name
    that the CLI would refuse when it runs inside their environment."""
    name = re.compile(r"\bPROVISIONER_[A-Z0-9_]*[A-Z0-9]\b(?!_)")
    known = {*VARIABLES, *ELSEWHERE}
    files = [ROOT / "Makefile", ROOT / ".ci" / "run"]
    for folder in ("domain", "projections", "infrastructure", "worker", "tests", "bench"):
        files += (ROOT / folder).rglob("*.py")
    found: dict[str, str] = {}
    for path in files:
        if path.name in (Path(__file__).name, "test_cli_config.py"):
            continue  # their misspellings are on purpose
        for match in name.finditer(path.read_text()):
            found.setdefault(match.group(), str(path.relative_to(ROOT)))
    assert {n: where for n, where in found.items() if n not in known} == {}
    assert "PROVISIONER_REQUIRE_SERVICES" in found  # the scan reads .ci/run and tests


def test_the_operators_table_documents_every_setting() -> None:
    documented = set(re.findall(r"^\| `(PROVISIONER_[A-Z0-9_]+)` \|", CONFIGURATION, re.M))
    assert set(VARIABLES) - documented == set()


def test_the_known_names_are_the_tables_each_once_with_the_prefix() -> None:
    """The list no longer hangs on a docstring (gone under `python -OO`): it is the
    settings' table, in its order."""
    assert tuple(setting.name for setting in SETTINGS) == VARIABLES
    assert all(name.startswith(PREFIX) for name in VARIABLES)
    assert not set(VARIABLES) & set(ELSEWHERE)


@pytest.mark.parametrize(
    ("database", "broker", "says"),
    [
        ("sqlite:///var/provisioner.sqlite", AMQP, "set PROVISIONER_DATABASE_URL"),
        ("sqlite:////srv/events.sqlite", "amqps://u:p@mq.example/v", "real broker (amqps://)"),
        ("memory://", "pyamqp://guest@127.0.0.1//", "set PROVISIONER_DATABASE_URL"),
        (PG, "memory://", "set PROVISIONER_BROKER_URL"),
        ("postgres://u@db/x", "memory://", "in-process broker memory://"),
    ],
)
def test_the_embedded_default_half_used_is_refused_in_one_line(
    database: str, broker: str, says: str
) -> None:
    reason = embedded_mix(database, broker)
    assert reason is not None
    assert says in reason
    with pytest.raises(SettingsError) as caught:
        check_mix(database, broker, allowed=False)
    assert "PROVISIONER_ALLOW_MIXED_EMBEDDED=1 to mix them on purpose" in str(caught.value)
    assert "\n" not in str(caught.value)
    check_mix(database, broker, allowed=True)  # asked for: no error


@pytest.mark.parametrize(
    ("database", "broker"),
    [("sqlite:///var/provisioner.sqlite", "memory://"), ("memory://", "memory://"), (PG, AMQP)],
)
def test_all_embedded_or_all_real_is_no_mix(database: str, broker: str) -> None:
    assert embedded_mix(database, broker) is None


def test_the_environment_check_reads_the_defaults_and_the_opt_in() -> None:
    with pytest.raises(SettingsError, match="embedded event store sqlite:///var/provisioner"):
        check_environment({"PROVISIONER_BROKER_URL": AMQP})  # the database left unset
    with pytest.raises(SettingsError, match="PostgreSQL with the in-process broker"):
        check_environment({"PROVISIONER_DATABASE_URL": PG})  # the broker left unset
    check_environment({"PROVISIONER_DATABASE_URL": PG, "PROVISIONER_ALLOW_MIXED_EMBEDDED": "1"})
    check_environment({"PROVISIONER_DATABASE_URL": PG}, mix=False)  # demo, fake-gateway
    check_environment({})  # the embedded default, whole
    with pytest.raises(SettingsError, match="PROVISIONER_ALLOW_MIXED_EMBEDDED must be one of"):
        check_environment({"PROVISIONER_DATABASE_URL": PG, "PROVISIONER_ALLOW_MIXED_EMBEDDED": "y"})
    with pytest.raises(SettingsError, match="unknown setting"):
        check_environment({"PROVISIONER_DATABSE_URL": PG}, mix=False)


def test_the_opt_in_is_a_setting_in_effect() -> None:
    env = {"PROVISIONER_DATABASE_URL": PG, "PROVISIONER_ALLOW_MIXED_EMBEDDED": "1"}
    assert Settings.from_env(env).allow_mixed_embedded is True
    assert Settings.from_env({}).allow_mixed_embedded is False
