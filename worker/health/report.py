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
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from domain.pacing import PaceState
from domain.ports import Gateway, TransientGatewayError
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.gateway.contact import GatewayContact
from infrastructure.gateway.pacing import MemoryPaceStore, Pace, PaceStore, PgPaceStore, read_pace
from infrastructure.gateway.tls import certificate_refused
from infrastructure.settings.model import Settings
from infrastructure.settings.parsing import SettingsError
from infrastructure.store.eventstore import is_postgres
from infrastructure.views.connection import ViewConnection
from infrastructure.views.heartbeats import read_processes
from worker.health.checks import (
    GatewayCheck,
    StoredFacts,
    broker_check,
    circuit_check,
    database_check,
    projection_lag_check,
    queued_messages,
    relay_lag_check,
    stuck_check,
    stuck_releases_check,
)
from worker.health.liveness import fleet_checks
from worker.health.results import Check, CheckResult, Health, Unhealthy

__all__ = [
    "check_once",
    "checks_for",
    "gateway_check",
]


def checks_for(
    settings: Settings,
    parts: tuple[str, ...],
    *,
    gateway: Gateway | None,
    app: Any = None,
    views_url: str | None = None,
    pace: Callable[[], tuple[PaceState, float] | None] | None = None,
    contact: GatewayContact | None = None,
) -> tuple[list[Check], StoredFacts]:
    """The checks of a process running `parts` (all of them: the `health` command),
    and the stored facts they and the gauges read. A process checks the heartbeats
    of its own background parts (one that hangs stops beating) and, as warnings, of
    the parts they wait on; `health`, all; each but the projections alone, that a
    worker is alive while work waits (health_liveness.fleet_checks). `contact`: when
    this process last had an answer from the gateway."""
    facts = StoredFacts(
        settings.database_url,
        stuck_after_s=settings.health_stuck_after_s,
        app=app,
        views_url=views_url,
    )
    checks: list[Check] = [("database", database_check(settings.database_url))]
    queued = None
    if parts != ("projections",) and urlsplit(settings.broker_url).scheme != "memory":
        checks.append(("broker", broker_check(settings.broker_url, settings.broker_tls())))
        queued = queued_messages(settings.broker_url, settings.broker_tls())
    if gateway is not None:
        url = settings.gateway_url if not settings.fake_gateway else ""
        check = GatewayCheck(
            gateway,
            handshake=_handshake(settings),
            answered=answered_by(facts, contact),
            url=url or "",
        )
        checks.append(("gateway", check))
    if pace is not None:
        checks.append(("gateway_circuit", circuit_check(pace, settings.pace())))
    if "relay" in parts:
        checks.append(("relay_lag", relay_lag_check(facts, settings.health_max_lag)))
    if "projections" in parts:
        checks.append(("projection_lag", projection_lag_check(facts, settings.health_max_lag)))
    if "reconciler" in parts:
        stuck = stuck_check(facts, settings.health_stuck_after_s, settings.heartbeat_max_age_s)
        checks.append(("stuck_attempts", stuck))
        checks.append(
            ("stuck_releases", stuck_releases_check(facts, settings.health_stuck_after_s))
        )
    checks.extend(fleet_checks(facts, parts, settings.heartbeat_max_age_s, queued))
    return checks, facts


def answered_by(
    facts: Callable[[], dict[str, Any]], contact: GatewayContact | None
) -> Callable[[], bool]:
    """Has the gateway ever answered this process (`contact`) or any process of the
    deployment (a beat's `gateway_answered_at`)? Beats that cannot be read count as
    yes: a configuration error is said only on evidence."""

    def answered() -> bool:
        if contact is not None and contact.answered_at is not None:
            return True
        try:
            found = facts()["gateway_answered_at"]
        except Exception:  # noqa: BLE001 - unknown: not judged a wrong URL
            return True
        if isinstance(found, Exception):
            return True
        return found is not None or facts()["processes"] is None

    return answered


def _handshake(settings: Settings) -> Callable[[], Exception | None] | None:
    """The TLS handshake with the configured gateway (none for the fake or plain http)."""
    if settings.fake_gateway or settings.gateway_url is None:
        return None
    return functools.partial(certificate_refused, settings.gateway_url, settings.gateway_ca_file)


class PacedProbe:
    """The gateway check's one call for a command or a page, through the fleet's pace
    (PostgreSQL's row, as the workers': a Retry-After or an open circuit holds it too):
    a client and the pace opened for the call and closed after it, so nothing is held
    between calls."""

    def __init__(
        self, settings: Settings, url: str, token: str, contact: GatewayContact | None = None
    ) -> None:
        self.settings = settings
        self.url = url
        self.token = token
        self.contact = contact or GatewayContact()  # any answer the call had, noted

    def _store(self) -> PaceStore:
        if not is_postgres(self.settings.database_url):
            return MemoryPaceStore()  # no fleet to share with: `run` alone calls it
        try:
            return PgPaceStore(self.settings.database_url, self.url, max_size=1, timeout_s=3.0)
        except Exception as exc:  # noqa: BLE001 - never sent unpaced
            raise TransientGatewayError(
                f"status: not sent (the fleet's pace cannot be read: {type(exc).__name__})"
            ) from None

    def status(self, workspace_id: str) -> str:
        s = self.settings
        pace = Pace(self._store(), s.pace())
        try:
            with HttpGateway(
                self.url,
                self.token,
                read_timeout=s.gateway_timeout_s,
                retries=0,
                ca_file=s.gateway_ca_file,
                pace=pace,
                observe=self.contact.observing(),
            ) as gateway:
                return gateway.status(workspace_id)
        finally:
            pace.close()


def gateway_check(
    settings: Settings, facts: Callable[[], dict[str, Any]] | None = None
) -> Callable[[], str]:
    """The gateway check of `health` and the web view's health page: the configured
    gateway, paced with the fleet and its answer kept for a minute (keep the check to
    reuse that), after a TLS handshake; the in-process fake is not checked. A gateway
    that gives no answer and never answered any process of the deployment (`facts`'
    beats; by default read when asked) fails, a wrong URL, rather than degrades."""
    chosen = None if settings.fake_gateway or settings.gateway_url is None else settings.gateway()
    if chosen is None:
        return _unchecked_gateway(settings)
    probe = PacedProbe(settings, *chosen)
    answered = answered_by(facts or _beats(settings.database_url), probe.contact)
    return GatewayCheck(probe, handshake=_handshake(settings), answered=answered, url=chosen[0])


def _beats(url: str) -> Callable[[], dict[str, Any]]:
    """The processes' beats, read on a short connection when asked (none for an
    in-process store, whose beats live in its own process)."""

    def read() -> dict[str, Any]:
        if urlsplit(url).scheme == "memory":
            return {"processes": None, "gateway_answered_at": None}
        with ViewConnection(url, read_only=True, wait_s=0) as conn:
            beats = read_processes(conn)
        answered = [b.gateway_answered_at for b in beats if b.gateway_answered_at]
        return {"processes": beats, "gateway_answered_at": max(answered, default=None)}

    return read


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


def check_once(settings: Settings, gateway: Callable[[], str] | None = None) -> list[CheckResult]:
    """Every check, once, as `provisioner health` runs them. `gateway`: the gateway's
    check (default `gateway_check`: the configured gateway called with the configured
    token, paced with the fleet; the in-process fake, only inside `run`)."""
    pace = None
    if not settings.fake_gateway and settings.gateway_url and is_postgres(settings.database_url):
        pace = functools.partial(read_pace, settings.database_url, settings.gateway_url)
    checks, facts = checks_for(
        settings, ("worker", "relay", "projections", "reconciler"), gateway=None, pace=pace
    )
    gateway = gateway or gateway_check(settings, facts)
    checks.insert(2 if len(checks) > 1 and checks[1][0] == "broker" else 1, ("gateway", gateway))
    return Health(checks).run()
