"""Prometheus metrics of the worker and the relay (served when a port is configured)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

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


def serve(port: int) -> None:
    """Expose /metrics on this port (0 = do not serve)."""
    if port:
        start_http_server(port, addr="127.0.0.1")
