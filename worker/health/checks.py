"""The health checks: the database, the broker, the gateway and its circuit, and
the stored state (relay and projection lag, stuck attempts) read by `StoredFacts`,
one cached snapshot of the log and the read models shared with the metrics' gauges."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import psycopg

from domain.liveness import FleetVerdict, Liveness, gateway_silence, liveness, newest
from domain.pacing import PaceRules, PaceState, rate_now, shown
from domain.ports import (
    CertificateRefused,
    TransientGatewayError,
    Unauthorized,
    WorkspaceGone,
)
from infrastructure.broker.connection import connection
from infrastructure.broker.outbox import TOPICS
from infrastructure.broker.topology import COMMANDS_QUEUE, HOPS_QUEUE
from infrastructure.gateway.contact import cause
from infrastructure.redaction import redact
from infrastructure.settings.model import BrokerTls
from infrastructure.store.eventstore import (
    is_postgres,
    open_event_store,
    persistence_env,
    postgres_conninfo,
)
from infrastructure.views.heartbeats import read_processes
from infrastructure.views.log_source import LogSource
from infrastructure.views.queries import (
    count_attempts,
    count_degraded,
    list_attempts,
    relay_position,
)
from infrastructure.views.store import SqlViewStore
from worker.health.results import CheckRefused, Clock, Degraded, Unhealthy, describe, utc_now

# The gateway check reads the status of a workspace that cannot exist: the cheapest
# call of the contract (one GET, no listing, no workspace touched); the gateway
# authenticates before it looks the id up, so 404 proves reach and token, 401/403
# a refused token.
PROBE_WORKSPACE = "provisioner-health-probe"
PROBE_TIMEOUT_S = 3.0


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


def queued_messages(
    url: str, tls: BrokerTls | None = None, *, timeout_s: float = PROBE_TIMEOUT_S
) -> Callable[[], int | None]:
    """The messages ready in the hop and command queues (a passive declare of each on a
    new AMQP connection: nothing is created or consumed); None where they do not exist."""

    def count() -> int | None:
        total = 0
        with connection(url, tls, connect_timeout=timeout_s) as conn:
            conn.connect()
            for name in (HOPS_QUEUE, COMMANDS_QUEUE):
                try:
                    declared = conn.channel().queue_declare(queue=name, passive=True)
                except conn.channel_errors:  # not declared yet: nothing waits in it
                    continue
                total += int(declared.message_count)
        return total

    return count


class StatusReader(Protocol):
    """What the gateway check calls: the port's cheapest read."""

    def status(self, workspace_id: str) -> str: ...


class GatewayCheck:
    """Reach and token of the gateway, through the process's own client; the answer is
    kept for `ttl_s` so that frequent probes cost the gateway one call a minute.
    `handshake` first: a certificate that does not verify is `CheckRefused`, even while the
    fleet's pace holds every call (the handshake sends no request). `answered`: has
    any process of the deployment (this one included) ever had an answer from it? A
    gateway that gives none fails the check until then (a wrong URL: `url` names it),
    and is an outage (degraded) after."""

    def __init__(
        self,
        gateway: StatusReader,
        *,
        ttl_s: float = 60.0,
        handshake: Callable[[], Exception | None] | None = None,
        answered: Callable[[], bool] | None = None,
        url: str = "",
    ) -> None:
        self.gateway = gateway
        self.ttl_s = ttl_s
        self.handshake = handshake
        self.answered = answered
        self.url = redact(url) if url else "PROVISIONER_GATEWAY_URL"
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
        refusal = self.handshake() if self.handshake is not None else None
        if refusal is not None:
            self._since = self._since or utc_now()
            return CheckRefused(str(refusal), self._since)
        try:
            self.gateway.status(PROBE_WORKSPACE)
        except WorkspaceGone:
            self._since = None
            return "reachable, token accepted"
        except Unauthorized as exc:
            self._since = self._since or utc_now()
            return Unhealthy(f"the token is refused ({exc}): rotate it", self._since)
        except CertificateRefused as exc:  # no outage: only a setting or certificate fixes it
            self._since = self._since or utc_now()
            return CheckRefused(exc.reason, self._since)
        except TransientGatewayError as exc:  # down or throttled: hops wait, commands go on
            self._since = self._since or utc_now()
            ever = self.answered is None or self.answered()
            if gateway_silence(ever) is FleetVerdict.FAILING:  # never reached: a setting is wrong
                return Unhealthy(
                    f"the gateway at {self.url} has never answered any process of this "
                    f"deployment, nor this check ({cause(str(exc))}): check "
                    "PROVISIONER_GATEWAY_URL",
                    self._since,
                )
            return Degraded(
                f"no answer ({describe(exc)}): hops are deferred until it answers", self._since
            )
        except Exception as exc:  # noqa: BLE001 - broken answers
            self._since = self._since or utc_now()
            return Unhealthy(f"unreachable or failing: {describe(exc)}", self._since)
        self._since = None
        return "reachable, token accepted"


def circuit_check(
    read: Callable[[], tuple[PaceState, float] | None], rules: PaceRules
) -> Callable[[], str]:
    """The fleet's pace of gateway calls (infrastructure/gateway/pacing.py): an open circuit
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
            raise Degraded(_hold(state, now, rules.retry_after_max_s))
        rate = rate_now(rules, state, now)
        if rules.rate is None:
            how = "learned from 429s"
        elif rate is not None and rate < rules.rate:
            how = f"cut by 429s under the configured {shown(rules.rate)}"
        else:
            how = "configured"
        pace = "no limit" if rate is None else f"{shown(rate)} calls/s ({how})"
        return f"circuit closed; pace {pace}"

    return check


def _hold(state: PaceState, now: float, cap_s: float) -> str:
    """A Retry-After in force, and whether it is longer than PROVISIONER_RETRY_AFTER_MAX_S
    (stored by a process with a longer cap) or the gateway asked for longer."""
    left = state.paused_until - now
    held = f"throttled: the gateway's Retry-After holds every call for {left:.0f} s more"
    if left > cap_s:
        return (
            f"{held}, longer than PROVISIONER_RETRY_AFTER_MAX_S ({cap_s:g} s): a process with "
            f"a longer cap stored it; the next call cuts it to {cap_s:g} s"
        )
    if state.asked_s > cap_s:
        return (
            f"{held} (the gateway asked for {state.asked_s:.0f} s; "
            f"PROVISIONER_RETRY_AFTER_MAX_S caps it at {cap_s:g} s)"
        )
    return held


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


def stuck_check(
    facts: Callable[[], dict[str, Any]], after_s: float, max_age_s: float | None = None
) -> Callable[[], str]:
    """Fails while pending attempts are overdue past `after_s`. None overdue yet, while
    no worker beat within `max_age_s` (given), is not "all well": they cannot advance
    (degraded here; the `workers` check fails)."""

    def check() -> str:
        found = {
            k: fact(facts(), k) for k in ("pending", "stuck", "oldest_stuck_due", "oldest_stuck_id")
        }
        if found["stuck"]:
            oldest: datetime = found["oldest_stuck_due"]
            raise Unhealthy(
                f"{found['stuck']} pending attempts overdue by more than {after_s:g}s "
                f"(oldest: {found['oldest_stuck_id']})",
                oldest + timedelta(seconds=after_s),
            )
        said = f"none of {found['pending']} pending attempts overdue by more than {after_s:g}s"
        if found["pending"] and max_age_s is not None and not _a_worker_alive(facts, max_age_s):
            raise Degraded(f"{said} yet, but no worker is alive to run them (see `workers`)")
        return said

    return check


def _a_worker_alive(facts: Callable[[], dict[str, Any]], max_age_s: float) -> bool:
    """Some worker beat within `max_age_s`; true when the beats are unknown."""
    processes = facts().get("processes")
    if not isinstance(processes, list):
        return True
    now = time.time()
    return any(
        b.component == "worker" and liveness(b, now, max_age_s) is Liveness.ALIVE for b in processes
    )


def stuck_releases_check(facts: Callable[[], dict[str, Any]], after_s: float) -> Callable[[], str]:
    """A warning (the service works on) while releases stay owed long after their end."""

    def check() -> str:
        owed, stuck = fact(facts(), "releases_owed"), fact(facts(), "releases_stuck")
        if stuck:
            raise Degraded(
                f"{stuck} ended attempts still owe a release more than {after_s:g}s after they "
                "ended: the reconciler's 'release still owed' lines name each brand and attempt"
            )
        return f"{owed} releases owed, none for more than {after_s:g}s"

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
        clock: Clock = utc_now,
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
            # The heartbeats of an in-process store are only in its own process.
            "processes": _attempt(
                lambda: None if in_process and self.app is None else read_processes(store)
            ),
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
        for key in ("pending", "stuck", "releases_owed", "releases_stuck"):
            facts[key] = counts if isinstance(counts, Exception) else counts[key]
        processes = facts["processes"]
        facts["heartbeats"] = newest(processes) if isinstance(processes, list) else processes
        facts["gateway_answered_at"] = (
            max((b.gateway_answered_at or 0.0 for b in processes), default=0.0) or None
            if isinstance(processes, list)
            else processes
        )
        facts["brands_degraded"] = _attempt(lambda: count_degraded(store))
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
