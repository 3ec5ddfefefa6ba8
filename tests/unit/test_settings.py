from __future__ import annotations

import json
from dataclasses import replace

import pytest
from psycopg.conninfo import conninfo_to_dict

from infrastructure.failures import ConfigurationError
from infrastructure.redaction import redact
from infrastructure.settings.model import Settings
from infrastructure.settings.parsing import SettingsError
from infrastructure.settings.table import DEFAULT_DATABASE_URL
from infrastructure.store.eventstore import persistence_env, postgres_conninfo


def test_defaults_are_the_embedded_ones() -> None:
    settings = Settings.from_env({})
    assert settings.database_url == DEFAULT_DATABASE_URL
    assert settings.engine().backoff.total_s() == 155


def test_the_metrics_port_binds_to_loopback_unless_told_otherwise() -> None:
    assert Settings.from_env({}).metrics_host == "127.0.0.1"
    for host in ("0.0.0.0", "::", "pod-1.svc.cluster.local"):
        assert Settings.from_env({"PROVISIONER_METRICS_HOST": host}).metrics_host == host


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


@pytest.mark.parametrize(
    "key",
    [
        "PROVISIONER_DATABASE_URL",
        "PROVISIONER_BROKER_URL",
        "PROVISIONER_GATEWAY_URL",
        "PROVISIONER_GATEWAY_TOKEN",
        "PROVISIONER_CONCURRENCY",
        "PROVISIONER_QUEUE_TYPE",
        "PROVISIONER_METRICS_HOST",
    ],
)
def test_an_empty_variable_is_an_error_not_the_default(key: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^{key} is set but empty"):
        Settings.from_env({key: " "})


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("PROVISIONER_DATABASE_URL", "mysql://db/x", "scheme 'mysql'"),
        ("PROVISIONER_DATABASE_URL", "postgresql:///events", "names no host"),
        ("PROVISIONER_DATABASE_URL", "postgresql://db:99999/events", "Port out of range"),
        ("PROVISIONER_DATABASE_URL", "postgresql://db/events?sslmod=require", "sslmod"),
        ("PROVISIONER_BROKER_URL", "http://rabbit/", "scheme 'http'"),
        ("PROVISIONER_BROKER_URL", "amqp://:5672/", "names no host"),
        ("PROVISIONER_GATEWAY_URL", "ftp://gw.example", "scheme 'ftp'"),
        ("PROVISIONER_GATEWAY_URL", "https://gw.example:0", "port 0"),
        ("PROVISIONER_GATEWAY_TOKEN", "abc def", "whitespace or control"),
        ("PROVISIONER_GATEWAY_TOKEN", "abc\x07", "whitespace or control"),
        ("PROVISIONER_CONCURRENCY", "0", ">= 1"),
        ("PROVISIONER_METRICS_PORT", "70000", "<= 65535"),
        ("PROVISIONER_METRICS_HOST", "0.0.0.0:9100", "IP address or a host name"),
        ("PROVISIONER_METRICS_HOST", "http://x", "IP address or a host name"),
        ("PROVISIONER_HEALTH_MAX_LAG", "-1", ">= 0"),
        ("PROVISIONER_HEALTH_STUCK_AFTER_S", "0", "> 0"),
        ("PROVISIONER_GATEWAY_TIMEOUT_S", "0", "> 0"),
        ("PROVISIONER_FAKE_GATEWAY", "yes", "one of 0, 1"),
    ],
)
def test_each_setting_is_checked_at_start_up_in_one_line_naming_it(
    key: str, value: str, says: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        Settings.from_env({key: value})
    message = str(raised.value)
    assert message.startswith(key)
    assert says in message
    assert "\n" not in message


def test_a_gateway_caller_needs_the_gateway_or_the_fake_asked_for() -> None:
    production = {
        "PROVISIONER_DATABASE_URL": "postgresql://app@db.example/events",
        "PROVISIONER_BROKER_URL": "amqp://app@rabbit.example/prod",
    }
    with pytest.raises(ConfigurationError, match=r"PROVISIONER_GATEWAY_URL is not set.*FAKE"):
        Settings.from_env(production).gateway()
    without_token = {**production, "PROVISIONER_GATEWAY_URL": "https://gw.example"}
    with pytest.raises(ConfigurationError, match="PROVISIONER_GATEWAY_TOKEN is not set"):
        Settings.from_env(without_token).gateway()
    real = Settings.from_env({**without_token, "PROVISIONER_GATEWAY_TOKEN": "t0k"})
    assert real.gateway() == ("https://gw.example", "t0k")
    opted_in = {**production, "PROVISIONER_FAKE_GATEWAY": "test"}
    assert Settings.from_env(opted_in).gateway() is None
    with pytest.raises(ConfigurationError, match="choose one"):
        Settings.from_env({**without_token, "PROVISIONER_FAKE_GATEWAY": "1"})
    # The embedded default does not fake the gateway silently either.
    with pytest.raises(ConfigurationError, match="PROVISIONER_GATEWAY_URL is not set"):
        Settings.from_env({}).gateway()


@pytest.mark.parametrize(
    "where",
    [
        {"PROVISIONER_DATABASE_URL": "postgresql://app@db.example/events"},
        {"PROVISIONER_BROKER_URL": "amqp://app@rabbit.example/prod"},
    ],
)
def test_the_fake_with_postgresql_or_rabbitmq_needs_the_test_opt_in(where: dict[str, str]) -> None:
    leftover = Settings.from_env({**where, "PROVISIONER_FAKE_GATEWAY": "1"})
    with pytest.raises(ConfigurationError) as raised:
        leftover.gateway()
    message = str(raised.value)
    assert (
        "the in-process fake gateway with PostgreSQL/RabbitMQ: this looks like production; "
        "pass --i-know-this-is-a-test" in message
    )
    assert "\n" not in message
    assert replace(leftover, fake_gateway_test=True).gateway() is None  # the CLI flag
    assert Settings.from_env({**where, "PROVISIONER_FAKE_GATEWAY": "test"}).gateway() is None
    # SQLite and memory:// (`make demo`, a laptop) need no opt-in.
    assert Settings.from_env({"PROVISIONER_FAKE_GATEWAY": "1"}).gateway() is None


def test_allowed_web_hosts_are_names_with_an_optional_port() -> None:
    raw = "Provisioner.example, 10.0.0.5:8080,[fd00::1]:443,provisioner.example"
    assert Settings.from_env({"PROVISIONER_WEB_ALLOWED_HOSTS": raw}).web_allowed_hosts == (
        "provisioner.example", "10.0.0.5:8080", "[fd00::1]:443",
    )  # fmt: skip
    assert Settings.from_env({}).web_allowed_hosts == ()
    for bad in ("http://x", "x/y", "a b", "fd00::1", "x:99999", ",", "u@x"):
        with pytest.raises(ConfigurationError, match=r"^PROVISIONER_WEB_ALLOWED_HOSTS must be"):
            Settings.from_env({"PROVISIONER_WEB_ALLOWED_HOSTS": bad})


def test_database_url_options_reach_libpq_unchanged() -> None:
    url = (
        "postgresql://alice:pw@db.example/events?sslmode=verify-full"
        "&sslrootcert=/etc/ssl/root.crt&application_name=provisioner-7"
    )
    env = persistence_env(url)
    options = json.loads(env["POSTGRES_LIBPQ_OPTIONS"])
    assert options["sslmode"] == "verify-full"
    assert options["sslrootcert"] == "/etc/ssl/root.crt"
    assert options["application_name"] == "provisioner-7"
    conninfo = conninfo_to_dict(postgres_conninfo(url, options="-c TimeZone=UTC"))
    assert conninfo["sslmode"] == "verify-full"
    assert conninfo["sslrootcert"] == "/etc/ssl/root.crt"
    assert conninfo["options"] == "-c TimeZone=UTC"
    assert "pw" not in redact(url)
    assert "s3cret" not in redact("postgresql://db.example/events?password=s3cret&sslmode=require")
    with pytest.raises(ConfigurationError, match='invalid URI query parameter: "sslmod"'):
        persistence_env("postgresql://db.example/events?sslmod=require")


def test_the_create_grace_is_settable_and_reaches_the_engine() -> None:
    assert Settings.from_env({}).engine().create_grace_s == 60.0
    quick = {"PROVISIONER_CREATE_GRACE_S": "2.5", "PROVISIONER_GATEWAY_TIMEOUT_S": "1"}
    settings = Settings.from_env(quick)
    assert settings.create_grace_s == 2.5
    assert settings.engine().create_grace_s == 2.5
    # Not shorter than a create may take: the slot would open while ours is in flight.
    for grace in ("10", "2.5"):
        with pytest.raises(
            SettingsError, match=r"^PROVISIONER_CREATE_GRACE_S \(.*\) must be longer"
        ):
            Settings.from_env({"PROVISIONER_CREATE_GRACE_S": grace})
    for bad in ("0", "-1", "soon", "86401"):
        with pytest.raises(SettingsError, match=r"^PROVISIONER_CREATE_GRACE_S must be a number"):
            Settings.from_env({"PROVISIONER_CREATE_GRACE_S": bad})
    with pytest.raises(ConfigurationError, match=r"^PROVISIONER_CREATE_GRACE_S is set but empty"):
        Settings.from_env({"PROVISIONER_CREATE_GRACE_S": " "})


def test_the_parents_are_configured_or_the_embedded_ones_and_never_guessed() -> None:
    given = Settings.from_env({"PROVISIONER_PARENT_IDS": " org-a, org-b ,org-a"})
    assert given.parents() == ("org-a", "org-b")
    assert given.engine(acting=True).parent_ids == frozenset({"org-a", "org-b"})
    assert given.engine().parent_ids is None  # read-only use: not needed
    assert Settings.from_env({}).parents() == ("org-parent",)  # the embedded default
    assert Settings.from_env({"PROVISIONER_FAKE_GATEWAY": "1"}).parents() == ("org-parent",)
    remote = {"PROVISIONER_GATEWAY_URL": "https://gw.example", "PROVISIONER_GATEWAY_TOKEN": "t"}
    with pytest.raises(SettingsError, match="PROVISIONER_PARENT_IDS is not set"):
        Settings.from_env(remote).engine(acting=True)
    broker = {"PROVISIONER_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//"}
    with pytest.raises(SettingsError, match="PROVISIONER_PARENT_IDS is not set"):
        Settings.from_env(broker).parents()
    for bad in (",", "org a", "x" * 129, "org/../x"):
        with pytest.raises(SettingsError, match="PROVISIONER_PARENT_IDS must be"):
            Settings.from_env({"PROVISIONER_PARENT_IDS": bad})


def test_the_command_skew_and_plain_http_gateways_are_checked() -> None:
    assert Settings.from_env({}).engine().command_skew_s == 300
    assert Settings.from_env({"PROVISIONER_COMMAND_SKEW_S": "5"}).engine().command_skew_s == 5
    with pytest.raises(SettingsError, match="PROVISIONER_COMMAND_SKEW_S"):
        Settings.from_env({"PROVISIONER_COMMAND_SKEW_S": "-1"})
    plain = {"PROVISIONER_GATEWAY_URL": "http://gw.example", "PROVISIONER_GATEWAY_TOKEN": "t"}
    with pytest.raises(SettingsError, match=r"plain http to gw\.example"):
        Settings.from_env(plain)
    assert Settings.from_env({**plain, "PROVISIONER_GATEWAY_ALLOW_HTTP": "1"}).gateway_allow_http
    for loopback in ("http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000"):
        Settings.from_env({**plain, "PROVISIONER_GATEWAY_URL": loopback})
