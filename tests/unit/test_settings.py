from __future__ import annotations

import pytest

from infrastructure.eventstore import persistence_env, redact
from infrastructure.settings import DEFAULT_DATABASE_URL, Settings, SettingsError


def test_defaults_are_the_embedded_ones() -> None:
    settings = Settings.from_env({})
    assert settings.database_url == DEFAULT_DATABASE_URL
    assert settings.engine().backoff.total_s() == 155


def test_values_come_from_the_environment_mapping_given() -> None:
    settings = Settings.from_env(
        {
            "PROVISIONER_BACKOFF_BASE_S": "0.5",
            "PROVISIONER_MAX_REQUEUES": "2",
            "PROVISIONER_GATEWAY_TOKEN": "tok",
        }
    )
    assert settings.engine().backoff.total_s() == 1.5
    assert "tok" not in repr(settings)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("PROVISIONER_MAX_REQUEUES", "many"),
        ("PROVISIONER_BACKOFF_BASE_S", "-1"),
        ("PROVISIONER_MAX_REQUEUES", "99"),
    ],
)
def test_a_bad_value_is_named_in_one_clear_error(key: str, value: str) -> None:
    with pytest.raises(SettingsError, match=r"(?i)requeues|base|PROVISIONER"):
        Settings.from_env({key: value}).engine()


def test_database_urls_map_onto_the_librarys_settings() -> None:
    pg = persistence_env("postgresql://alice:pw@db.example:6543/events")
    assert (pg["POSTGRES_HOST"], pg["POSTGRES_PORT"], pg["POSTGRES_DBNAME"]) == (
        "db.example",
        "6543",
        "events",
    )
    assert pg["POSTGRES_ENABLE_DB_FUNCTIONS"] == "n"
    assert persistence_env("sqlite:///var/x.sqlite")["SQLITE_DBNAME"] == "var/x.sqlite"
    assert persistence_env("sqlite:////tmp/x.sqlite")["SQLITE_DBNAME"] == "/tmp/x.sqlite"
    assert persistence_env("sqlite://")["SQLITE_DBNAME"] == ":memory:"
    assert persistence_env("memory://")["PERSISTENCE_MODULE"] == "eventsourcing.popo"
    with pytest.raises(ValueError, match="unsupported database URL"):
        persistence_env("mysql://x/y")
    assert "pw" not in redact("postgresql://alice:pw@db.example:6543/events")
