"""Settings, parsed and checked once per process from the environment (flags override them).

Each variable is a row of the settings' table (infrastructure/settings/table.py):
its parser and bounds, its default, what it means; docs/configuration.md is
written from it. `Settings` has a field per row, named after the variable, whose
default is the row's; `from_env` reads every row, then checks the few rules that
hold across settings.

Every value is checked here, before anything connects: a bad one raises
`ConfigurationError` with one line naming the variable. A variable that is set
but empty is an error, never a fallback to the default, and so is a name not in the table.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from domain.pacing import PaceRules
from domain.policies import MAX_HOP
from domain.producer_scopes import Scope
from domain.waits import Backoff, Deferral
from infrastructure.redaction import Secrets, url_passwords
from infrastructure.settings.checks import check_names
from infrastructure.settings.engine import EngineSettings
from infrastructure.settings.parsing import (
    SettingsError,
    is_loopback,
    producer_scopes,
)
from infrastructure.settings.table import (
    BY_NAME,
    SETTINGS,
    VARIABLES,
    default_of,
)
from infrastructure.store.eventstore import is_postgres

__all__ = [
    "BrokerTls",
    "Settings",
    "log_format",
    "log_secrets",
]

# The in-process fake gateway's parent: the parents of the embedded default.
EMBEDDED_PARENTS = ("org-parent",)
FAKE_SWITCH = "PROVISIONER_FAKE_GATEWAY"
FAKE_OPT_IN = "--i-know-this-is-a-test"  # the CLI's global flag; PROVISIONER_FAKE_GATEWAY=test


def log_format(env: Mapping[str, str] | None = None) -> str:
    """PROVISIONER_LOG_FORMAT, read on its own: logging is set up before the rest."""
    return str(BY_NAME["PROVISIONER_LOG_FORMAT"].parse(os.environ if env is None else env))


def log_secrets(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The values no log line may show (`Settings.secrets()`), read from the raw
    environment, unchecked: logging is set up before the settings are, and an error
    line about a bad setting is scrubbed too. Never raises."""
    env = os.environ if env is None else env

    def raw(key: str) -> str | None:
        return env.get(key, "").strip() or None

    unchecked = Settings(
        database_url=raw("PROVISIONER_DATABASE_URL") or default_of("database_url"),
        broker_url=raw("PROVISIONER_BROKER_URL") or default_of("broker_url"),
        gateway_url=raw("PROVISIONER_GATEWAY_URL"),
        gateway_token=raw("PROVISIONER_GATEWAY_TOKEN"),
        web_token=raw("PROVISIONER_WEB_TOKEN"),
    )
    return unchecked.secrets().values


@dataclass(frozen=True, slots=True)
class Settings:
    """A field per setting of the table, its default the table's (`default_of`)."""

    database_url: str = default_of("database_url")
    broker_url: str = default_of("broker_url")
    allow_mixed_embedded: bool = default_of("allow_mixed_embedded")
    queue_type: str = default_of("queue_type")
    gateway_url: str | None = default_of("gateway_url")
    gateway_token: str | None = field(default=default_of("gateway_token"), repr=False)
    gateway_ca_file: str | None = default_of("gateway_ca_file")
    gateway_allow_http: bool = default_of("gateway_allow_http")
    parent_ids: tuple[str, ...] | None = default_of("parent_ids")
    command_skew_s: float = default_of("command_skew_s")
    producer_scopes: str | None = default_of("producer_scopes")  # checked; `scopes()` reads it
    broker_ca_file: str | None = default_of("broker_ca_file")
    broker_cert_file: str | None = default_of("broker_cert_file")
    broker_key_file: str | None = default_of("broker_key_file")
    fake_gateway: bool = default_of("fake_gateway")
    fake_gateway_test: bool = default_of("fake_gateway_test")  # the fake on PG/AMQP, on purpose
    gateway_timeout_s: float = default_of("gateway_timeout_s")
    backoff_base_s: float = default_of("backoff_base_s")
    max_requeues: int = default_of("max_requeues")
    stale_after_s: float = default_of("stale_after_s")
    create_grace_s: float = default_of("create_grace_s")
    inference_window_s: float = default_of("inference_window_s")
    attempt_deadline_s: float = default_of("attempt_deadline_s")
    decommission_delay_s: float = default_of("decommission_delay_s")
    defer_max_s: float = default_of("defer_max_s")
    gateway_rate: float | None = default_of("gateway_rate")
    gateway_burst: int = default_of("gateway_burst")
    gateway_probe_s: float = default_of("gateway_probe_s")
    retry_after_max_s: float = default_of("retry_after_max_s")
    concurrency: int = default_of("concurrency")
    metrics_port: int = default_of("metrics_port")
    metrics_host: str = default_of("metrics_host")
    health_max_lag: int = default_of("health_max_lag")
    health_stuck_after_s: float = default_of("health_stuck_after_s")
    audit_every_s: float = default_of("audit_every_s")
    heartbeat_max_age_s: float = default_of("heartbeat_max_age_s")
    connect_wait_s: float = default_of("connect_wait_s")
    log_format: str = default_of("log_format")
    web_host: str = default_of("web_host")
    web_port: int = default_of("web_port")
    web_token: str | None = field(default=default_of("web_token"), repr=False)
    web_allow_open: bool = default_of("web_allow_open")
    web_allowed_hosts: tuple[str, ...] = default_of("web_allowed_hosts")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Every setting of the table read from `env` (the process's environment) and
        checked, then the rules across settings: SettingsError, one line, on the first
        that fails."""
        env = os.environ if env is None else env
        check_names(env, VARIABLES)
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            values.update(setting.values(setting.parse(env)))
        settings = cls(**values)
        settings._check_across()
        return settings

    def _check_across(self) -> None:
        """The rules no single setting can check."""
        if self.fake_gateway and self.gateway_url is not None:
            raise SettingsError(
                f"{FAKE_SWITCH}=1 and PROVISIONER_GATEWAY_URL are both set: choose one"
            )
        self.scopes()  # checked now: a bad scope stops the process at start
        if (self.broker_cert_file is None) != (self.broker_key_file is None):
            raise SettingsError(
                "PROVISIONER_BROKER_CERT_FILE and PROVISIONER_BROKER_KEY_FILE go together: "
                "set both for a client certificate, or neither"
            )
        if self.gateway_url is not None and not self.gateway_allow_http:
            where = urlsplit(self.gateway_url)
            if where.scheme.lower() == "http" and not is_loopback(where.hostname):
                raise SettingsError(
                    f"PROVISIONER_GATEWAY_URL is plain http to {where.hostname}: the token "
                    "would cross the network in clear; use https://, or set "
                    "PROVISIONER_GATEWAY_ALLOW_HTTP=1 if this network is trusted"
                )
        if self.inference_window_s < self.create_grace_s:
            raise SettingsError(
                f"PROVISIONER_INFERENCE_WINDOW_S ({self.inference_window_s:g}) must be at "
                f"least PROVISIONER_CREATE_GRACE_S ({self.create_grace_s:g}): a lost "
                "create's workspace may turn up until its grace ends"
            )
        if self.create_grace_s <= self.gateway_timeout_s:
            raise SettingsError(
                f"PROVISIONER_CREATE_GRACE_S ({self.create_grace_s:g}) must be longer than "
                f"PROVISIONER_GATEWAY_TIMEOUT_S ({self.gateway_timeout_s:g}): a create "
                "still in flight would otherwise be given up and the title created again"
            )
        settle_s = self.engine().backoff.total_s()
        if self.attempt_deadline_s <= settle_s:
            raise SettingsError(
                f"PROVISIONER_ATTEMPT_DEADLINE_S ({self.attempt_deadline_s:g}) must be "
                f"longer than the settle budget ({settle_s:g} s "
                "from PROVISIONER_BACKOFF_BASE_S and PROVISIONER_MAX_REQUEUES)"
            )
        if self.attempt_deadline_s / (self.defer_max_s / 2) >= MAX_HOP:
            raise SettingsError(
                "PROVISIONER_ATTEMPT_DEADLINE_S over half of PROVISIONER_DEFER_MAX_S allows "
                f"more than {MAX_HOP:,} hops: a shorter deadline or a longer cap"
            )

    def secrets(self) -> Secrets:
        """Every configured secret, for `Secrets.scrub`: the gateway token, the
        passwords of the database, broker and gateway URLs, and the web token."""
        return Secrets.of(
            self.gateway_token,
            *url_passwords(self.database_url),
            *url_passwords(self.broker_url),
            *url_passwords(self.gateway_url),
            self.web_token,
        )

    def gateway(self) -> tuple[str, str] | None:
        """The real gateway's URL and token; None when the fake was asked for.

        Refuses (ConfigurationError) when neither a gateway nor the fake is
        configured: a process that calls the gateway never runs against a fake
        it was not asked to use. The fake with PostgreSQL or a real broker looks
        like a leftover in production: refused unless `fake_gateway_test`.
        """
        if self.fake_gateway:
            real_broker = urlsplit(self.broker_url).scheme.lower() != "memory"
            if (is_postgres(self.database_url) or real_broker) and not self.fake_gateway_test:
                raise SettingsError(
                    f"{FAKE_SWITCH}=1: the in-process fake gateway with PostgreSQL/RabbitMQ: "
                    f"this looks like production; pass {FAKE_OPT_IN} (or set {FAKE_SWITCH}=test) "
                    "to run against the fake"
                )
            return None
        if self.gateway_url is None:
            raise SettingsError(
                "PROVISIONER_GATEWAY_URL is not set: give the workspace gateway's URL and "
                f"PROVISIONER_GATEWAY_TOKEN, or set {FAKE_SWITCH}=1 to use the in-process fake"
            )
        if self.gateway_token is None:
            raise SettingsError(
                "PROVISIONER_GATEWAY_TOKEN is not set: it is required with PROVISIONER_GATEWAY_URL"
            )
        return self.gateway_url, self.gateway_token

    def broker_tls(self) -> BrokerTls:
        """What an amqps:// connection trusts (the CA file) and shows (a client certificate)."""
        return BrokerTls(self.broker_ca_file, self.broker_cert_file, self.broker_key_file)

    def scopes(self) -> dict[str, Scope]:
        """Each scoped producer's brands and parents (PROVISIONER_PRODUCER_SCOPES; none:
        every producer may command every brand)."""
        if self.producer_scopes is None:
            return {}
        return producer_scopes(self.producer_scopes, self.parent_ids)

    def parents(self) -> tuple[str, ...]:
        """The parents the service may act under: PROVISIONER_PARENT_IDS; unset, the
        in-process fake's parent with the fake or the embedded default (an in-process
        broker and no gateway), else ConfigurationError: a process that acts on
        commands never trusts the parent a producer names."""
        if self.parent_ids is not None:
            return self.parent_ids
        embedded = urlsplit(self.broker_url).scheme == "memory" and self.gateway_url is None
        if self.fake_gateway or embedded:
            return EMBEDDED_PARENTS
        raise SettingsError(
            "PROVISIONER_PARENT_IDS is not set: give the comma-separated ids of the "
            "organisation's parent workspaces this service may act under "
            '(docs/operations.md, "Parents")'
        )

    def engine(self, *, acting: bool = False) -> EngineSettings:
        """The service's rules. `acting`: for a process that acts on commands or hops,
        with the parents it may act under (`parents`, which may refuse)."""
        try:
            backoff = Backoff(base_s=self.backoff_base_s, max_requeues=self.max_requeues)
        except ValueError as exc:
            raise SettingsError(
                f"PROVISIONER_BACKOFF_BASE_S, PROVISIONER_MAX_REQUEUES: {exc}"
            ) from None
        return EngineSettings(
            backoff=backoff,
            deferral=Deferral(
                max_s=self.defer_max_s,
                deadline_s=self.attempt_deadline_s,
                retry_after_max_s=self.retry_after_max_s,
            ),
            stale_after_s=self.stale_after_s,
            create_grace_s=self.create_grace_s,
            inference_window_s=self.inference_window_s,
            parent_ids=frozenset(self.parents()) if acting else None,
            command_skew_s=self.command_skew_s,
            decommission_delay_s=self.decommission_delay_s,
        )

    def pace(self) -> PaceRules:
        """The fleet's pace of gateway calls (domain/pacing.py)."""
        return PaceRules(
            rate=self.gateway_rate,
            burst=self.gateway_burst,
            probe_every_s=self.gateway_probe_s,
            retry_after_max_s=self.retry_after_max_s,
            probe_lease_s=self.gateway_timeout_s + 4,
        )  # + the connect timeout, 3 s


@dataclass(frozen=True, slots=True)
class BrokerTls:
    """What an `amqps://` connection trusts and shows: the CA file the broker's
    certificate must chain to (None: the system's CAs), and a client certificate
    with its key (both or neither)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs its key, and a key its certificate")

    def ssl_options(self, host: str) -> dict[str, Any]:
        """kombu's `ssl` argument as py-amqp reads it (`SSLTransport._wrap_socket_sni`):
        it checks the certificate's name only when given `server_hostname`, and loads
        the system's CAs when given no `ca_certs`."""
        options: dict[str, Any] = {
            "server_hostname": host,
            "cert_reqs": ssl.CERT_REQUIRED,
            "tls_minimum_version": ssl.TLSVersion.TLSv1_2,
        }
        if self.ca_file is not None:
            options["ca_certs"] = self.ca_file
        if self.cert_file is not None:
            options |= {"certfile": self.cert_file, "keyfile": self.key_file}
        return options
