"""Settings, parsed once per process from the environment (flags override them).

| variable                       | default                          |
|--------------------------------|----------------------------------|
| PROVISIONER_DATABASE_URL       | sqlite:///var/provisioner.sqlite |
| PROVISIONER_BROKER_URL         | memory:// (in-process)           |
| PROVISIONER_QUEUE_TYPE         | classic (quorum on a cluster)    |
| PROVISIONER_GATEWAY_URL        | (none: the embedded fake)        |
| PROVISIONER_GATEWAY_TOKEN      | (none)                           |
| PROVISIONER_GATEWAY_TIMEOUT_S  | 10                               |
| PROVISIONER_BACKOFF_BASE_S     | 5                                |
| PROVISIONER_MAX_REQUEUES       | 5                                |
| PROVISIONER_STALE_AFTER_S      | 600                              |
| PROVISIONER_CONCURRENCY        | 8                                |
| PROVISIONER_METRICS_PORT       | 0 (Prometheus /metrics off)      |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from domain.policies import Backoff
from infrastructure.service import EngineSettings

DEFAULT_DATABASE_URL = "sqlite:///var/provisioner.sqlite"


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names it."""


def _number(env: Mapping[str, str], key: str, default: float, *, integer: bool = False) -> float:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise SettingsError(f"{key} must be {kind}, got {raw!r}") from None
    if value < 0:
        raise SettingsError(f"{key} must be >= 0, got {raw!r}")
    return value


def _choice(env: Mapping[str, str], key: str, choices: tuple[str, ...]) -> str:
    raw = (env.get(key) or choices[0]).strip().lower()
    if raw not in choices:
        raise SettingsError(f"{key} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


@dataclass(frozen=True, slots=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    broker_url: str = "memory://"
    queue_type: str = "classic"
    gateway_url: str | None = None
    gateway_token: str | None = field(default=None, repr=False)
    gateway_timeout_s: float = 10.0
    backoff_base_s: float = 5.0
    max_requeues: int = 5
    stale_after_s: float = 600.0
    concurrency: int = 8
    metrics_port: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            database_url=env.get("PROVISIONER_DATABASE_URL") or DEFAULT_DATABASE_URL,
            broker_url=env.get("PROVISIONER_BROKER_URL") or "memory://",
            queue_type=_choice(env, "PROVISIONER_QUEUE_TYPE", ("classic", "quorum")),
            gateway_url=env.get("PROVISIONER_GATEWAY_URL") or None,
            gateway_token=env.get("PROVISIONER_GATEWAY_TOKEN") or None,
            gateway_timeout_s=_number(env, "PROVISIONER_GATEWAY_TIMEOUT_S", 10.0),
            backoff_base_s=_number(env, "PROVISIONER_BACKOFF_BASE_S", 5.0),
            max_requeues=int(_number(env, "PROVISIONER_MAX_REQUEUES", 5, integer=True)),
            stale_after_s=_number(env, "PROVISIONER_STALE_AFTER_S", 600.0),
            concurrency=max(1, int(_number(env, "PROVISIONER_CONCURRENCY", 8, integer=True))),
            metrics_port=int(_number(env, "PROVISIONER_METRICS_PORT", 0, integer=True)),
        )

    def engine(self) -> EngineSettings:
        try:
            backoff = Backoff(base_s=self.backoff_base_s, max_requeues=self.max_requeues)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        return EngineSettings(backoff=backoff, stale_after_s=self.stale_after_s)
