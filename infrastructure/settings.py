"""Settings, parsed and checked once per process from the environment (flags override them).

| variable                         | default                          |
|----------------------------------|----------------------------------|
| PROVISIONER_DATABASE_URL         | sqlite:///var/provisioner.sqlite |
| PROVISIONER_BROKER_URL           | memory:// (in-process)           |
| PROVISIONER_ALLOW_MIXED_EMBEDDED | 0 (1: embedded mixed with real)  |
| PROVISIONER_QUEUE_TYPE           | classic (quorum on a cluster)    |
| PROVISIONER_GATEWAY_URL          | (none)                           |
| PROVISIONER_GATEWAY_TOKEN        | (none)                           |
| PROVISIONER_GATEWAY_CA_FILE      | (none: the system's CAs)         |
| PROVISIONER_GATEWAY_ALLOW_HTTP   | 0 (1: plain http off loopback)   |
| PROVISIONER_PARENT_IDS           | (required but for the fake)      |
| PROVISIONER_COMMAND_SKEW_S       | 300 (requested_at in the future) |
| PROVISIONER_PRODUCER_SCOPES      | (none: any producer, any brand)  |
| PROVISIONER_BROKER_CA_FILE       | (none: the system's CAs)         |
| PROVISIONER_BROKER_CERT_FILE     | (none: no client certificate)    |
| PROVISIONER_BROKER_KEY_FILE      | (none)                           |
| PROVISIONER_FAKE_GATEWAY         | 0 (1: the fake; test: on PG/AMQP)|
| PROVISIONER_GATEWAY_TIMEOUT_S    | 10                               |
| PROVISIONER_BACKOFF_BASE_S       | 5                                |
| PROVISIONER_MAX_REQUEUES         | 5                                |
| PROVISIONER_STALE_AFTER_S        | 600                              |
| PROVISIONER_CREATE_GRACE_S       | 60 (an unconfirmed create's wait)|
| PROVISIONER_INFERENCE_WINDOW_S   | 3600 (a lost create's credit)    |
| PROVISIONER_ATTEMPT_DEADLINE_S   | 86400 (a day: deferral's end)    |
| PROVISIONER_DECOMMISSION_DELAY_S | 259200 (3 days before emptying)  |
| PROVISIONER_DEFER_MAX_S          | 30 (cap of a deferred hop's wait)|
| PROVISIONER_GATEWAY_RATE         | (none: learned from 429s)        |
| PROVISIONER_GATEWAY_BURST        | 1                                |
| PROVISIONER_GATEWAY_PROBE_S      | 10 (circuit open: probe interval)|
| PROVISIONER_RETRY_AFTER_MAX_S    | 300 (longest Retry-After hold)   |
| PROVISIONER_CONCURRENCY          | 8                                |
| PROVISIONER_METRICS_PORT         | 0 (metrics and probes off)       |
| PROVISIONER_METRICS_HOST         | 127.0.0.1                        |
| PROVISIONER_HEALTH_MAX_LAG       | 10000 (events behind)            |
| PROVISIONER_HEALTH_STUCK_AFTER_S | 900 (seconds overdue)            |
| PROVISIONER_AUDIT_EVERY_S        | 86400 (upstream audit; 0: off)   |
| PROVISIONER_HEARTBEAT_MAX_AGE_S  | 60 (a component's silence)       |
| PROVISIONER_CONNECT_WAIT_S       | 30 (one-shot commands)           |
| PROVISIONER_LOG_FORMAT           | auto (text on a TTY, else json)  |
| PROVISIONER_WEB_HOST             | 127.0.0.1 (`provisioner web`)    |
| PROVISIONER_WEB_PORT             | 8080                             |
| PROVISIONER_WEB_TOKEN            | (none: the web view is open)     |
| PROVISIONER_WEB_ALLOW_OPEN       | 0 (1: no token off loopback)     |
| PROVISIONER_WEB_ALLOWED_HOSTS    | (none: bound host and loopback)  |

Every value is checked here, before anything connects: a bad one raises
`ConfigurationError` with one line naming the variable. A variable that is set
but empty is an error, never a fallback to the default, and so is a name not in this table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from domain.pacing import PaceRules
from domain.policies import Backoff, Deferral
from domain.producer_scopes import Scope
from infrastructure.broker import BrokerTls
from infrastructure.eventstore import DATABASE_SCHEMES, check_database_url, is_postgres
from infrastructure.failures import ConfigurationError
from infrastructure.messages import MAX_HOP
from infrastructure.redaction import Secrets, url_passwords
from infrastructure.service import EngineSettings
from infrastructure.settings_checks import ALLOW_MIXED, check_names, table_names
from infrastructure.settings_parsing import (
    SettingsError,
    allowed_hosts,
    check_host,
    check_token,
    check_url,
    choice,
    env_value,
    file_path,
    flag,
    gateway_rate,
    integer,
    is_loopback,
    log_format,
    number,
    parent_ids,
    positive,
    producer_scopes,
    split_host,
    web_token,
)

__all__ = [
    "BROKER_SCHEMES",
    "DEFAULT_DATABASE_URL",
    "Settings",
    "SettingsError",
    "check_host",
    "check_url",
    "is_loopback",
    "log_format",
    "log_secrets",
    "split_host",
]

DEFAULT_DATABASE_URL = "sqlite:///var/provisioner.sqlite"
# The in-process fake gateway's parent: the parents of the embedded default.
EMBEDDED_PARENTS = ("org-parent",)
BROKER_SCHEMES = ("amqp", "amqps", "pyamqp", "memory")
GATEWAY_SCHEMES = ("http", "https")
FAKE_SWITCH = "PROVISIONER_FAKE_GATEWAY"
FAKE_OPT_IN = "--i-know-this-is-a-test"  # the CLI's global flag; PROVISIONER_FAKE_GATEWAY=test
VARIABLES = table_names(__doc__)  # the settings, in the table's order


def log_secrets(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The values no log line may show (`Settings.secrets()`), read from the raw
    environment, unchecked: logging is set up before the settings are, and an error
    line about a bad setting is scrubbed too. Never raises."""
    env = os.environ if env is None else env

    def raw(key: str) -> str | None:
        return env.get(key, "").strip() or None

    unchecked = Settings(
        database_url=raw("PROVISIONER_DATABASE_URL") or DEFAULT_DATABASE_URL,
        broker_url=raw("PROVISIONER_BROKER_URL") or "memory://",
        gateway_url=raw("PROVISIONER_GATEWAY_URL"),
        gateway_token=raw("PROVISIONER_GATEWAY_TOKEN"),
        web_token=raw("PROVISIONER_WEB_TOKEN"),
    )
    return unchecked.secrets().values


@dataclass(frozen=True, slots=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    broker_url: str = "memory://"
    allow_mixed_embedded: bool = False
    queue_type: str = "classic"
    gateway_url: str | None = None
    gateway_token: str | None = field(default=None, repr=False)
    gateway_ca_file: str | None = None
    gateway_allow_http: bool = False
    parent_ids: tuple[str, ...] | None = None
    command_skew_s: float = 300.0
    producer_scopes: str | None = None  # checked; `scopes()` reads it
    broker_ca_file: str | None = None
    broker_cert_file: str | None = None
    broker_key_file: str | None = None
    fake_gateway: bool = False
    fake_gateway_test: bool = False  # the fake on PostgreSQL or RabbitMQ, on purpose
    gateway_timeout_s: float = 10.0
    backoff_base_s: float = 5.0
    max_requeues: int = 5
    stale_after_s: float = 600.0
    create_grace_s: float = 60.0
    inference_window_s: float = 3600.0
    attempt_deadline_s: float = 86_400.0
    decommission_delay_s: float = 259_200.0  # 3 days: a mistake or a lapse is undone in time
    defer_max_s: float = 30.0
    gateway_rate: float | None = None
    gateway_burst: int = 1
    gateway_probe_s: float = 10.0
    retry_after_max_s: float = 300.0  # one 429 never holds the fleet for an hour
    concurrency: int = 8
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    health_max_lag: int = 10_000
    health_stuck_after_s: float = 900.0
    audit_every_s: float = 86_400.0  # the reconciler's upstream audit of each parent
    heartbeat_max_age_s: float = 60.0
    connect_wait_s: float = 30.0
    log_format: str = "auto"
    web_host: str = "127.0.0.1"
    web_port: int = 8080
    web_token: str | None = field(default=None, repr=False)
    web_allow_open: bool = False
    web_allowed_hosts: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        check_names(env, VARIABLES)
        default = cls()  # each variable's default is its field's
        database_url = env_value(env, "PROVISIONER_DATABASE_URL") or default.database_url
        check_url("PROVISIONER_DATABASE_URL", database_url, DATABASE_SCHEMES, host=False)
        try:
            check_database_url(database_url)
        except ConfigurationError as exc:
            raise SettingsError(f"PROVISIONER_DATABASE_URL: {exc}") from None
        gateway_url = env_value(env, "PROVISIONER_GATEWAY_URL")
        if gateway_url is not None:
            check_url("PROVISIONER_GATEWAY_URL", gateway_url, GATEWAY_SCHEMES)
        token = env_value(env, "PROVISIONER_GATEWAY_TOKEN")
        if token is not None:
            check_token("PROVISIONER_GATEWAY_TOKEN", token)
        fake = choice(env, FAKE_SWITCH, ("0", "1", "test"))
        settings = cls(
            database_url=database_url,
            broker_url=check_url(
                "PROVISIONER_BROKER_URL",
                env_value(env, "PROVISIONER_BROKER_URL") or default.broker_url,
                BROKER_SCHEMES,
            ),
            allow_mixed_embedded=flag(env, ALLOW_MIXED),
            queue_type=choice(env, "PROVISIONER_QUEUE_TYPE", ("classic", "quorum")),
            gateway_url=gateway_url,
            gateway_token=token,
            gateway_ca_file=file_path(env, "PROVISIONER_GATEWAY_CA_FILE"),
            gateway_allow_http=flag(env, "PROVISIONER_GATEWAY_ALLOW_HTTP"),
            parent_ids=parent_ids(env),
            command_skew_s=number(
                env, "PROVISIONER_COMMAND_SKEW_S", default.command_skew_s, low=0, high=86400 * 7
            ),
            producer_scopes=env_value(env, "PROVISIONER_PRODUCER_SCOPES"),
            broker_ca_file=file_path(env, "PROVISIONER_BROKER_CA_FILE"),
            broker_cert_file=file_path(env, "PROVISIONER_BROKER_CERT_FILE"),
            broker_key_file=file_path(env, "PROVISIONER_BROKER_KEY_FILE"),
            fake_gateway=fake != "0",
            fake_gateway_test=fake == "test",
            gateway_timeout_s=positive(
                env, "PROVISIONER_GATEWAY_TIMEOUT_S", default.gateway_timeout_s, high=600
            ),
            backoff_base_s=positive(
                env, "PROVISIONER_BACKOFF_BASE_S", default.backoff_base_s, high=86400
            ),
            max_requeues=integer(
                env, "PROVISIONER_MAX_REQUEUES", default.max_requeues, low=0, high=1000
            ),
            stale_after_s=positive(
                env, "PROVISIONER_STALE_AFTER_S", default.stale_after_s, high=10**7
            ),
            create_grace_s=positive(
                env, "PROVISIONER_CREATE_GRACE_S", default.create_grace_s, high=86400
            ),
            inference_window_s=positive(
                env, "PROVISIONER_INFERENCE_WINDOW_S", default.inference_window_s, high=86400
            ),
            attempt_deadline_s=positive(
                env, "PROVISIONER_ATTEMPT_DEADLINE_S", default.attempt_deadline_s, high=10**8
            ),
            defer_max_s=number(
                env, "PROVISIONER_DEFER_MAX_S", default.defer_max_s, low=2, high=86400
            ),
            decommission_delay_s=number(
                env,
                "PROVISIONER_DECOMMISSION_DELAY_S",
                default.decommission_delay_s,
                low=0,
                high=86400 * 90,
            ),
            gateway_rate=gateway_rate(env),
            gateway_burst=integer(
                env, "PROVISIONER_GATEWAY_BURST", default.gateway_burst, low=1, high=10**6
            ),
            gateway_probe_s=positive(
                env, "PROVISIONER_GATEWAY_PROBE_S", default.gateway_probe_s, high=3600
            ),
            retry_after_max_s=number(
                env, "PROVISIONER_RETRY_AFTER_MAX_S", default.retry_after_max_s, low=1, high=3600
            ),
            concurrency=integer(
                env, "PROVISIONER_CONCURRENCY", default.concurrency, low=1, high=512
            ),
            metrics_port=integer(
                env, "PROVISIONER_METRICS_PORT", default.metrics_port, low=0, high=65535
            ),
            metrics_host=check_host(
                "PROVISIONER_METRICS_HOST",
                env_value(env, "PROVISIONER_METRICS_HOST") or default.metrics_host,
            ),
            health_max_lag=integer(
                env, "PROVISIONER_HEALTH_MAX_LAG", default.health_max_lag, low=0, high=10**9
            ),
            health_stuck_after_s=positive(
                env, "PROVISIONER_HEALTH_STUCK_AFTER_S", default.health_stuck_after_s, high=10**7
            ),
            audit_every_s=number(
                env, "PROVISIONER_AUDIT_EVERY_S", default.audit_every_s, low=0, high=86400 * 30
            ),
            heartbeat_max_age_s=positive(
                env, "PROVISIONER_HEARTBEAT_MAX_AGE_S", default.heartbeat_max_age_s, high=10**6
            ),
            connect_wait_s=number(
                env, "PROVISIONER_CONNECT_WAIT_S", default.connect_wait_s, low=0, high=86400
            ),
            log_format=log_format(env),
            web_host=check_host(
                "PROVISIONER_WEB_HOST", env_value(env, "PROVISIONER_WEB_HOST") or default.web_host
            ),
            web_port=integer(env, "PROVISIONER_WEB_PORT", default.web_port, low=1, high=65535),
            web_token=web_token(env),
            web_allow_open=flag(env, "PROVISIONER_WEB_ALLOW_OPEN"),
            web_allowed_hosts=allowed_hosts(env),
        )
        if settings.fake_gateway and settings.gateway_url is not None:
            raise SettingsError(
                f"{FAKE_SWITCH}=1 and PROVISIONER_GATEWAY_URL are both set: choose one"
            )
        settings.scopes()  # checked now: a bad scope stops the process at start
        if (settings.broker_cert_file is None) != (settings.broker_key_file is None):
            raise SettingsError(
                "PROVISIONER_BROKER_CERT_FILE and PROVISIONER_BROKER_KEY_FILE go together: "
                "set both for a client certificate, or neither"
            )
        if gateway_url is not None and not settings.gateway_allow_http:
            where = urlsplit(gateway_url)
            if where.scheme.lower() == "http" and not is_loopback(where.hostname):
                raise SettingsError(
                    f"PROVISIONER_GATEWAY_URL is plain http to {where.hostname}: the token "
                    "would cross the network in clear; use https://, or set "
                    "PROVISIONER_GATEWAY_ALLOW_HTTP=1 if this network is trusted"
                )
        if settings.inference_window_s < settings.create_grace_s:
            raise SettingsError(
                f"PROVISIONER_INFERENCE_WINDOW_S ({settings.inference_window_s:g}) must be at "
                f"least PROVISIONER_CREATE_GRACE_S ({settings.create_grace_s:g}): a lost "
                "create's workspace may turn up until its grace ends"
            )
        if settings.create_grace_s <= settings.gateway_timeout_s:
            raise SettingsError(
                f"PROVISIONER_CREATE_GRACE_S ({settings.create_grace_s:g}) must be longer than "
                f"PROVISIONER_GATEWAY_TIMEOUT_S ({settings.gateway_timeout_s:g}): a create "
                "still in flight would otherwise be given up and the title created again"
            )
        if settings.attempt_deadline_s <= settings.engine().backoff.total_s():
            raise SettingsError(
                f"PROVISIONER_ATTEMPT_DEADLINE_S ({settings.attempt_deadline_s:g}) must be "
                f"longer than the settle budget ({settings.engine().backoff.total_s():g} s "
                "from PROVISIONER_BACKOFF_BASE_S and PROVISIONER_MAX_REQUEUES)"
            )
        if settings.attempt_deadline_s / (settings.defer_max_s / 2) >= MAX_HOP:
            raise SettingsError(
                "PROVISIONER_ATTEMPT_DEADLINE_S over half of PROVISIONER_DEFER_MAX_S allows "
                f"more than {MAX_HOP:,} hops: a shorter deadline or a longer cap"
            )
        return settings

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
        return PaceRules(rate=self.gateway_rate, burst=self.gateway_burst,
                         probe_every_s=self.gateway_probe_s,
                         retry_after_max_s=self.retry_after_max_s,
                         probe_lease_s=self.gateway_timeout_s + 4)  # + the connect timeout, 3 s
