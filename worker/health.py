"""Health checks: what `provisioner health` and a process's `/readyz` report.

A check is a name and a function of no arguments that returns a short text
when all is well and raises when not (`Unhealthy` carries its own "since").
`Health` runs its checks, each on its own, and remembers since when each has
been failing. The checks of the stored state read `StoredFacts`, one cached
snapshot of the log and the read models shared with the metrics' gauges.

Which checks a process runs: docs/operations.md, "Health and metrics".
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from domain.pacing import PaceRules, PaceState, rate_now
from domain.ports import Gateway, TransientGatewayError, Unauthorized, WorkspaceGone
from infrastructure.broker import BrokerTls, connection
from infrastructure.eventstore import (
    is_postgres,
    open_event_store,
    persistence_env,
    postgres_conninfo,
)
from infrastructure.gateway import HttpGateway
from infrastructure.outbox import TOPICS
from infrastructure.pacing import read_pace
from infrastructure.redaction import redact
from infrastructure.settings import Settings, SettingsError
from infrastructure.view_queries import count_attempts, list_attempts, relay_position
from infrastructure.views import LogSource, SqlViewStore

# The gateway check reads the status of a workspace that cannot exist: the cheapest
# call of the contract (one GET, no listing, no workspace touched); the gateway
# authenticates before it looks the id up, so 404 proves reach and token, 401/403
# a refused token.
PROBE_WORKSPACE = "provisioner-health-probe"
PROBE_TIMEOUT_S = 3.0

Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


class Unhealthy(Exception):
    """A failing check: what is wrong, and since when if the check knows better."""

    def __init__(self, detail: str, since: datetime | None = None) -> None:
        super().__init__(detail)
        self.since = since


class Degraded(Unhealthy):
    """Not failing, but not well: the process still does its work (say, the gateway is
    down, so hops are deferred while commands are still consumed). Readiness holds."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    ok: bool
    detail: str
    since: datetime | None = None  # when a failing (or degraded) check started so
    degraded: bool = False  # ok, but not well (`Degraded`)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "degraded": self.degraded,
            "detail": self.detail,
            "since": self.since.isoformat() if self.since else None,
        }

    def line(self) -> str:
        since = f" (since {self.since.isoformat(timespec='seconds')})" if self.since else ""
        if self.degraded:
            return f"DEGRADED {self.name}: {self.detail}{since}"
        if self.ok:
            return f"ok       {self.name}: {self.detail}"
        return f"FAILING  {self.name}: {self.detail}{since}"


Check = tuple[str, Callable[[], str]]


class Health:
    """Runs checks; a failing one is reported with the time it was first seen failing."""

    def __init__(self, checks: Sequence[Check], *, clock: Clock = _now) -> None:
        self.checks = list(checks)
        self._clock = clock
        self._since: dict[str, datetime] = {}
        self._lock = threading.Lock()

    def run(self) -> list[CheckResult]:
        return [self._one(name, check) for name, check in self.checks]

    def _one(self, name: str, check: Callable[[], str]) -> CheckResult:
        try:
            detail = check()
        except Exception as exc:  # noqa: BLE001 - any failure of a check is that check failing
            since = exc.since if isinstance(exc, Unhealthy) else None
            with self._lock:
                first = self._since.setdefault(name, since or self._clock())
            degraded = isinstance(exc, Degraded)
            return CheckResult(name, degraded, _describe(exc), since or first, degraded)
        with self._lock:
            self._since.pop(name, None)
        return CheckResult(name, True, detail)


def healthy(results: Sequence[CheckResult]) -> bool:
    return all(r.ok for r in results)


def report(results: Sequence[CheckResult]) -> dict[str, Any]:
    status = "ok" if healthy(results) else "failing"
    if status == "ok" and any(r.degraded for r in results):
        status = "degraded"
    return {"status": status, "checks": [r.as_json() for r in results]}


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, Unhealthy):
        return text
    return redact(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:300]


# -- the checks ------------------------------------------------------------------


def database_check(url: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> Callable[[], str]:
    """A new connection to the event store's database and `SELECT 1`."""

    def check() -> str:
        if is_postgres(url):
            with psycopg.connect(
                postgres_conninfo(url), connect_timeout=max(1, round(timeout_s))
            ) as conn:
                conn.execute("SELECT 1")
            return f"reachable at {redact(url)}"
        name = persistence_env(url).get("SQLITE_DBNAME")
        if name is None or name == ":memory:":
            return "in-process"
        if not Path(name).exists():
            raise Unhealthy(f"no database file at {name}")
        lite = sqlite3.connect(f"{Path(name).resolve().as_uri()}?mode=ro", uri=True)
        try:
            lite.execute("SELECT 1").fetchone()
        finally:
            lite.close()
        return f"readable at {name}"

    return check


def broker_check(
    url: str, tls: BrokerTls | None = None, *, timeout_s: float = PROBE_TIMEOUT_S
) -> Callable[[], str]:
    """A new AMQP connection with the process's broker URL (vhost and credentials) and
    TLS options."""

    def check() -> str:
        with connection(url, tls, connect_timeout=timeout_s) as conn:
            conn.connect()
        return f"reachable at {redact(url)}"

    return check


class GatewayCheck:
    """Reach and token of the gateway, through the process's own client; the answer is
    kept for `ttl_s` so that frequent probes cost the gateway one call a minute."""

    def __init__(self, gateway: Gateway, *, ttl_s: float = 60.0) -> None:
        self.gateway = gateway
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cached: tuple[float, str | Exception] | None = None
        self._since: datetime | None = None

    def __call__(self) -> str:
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] >= self.ttl_s:
                self._cached = (time.monotonic(), self._probe())
            answer = self._cached[1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _probe(self) -> str | Exception:
        try:
            self.gateway.status(PROBE_WORKSPACE)
        except WorkspaceGone:
            self._since = None
            return "reachable, token accepted"
        except Unauthorized as exc:
            self._since = self._since or _now()
            return Unhealthy(f"the token is refused ({exc}): rotate it", self._since)
        except TransientGatewayError as exc:  # down or throttled: hops wait, commands go on
            self._since = self._since or _now()
            return Degraded(
                f"no answer ({_describe(exc)}): hops are deferred until it answers", self._since
            )
        except Exception as exc:  # noqa: BLE001 - broken answers
            self._since = self._since or _now()
            return Unhealthy(f"unreachable or failing: {_describe(exc)}", self._since)
        self._since = None
        return "reachable, token accepted"


def circuit_check(
    read: Callable[[], tuple[PaceState, float] | None], rules: PaceRules
) -> Callable[[], str]:
    """The fleet's pace of gateway calls (infrastructure/pacing.py): an open circuit
    or a Retry-After in force is degraded, never failing (hops are deferred)."""

    def check() -> str:
        found = read()
        if found is None:
            return "no gateway call made yet"
        state, now = found
        if state.open_since is not None:
            raise Degraded(
                f"circuit open: the gateway has not answered ({state.last_error}); calls held, "
                f"hops deferred, one probe every {rules.probe_every_s:g} s",
                datetime.fromtimestamp(state.open_since, UTC),
            )
        if state.paused_until > now:
            raise Degraded(
                f"throttled: the gateway's Retry-After holds every call for "
                f"{state.paused_until - now:.0f} s more"
            )
        rate = rate_now(rules, state, now)
        how = "configured" if rules.rate is not None else "learned from 429s"
        pace = "no limit" if rate is None else f"{rate:.3g} calls/s ({how})"
        return f"circuit closed; pace {pace}"

    return check


def relay_lag_check(facts: Callable[[], dict[str, Any]], max_lag: int) -> Callable[[], str]:
    def check() -> str:
        behind = fact(facts(), "relay_lag")
        if behind is None:
            return "not tracked in an in-process store"
        if behind > max_lag:
            raise Unhealthy(f"the relay is {behind} events behind (threshold {max_lag})")
        return f"{behind} events behind"

    return check


def projection_lag_check(facts: Callable[[], dict[str, Any]], max_lag: int) -> Callable[[], str]:
    def check() -> str:
        lags: dict[str, int] = fact(facts(), "projection_lag")
        over = {name: n for name, n in sorted(lags.items()) if n > max_lag}
        if over:
            names = ", ".join(f"{name} {n}" for name, n in over.items())
            raise Unhealthy(f"projections behind (events, threshold {max_lag}): {names}")
        return ", ".join(f"{name} {n}" for name, n in sorted(lags.items())) + " events behind"

    return check


def stuck_check(facts: Callable[[], dict[str, Any]], after_s: float) -> Callable[[], str]:
    def check() -> str:
        found = {k: fact(facts(), k) for k in ("pending", "stuck", "oldest_stuck_due",
                                                "oldest_stuck_id")}  # fmt: skip
        if found["stuck"]:
            oldest: datetime = found["oldest_stuck_due"]
            raise Unhealthy(
                f"{found['stuck']} pending attempts overdue by more than {after_s:g}s "
                f"(oldest: {found['oldest_stuck_id']})",
                oldest + timedelta(seconds=after_s),
            )
        return f"none of {found['pending']} pending attempts overdue by more than {after_s:g}s"

    return check


# -- the stored state --------------------------------------------------------------


def _attempt(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - kept as the figure's value; see `fact`
        return exc


def fact(facts: dict[str, Any], key: str) -> Any:
    """A figure of `StoredFacts`, or the exception that kept it from being read."""
    value = facts[key]
    if isinstance(value, Exception):
        raise value
    return value


class StoredFacts:
    """Lag, pending, stuck and owed, read from the log and the read models at most
    once per `ttl_s`. `app` and `views_url`: the process's own in-process store
    (memory://); otherwise one short-lived connection per read."""

    def __init__(
        self,
        database_url: str,
        *,
        stuck_after_s: float,
        app: Any = None,
        views_url: str | None = None,
        ttl_s: float = 5.0,
        clock: Clock = _now,
    ) -> None:
        self.database_url = database_url
        self.stuck_after_s = stuck_after_s
        self.app = app
        self.views_url = views_url or database_url
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, Any]] | None = None

    def __call__(self) -> dict[str, Any]:
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] >= self.ttl_s:
                self._cached = (time.monotonic(), self.read())
            return self._cached[1]

    def read(self) -> dict[str, Any]:
        app = self.app or open_event_store(
            self.database_url, one_shot=True, read_only=True, wait_s=0
        )
        try:
            with SqlViewStore(self.views_url, read_only=True, wait_s=0) as store:
                return self._read(app, store)
        finally:
            if self.app is None:
                app.close()

    def _read(self, app: Any, store: Any) -> dict[str, Any]:
        """Each figure read on its own: one that cannot be read (say, read models not
        set up where only the relay runs) is its exception, raised by the check that
        reads it (`fact`) and left out of the gauges."""
        # The library's in-memory log is not in the read models' database: count it there.
        in_process = urlsplit(self.database_url).scheme == "memory"
        source = LogSource(app, None if in_process else store)
        now = self.clock()
        facts: dict[str, Any] = {
            "relay_lag": _attempt(lambda: self._relay_lag(app, store)),
            "projection_lag": _attempt(
                lambda: {item["projection"]: item["behind"] for item in store.status(source)}
            ),
        }
        counts = _attempt(
            lambda: count_attempts(store, stuck_overdue_s=self.stuck_after_s, now=now)
        )
        oldest = _attempt(
            lambda: list_attempts(store, stuck=True, overdue_s=self.stuck_after_s, limit=1, now=now)
        )
        for key in ("pending", "stuck", "releases_owed"):
            facts[key] = counts if isinstance(counts, Exception) else counts[key]
        for key, column in (
            ("oldest_stuck_due", "next_hop_due"),
            ("oldest_stuck_id", "attempt_id"),
        ):
            facts[key] = (
                oldest if isinstance(oldest, Exception) else (oldest[0][column] if oldest else None)
            )
        return facts

    def _relay_lag(self, app: Any, store: Any) -> int | None:
        if urlsplit(self.database_url).scheme == "memory":
            return None  # an in-process store: the relay's position lives in its process
        table = app.recorder.events_table_name
        return int(store.count_events(table, relay_position(store), TOPICS))


# -- what a process and the command check ------------------------------------------


def checks_for(
    settings: Settings,
    parts: tuple[str, ...],
    *,
    gateway: Gateway | None,
    app: Any = None,
    views_url: str | None = None,
    pace: Callable[[], tuple[PaceState, float] | None] | None = None,
) -> tuple[list[Check], StoredFacts]:
    """The checks of a process running `parts` (all of them: the `health` command),
    and the stored facts they and the gauges read."""
    facts = StoredFacts(
        settings.database_url, stuck_after_s=settings.health_stuck_after_s, app=app,
        views_url=views_url,
    )  # fmt: skip
    checks: list[Check] = [("database", database_check(settings.database_url))]
    if parts != ("projections",) and urlsplit(settings.broker_url).scheme != "memory":
        checks.append(("broker", broker_check(settings.broker_url, settings.broker_tls())))
    if gateway is not None:
        checks.append(("gateway", GatewayCheck(gateway)))
    if pace is not None:
        checks.append(("gateway_circuit", circuit_check(pace, settings.pace())))
    if "relay" in parts:
        checks.append(("relay_lag", relay_lag_check(facts, settings.health_max_lag)))
    if "projections" in parts:
        checks.append(("projection_lag", projection_lag_check(facts, settings.health_max_lag)))
    if "reconciler" in parts:
        checks.append(("stuck_attempts", stuck_check(facts, settings.health_stuck_after_s)))
    return checks, facts


def _unchecked_gateway(settings: Settings) -> Callable[[], str]:
    """No gateway to call: the fake where `run` would refuse it fails the check."""

    def check() -> str:
        if not settings.fake_gateway:
            return "not checked (no gateway configured)"
        try:
            settings.gateway()
        except SettingsError as exc:
            raise Unhealthy(str(exc)) from None
        return "not checked (the in-process fake)"

    return check


def check_once(settings: Settings) -> list[CheckResult]:
    """Every check, once, as `provisioner health` runs them: the configured gateway is
    called with the configured token (the in-process fake, only inside `run`)."""
    chosen = None if settings.fake_gateway or settings.gateway_url is None else settings.gateway()
    gateway = None
    if chosen is not None:
        gateway = HttpGateway(
            *chosen,
            read_timeout=settings.gateway_timeout_s,
            retries=0,
            ca_file=settings.gateway_ca_file,
        )
    pace = None
    if chosen is not None and is_postgres(settings.database_url):
        pace = functools.partial(read_pace, settings.database_url, chosen[0])
    try:
        checks, _ = checks_for(
            settings, ("worker", "relay", "projections", "reconciler"), gateway=gateway, pace=pace
        )
        if gateway is None:
            checks.insert(2 if len(checks) > 1 and checks[1][0] == "broker" else 1,
                          ("gateway", _unchecked_gateway(settings)))  # fmt: skip
        return Health(checks).run()
    finally:
        if gateway is not None:
            gateway.close()
