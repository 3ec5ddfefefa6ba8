"""Prometheus metrics of the long-running processes (docs/operations.md, "Health and
metrics"). Counters end in `_total`, durations are in seconds, and every label
takes values from a closed set (message types, outcome and reason enums,
gateway operations, status classes): no id, URL or free text becomes a label.

Gauges of the stored state (lag, pending, stuck, owed) are read when scraped,
through `StateCollector`, from the facts the readiness checks use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from domain.attempt import ProvisioningAttempt
from domain.liveness import age_s
from domain.policies import FailureReason

HOP_SECONDS = Histogram(
    "provisioner_handle_seconds",
    "Time to handle one message (a hop, release, command), by type",
    ["type"],
    buckets=(0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2, 5),
)
HANDLED = Counter("provisioner_messages_total", "Messages handled, by type", ["type"])
DEAD_LETTERED = Counter(
    "provisioner_dead_letters_total", "Messages dead-lettered, by reason", ["reason"]
)
RETRIED = Counter(
    "provisioner_retries_total", "Messages re-published after an infrastructure failure"
)
RELAYED = Counter("provisioner_relayed_total", "Messages the relay published, by kind", ["kind"])
HOPS = Counter(
    "provisioner_hops_total",
    "Hops run by this worker, by outcome (promoted, scheduled, deferred, failed, stood_down, "
    "duplicate)",
    ["outcome"],
)
ATTEMPTS_ENDED = Counter(
    "provisioner_attempts_ended_total",
    "Attempts that ended, by state and failure reason (none unless failed), counted by the relay",
    ["state", "reason"],
)
GATEWAY_REQUESTS = Counter(
    "provisioner_gateway_requests_total",
    "Gateway requests, by operation and status class (2xx..5xx; 'error': no answer)",
    ["operation", "status_class"],
)
GATEWAY_AUTH_FAILURES = Counter(
    "provisioner_gateway_auth_failures_total",
    "Gateway answers 401 or 403 (the token needs rotating), by operation",
    ["operation"],
)
GATEWAY_SECONDS = Histogram(
    "provisioner_gateway_request_duration_seconds",
    "Duration of one gateway request (each retry counts apart), by operation",
    ["operation"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

GATEWAY_CIRCUIT_OPEN = Gauge(
    "provisioner_gateway_circuit_open",
    "1 while this process last saw the fleet's gateway circuit open (calls held), else 0",
)
GATEWAY_HELD = Counter(
    "provisioner_gateway_held_total",
    "Gateway calls held back by the fleet's pace (rate, Retry-After, open circuit): not sent",
)
GATEWAY_THROTTLE_WAIT = Counter(
    "provisioner_gateway_throttle_wait_seconds_total",
    "Seconds calls waited for their turn at the fleet's rate before they were sent",
)

GATEWAY_FAMILY_SHARE = Gauge(
    "provisioner_gateway_family_bound_share",
    "The largest share of its byte bound among the last family listing of each parent "
    "read by this process (decision 032); past 0.8 a warning is logged; 1: one was refused",
)

GATEWAY_BYTES = Counter(
    "provisioner_gateway_bytes",
    "Bytes of gateway answers' bodies read (each retry counts apart), by operation",
    ["operation"],
)
FAMILY_ASKS = Counter(
    "provisioner_gateway_family_asks",
    "Family listings asked for by this process's hops and audits, by how they were served: "
    "'read' made a read, 'joined' was served by a read another caller made after it asked",
    ["served"],
)

OPERATIONS = frozenset(
    {"create_child", "status", "family", "list_projects", "delete_project", "health"}
)
_REASONS = frozenset(r.value for r in FailureReason)
_ENDED: dict[type, str] = {
    ProvisioningAttempt.Promoted: "promoted",
    ProvisioningAttempt.Failed: "failed",
    ProvisioningAttempt.Cancelled: "cancelled",
    ProvisioningAttempt.Superseded: "superseded",
}


def status_class(code: int | None) -> str:
    """`2xx`..`5xx` for an HTTP status, `error` when no answer came back."""
    if code is None or not 100 <= code <= 599:
        return "error"
    return f"{code // 100}xx"


def observe_gateway(operation: str, code: int | None, seconds: float) -> None:
    """One gateway request (the `observe` hook of `HttpGateway`)."""
    op = operation if operation in OPERATIONS else "other"
    GATEWAY_REQUESTS.labels(op, status_class(code)).inc()
    GATEWAY_SECONDS.labels(op).observe(seconds)
    if code in (401, 403):
        GATEWAY_AUTH_FAILURES.labels(op).inc()


def observe_bytes(operation: str, size: int) -> None:
    """The bytes of one gateway answer's body (the `on_bytes` hook of `HttpGateway`)."""
    GATEWAY_BYTES.labels(operation if operation in OPERATIONS else "other").inc(size)


def observe_family_ask(served: str) -> None:
    """One family call (the `on_ask` hook of `SharedFamilyReads`): 'read' or 'joined'."""
    FAMILY_ASKS.labels(served if served in ("read", "joined") else "other").inc()


def observe_family_share(share: float) -> None:
    """The largest family listing's share of its bound (`on_family_share` of `HttpGateway`)."""
    GATEWAY_FAMILY_SHARE.set(share)


def observe_pace(kind: str, value: float) -> None:
    """What the pace did (the `on_event` hook of `infrastructure.gateway.pacing.Pace`)."""
    if kind == "waited":
        GATEWAY_THROTTLE_WAIT.inc(value)
    elif kind == "held":
        GATEWAY_HELD.inc(value)
    elif kind == "circuit":
        GATEWAY_CIRCUIT_OPEN.set(value)


def count_hop(outcome: str) -> None:
    HOPS.labels(outcome).inc()


def count_ended(event: object) -> None:
    """Count an attempt-ending event (the relay sees each once); others are ignored."""
    state = _ENDED.get(type(event))
    if state is None:
        return
    reason = "none"
    if state == "failed":
        reason = str(getattr(event, "reason", ""))
        reason = reason if reason in _REASONS else "other"
    ATTEMPTS_ENDED.labels(state, reason).inc()


class StateCollector(Collector):
    """Gauges of the stored state, computed when scraped from `facts()`:

    {"relay_lag": int | None, "projection_lag": {name: int}, "pending": int,
     "stuck": int, "releases_owed": int, "brands_degraded": int}; a value that is
    missing, None or an exception (it could not be read) is left out, and a failure to read any
    leaves every gauge out of that scrape.
    """

    def __init__(self, facts: Callable[[], dict[str, Any]]) -> None:
        self._facts = facts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            facts = self._facts()
        except Exception:  # noqa: BLE001 - the readiness check names it; a scrape stays up
            return
        facts = {k: v for k, v in facts.items() if not isinstance(v, Exception)}
        if facts.get("heartbeats"):
            ages = GaugeMetricFamily(
                "provisioner_component_heartbeat_age_seconds",
                "Seconds since a background component's last heartbeat in this database",
                labels=["component"],
            )
            for name, beat in sorted(facts["heartbeats"].items()):
                ages.add_metric([name], age_s(beat, time.time()))
            yield ages
        if facts.get("relay_lag") is not None:
            yield GaugeMetricFamily(
                "provisioner_relay_lag_events",
                "Events in the log the relay has not published yet",
                value=facts["relay_lag"],
            )
        lags = facts.get("projection_lag")
        if lags:
            family = GaugeMetricFamily(
                "provisioner_projection_lag_events",
                "Events in the log a projection has not applied yet",
                labels=["projection"],
            )
            for name, behind in sorted(lags.items()):
                family.add_metric([name], behind)
            yield family
        for key, name, text in (
            ("pending", "provisioner_attempts_pending", "Attempts still pending"),
            ("stuck", "provisioner_attempts_stuck", "Pending attempts overdue past the threshold"),
            ("releases_owed", "provisioner_releases_owed", "Ended attempts that owe a release"),
            (
                "releases_stuck",
                "provisioner_releases_stuck",
                "Ended attempts still owing a release past the stuck threshold",
            ),
            (
                "brands_degraded",
                "provisioner_brands_degraded",
                "Brands bound to a workspace the gateway reported terminal on re-confirm",
            ),
        ):
            if facts.get(key) is not None:
                yield GaugeMetricFamily(name, text, value=facts[key])


AUDIT_FINDINGS = Gauge(
    "provisioner_audit_findings",
    "Findings of the reconciler's last upstream audit of every parent on record, by kind",
    ["kind"],
)


def observe_audit(counts: Mapping[str, int]) -> None:
    """The last audit's findings by kind (the caller gives every kind, 0 when none, so
    that an alert clears)."""
    for kind, count in counts.items():
        AUDIT_FINDINGS.labels(kind).set(count)
