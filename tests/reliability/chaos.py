"""The fault drivers, each on a thread of its own, drawing from its own seeded
random stream: the worker killer, PostgreSQL backend terminations, broker
connection closes, the hop duplicator, the poisoner and the producer of
deactivations and re-requests.

What the run publishes itself goes through one `Publisher` (publisher confirms)
under a lock the connection closer also takes: a close never lands in the middle
of one of our publishes, so we know exactly what we sent (the poison that must
end in the dead-letter queue).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from kombu import Connection, Exchange, Queue

from infrastructure import messages
from infrastructure.broker import COMMAND_KEY, EXCHANGE, WORK_KEY
from tests.reliability.processes import Fleet, rabbitmqctl

COPY_MARK = "x-reliability-copy"


class Publisher:
    """Raw bodies to the `provisioning` exchange, each confirmed by the broker."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.lock = threading.Lock()
        self.conn: Connection | None = None

    def _producer(self) -> Any:
        if self.conn is None:
            self.conn = Connection(self.url, transport_options={"confirm_publish": True})
            self.conn.connect()
        return self.conn.Producer()

    def publish(self, body: bytes, key: str, tries: int = 60) -> None:
        """Publish once; a failure before the broker confirmed is retried on a new
        connection (the lock keeps the closer out, so a failure means not sent)."""
        with self.lock:
            for attempt in range(tries):
                try:
                    self._producer().publish(
                        body, exchange=EXCHANGE, routing_key=key, retry=False,
                        content_type="application/json", content_encoding="utf-8",
                        delivery_mode=2,
                    )  # fmt: skip
                except Exception:
                    self.close()
                    if attempt == tries - 1:
                        raise
                    time.sleep(0.5)
                else:
                    return

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.release()
        self.conn = None


class Driver(threading.Thread):
    """Acts every `pause()` seconds until stopped; errors are kept, never raised."""

    def __init__(self, name: str, stop: threading.Event, rng: random.Random) -> None:
        super().__init__(name=name, daemon=True)
        self.stop = stop
        self.rng = rng
        self.count = 0
        self.errors: list[str] = []

    def pause(self) -> float:
        return 1.0

    def act(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        while not self.stop.wait(self.pause()):
            try:
                self.act()
            except Exception as exc:  # a fault driver must keep going
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])


class WorkerKiller(Driver):
    def __init__(
        self, stop: threading.Event, rng: random.Random, fleet: Fleet, workers: list[str]
    ) -> None:
        super().__init__("worker-killer", stop, rng)
        self.fleet, self.workers = fleet, workers

    def pause(self) -> float:
        return self.rng.uniform(2.0, 5.0)

    def act(self) -> None:
        self.fleet.kill_and_restart(self.rng.choice(self.workers))
        self.count += 1


class BackendTerminator(Driver):
    """pg_terminate_backend on about half of the run database's client backends."""

    def __init__(
        self, stop: threading.Event, rng: random.Random, admin_url: str, database: str
    ) -> None:
        super().__init__("backend-terminator", stop, rng)
        self.admin_url, self.database = admin_url, database

    def pause(self) -> float:
        return self.rng.uniform(2.0, 6.0)

    def act(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as conn:
            pids = [
                row[0]
                for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = %s "
                    "AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                    [self.database],
                )
            ]
            chosen = [pid for pid in pids if self.rng.random() < 0.5]
            for pid in chosen:
                row = conn.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()
                self.count += int(bool(row and row[0]))


class ConnectionCloser(Driver):
    """`rabbitmqctl close_all_connections --vhost V` (all, or one), between our publishes."""

    def __init__(
        self, stop: threading.Event, rng: random.Random, vhost: str, publisher: Publisher
    ) -> None:
        super().__init__("connection-closer", stop, rng)
        self.vhost, self.publisher = vhost, publisher

    def pause(self) -> float:
        return self.rng.uniform(3.0, 8.0)

    def act(self) -> None:
        listed = rabbitmqctl("list_connections", "-q", "-p", self.vhost, "name")
        open_now = len([ln for ln in listed.splitlines() if ln.strip()])
        limit = 1 if self.rng.random() < 0.5 else max(open_now, 1)
        with self.publisher.lock:
            rabbitmqctl(
                "close_all_connections", "--vhost", self.vhost, "--limit", str(limit),
                "reliability run: closed on purpose",
            )  # fmt: skip
            self.publisher.close()
        self.count += min(limit, open_now)


class HopDuplicator(Driver):
    """A queue of its own bound to `provisioning`/`work` sees every work message;
    a share of the hop messages is published again (marked, so never copied twice)."""

    def __init__(self, stop: threading.Event, rng: random.Random, url: str, rate: float) -> None:
        super().__init__("hop-duplicator", stop, rng)
        self.url, self.rate = url, rate
        self.seen = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._consume()
            except Exception as exc:  # closed under us: connect again
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                self.stop.wait(0.5)

    def _consume(self) -> None:
        exchange = Exchange(EXCHANGE, "direct", durable=True)
        queue = Queue(
            "reliability.copies", exchange, routing_key=WORK_KEY, exclusive=True,
            auto_delete=True, durable=False,
        )  # fmt: skip
        with Connection(self.url, heartbeat=0) as conn:
            conn.connect()
            producer = conn.Producer()

            def on_message(message: Any) -> None:
                self._maybe_copy(message, producer)
                message.ack()

            with conn.Consumer(queue, on_message=on_message, prefetch_count=50):
                while not self.stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        conn.drain_events(timeout=0.5)

    def _maybe_copy(self, message: Any, producer: Any) -> None:
        if COPY_MARK in (message.headers or {}):
            return
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
        try:
            decoded = messages.decode(
                body,
                content_type=message.content_type,
                content_encoding=message.content_encoding,
            )
        except messages.InvalidMessage:
            return  # poison: not ours to copy
        if decoded.type != "hop":
            return
        self.seen += 1
        if self.rng.random() < self.rate:
            producer.publish(
                body, exchange=EXCHANGE, routing_key=WORK_KEY, headers={COPY_MARK: 1},
                content_type="application/json", content_encoding="utf-8", retry=False,
            )  # fmt: skip
            self.count += 1


def poison_bodies(rng: random.Random, count: int) -> list[tuple[str, str, bytes]]:
    """(kind, routing key, body): malformed, deeply nested, oversized, unknown type;
    every body unique (a nonce), on both queues."""
    kinds = ("malformed", "deeply_nested", "oversized", "unknown_type")
    out = []
    for n in range(count):
        kind = kinds[n % len(kinds)]
        key = (WORK_KEY, COMMAND_KEY)[(n // len(kinds)) % 2]
        nonce = f"poison-{rng.getrandbits(64):016x}"
        if kind == "malformed":
            body = ('{"type": "hop", "version": 1, "nonce": "' + nonce).encode()
        elif kind == "deeply_nested":
            body = ("[" * 40 + json.dumps(nonce) + "]" * 40).encode()
        elif kind == "oversized":
            pad = "x" * (70 * 1024)
            body = json.dumps({"type": "hop", "version": 1, "nonce": nonce, "pad": pad}).encode()
        else:
            body = json.dumps({"type": "explode", "version": 1, "nonce": nonce}).encode()
        out.append((kind, key, body))
    return out


class Poisoner(Driver):
    def __init__(
        self,
        stop: threading.Event,
        rng: random.Random,
        publisher: Publisher,
        bodies: list[tuple[str, str, bytes]],
        spread_s: float,
    ) -> None:
        super().__init__("poisoner", stop, rng)
        self.publisher, self.todo, self.spread_s = publisher, list(bodies), spread_s
        self.sent: list[bytes] = []
        self.kinds: Counter[str] = Counter()

    def pause(self) -> float:
        return self.spread_s / max(len(self.todo) + len(self.sent), 1)

    def act(self) -> None:
        if not self.todo:
            return
        kind, key, body = self.todo.pop(0)
        self.publisher.publish(body, key)
        self.sent.append(body)
        self.kinds[kind] += 1
        self.count += 1


class CommandProducer(Driver):
    """Deactivations and re-requests for brands in flight, each at its planned time."""

    def __init__(
        self,
        stop: threading.Event,
        rng: random.Random,
        publisher: Publisher,
        plan: list[tuple[float, str, messages.Message]],
        started: float,
        on_sent: Callable[[str, messages.Message], None] | None = None,
    ) -> None:
        super().__init__("command-producer", stop, rng)
        self.publisher, self.plan, self.started = publisher, sorted(plan, key=_at), started
        self.kinds: Counter[str] = Counter()
        self.on_sent = on_sent

    def pause(self) -> float:
        return 0.1

    def act(self) -> None:
        now = time.monotonic() - self.started
        while self.plan and self.plan[0][0] <= now:
            _, kind, message = self.plan.pop(0)
            stamped = messages.Message(
                message.type, message.version, {**message.fields, "requested_at": _now()}
            )
            self.publisher.publish(stamped.encode(), COMMAND_KEY)
            self.kinds[kind] += 1
            self.count += 1
            if self.on_sent:
                self.on_sent(kind, stamped)


def _at(item: tuple[float, str, messages.Message]) -> float:
    return item[0]


def _now() -> datetime:
    return datetime.now(UTC)
