"""The fault drivers, each on a thread of its own, drawing from its own seeded
random stream: the worker killer, PostgreSQL backend terminations, broker
connection closes, the hop duplicator, the poisoner, the producer of
deactivations and re-requests, the gateway's outages and a meter of its calls.

What the run publishes itself goes through one `Publisher` (publisher confirms)
under a lock the connection closer also takes: a close never lands in the middle
of one of our publishes, so we know exactly what we sent (the poison that must
end in the dead-letter queue).
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.error import URLError
from urllib.parse import urlsplit
from urllib.request import Request, urlopen

import psycopg
from kombu import Connection, Exchange, Queue

from infrastructure.broker import messages
from infrastructure.broker.topology import COMMAND_KEY, EXCHANGE, WORK_KEY
from tests.reliability.plan import OutagePlan
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
        self.times: list[float] = []

    def pause(self) -> float:
        return self.rng.uniform(2.0, 5.0)

    def act(self) -> None:
        self.fleet.kill_and_restart(self.rng.choice(self.workers))
        self.count += 1
        self.times.append(time.time())  # wall clock: compared with event timestamps


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
    """(kind, routing key, body): malformed, deeply nested, oversized, unknown type, a
    provision under a parent not configured, a deactivate from the far future; every
    body unique (a nonce), on both queues."""
    kinds = ("malformed", "deeply_nested", "oversized", "unknown_type", "foreign_parent",
             "far_future")  # fmt: skip
    out = []
    for n in range(count):
        kind = kinds[n % len(kinds)]
        key = (WORK_KEY, COMMAND_KEY)[(n // len(kinds)) % 2]
        if kind in ("foreign_parent", "far_future"):  # commands: refused by the use case
            key = COMMAND_KEY
        nonce = f"poison-{rng.getrandbits(64):016x}"
        if kind == "malformed":
            body = ('{"type": "hop", "version": 1, "nonce": "' + nonce).encode()
        elif kind == "deeply_nested":
            body = ("[" * 40 + json.dumps(nonce) + "]" * 40).encode()
        elif kind == "oversized":
            pad = "x" * (70 * 1024)
            body = json.dumps({"type": "hop", "version": 1, "nonce": nonce, "pad": pad}).encode()
        elif kind == "foreign_parent":
            body = json.dumps(
                {
                    "type": "provision",
                    "version": 1,
                    "brand_id": nonce,
                    "title": "Poison",
                    "parent_workspace_id": "not-ours",
                }
            ).encode()
        elif kind == "far_future":
            body = json.dumps(
                {
                    "type": "deactivate",
                    "version": 1,
                    "brand_id": nonce,
                    "requested_at": "9999-12-31T23:59:59.999999+00:00",
                }
            ).encode()
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


def fake_admin(url: str, path: str, body: object = None, timeout: float = 30.0) -> Any:
    """A `/_fake/` admin call (GET, or POST with a JSON body); its JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    method = "GET" if body is None else "POST"
    request = Request(f"{url}/_fake/{path}", data, {"Content-Type": "application/json"},
                      method=method)  # fmt: skip
    with urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())


def refuses_connections(url: str) -> bool:
    """Whether a TCP connect to the fake is refused now."""
    where = urlsplit(url)
    try:
        socket.create_connection((where.hostname, where.port or 80), timeout=2).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


class OutageMaker(Driver):
    """The planned outages of the gateway, each at its time: `POST /_fake/outage`.

    For each it records what was asked and what happened: when it began (seconds
    after the run began sending the brands), the calls it answered 503 (read once
    it is over; 0 for "refuse"), and for mode "refuse" whether a connect was
    refused half-way through. An outage once begun runs its length even if the
    run stops; one not begun by then is left out (`todo`)."""

    def __init__(
        self,
        stop: threading.Event,
        rng: random.Random,
        url: str,
        plan: list[OutagePlan],
        started: float,
    ) -> None:
        super().__init__("outage-maker", stop, rng)
        self.url, self.todo, self.started = url, list(plan), started
        self.done: list[dict[str, Any]] = []

    def run(self) -> None:
        while self.todo:
            outage = self.todo[0]
            if self.stop.wait(max(0.0, self.started + outage.at_s - time.monotonic())):
                return
            self.todo.pop(0)
            try:
                self.done.append(self._play(outage))
                self.count += 1
            except Exception as exc:  # a fault driver must keep going
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])

    def _play(self, outage: OutagePlan) -> dict[str, Any]:
        began = time.monotonic()
        fake_admin(self.url, "outage", {"seconds": outage.seconds, "mode": outage.mode})
        played: dict[str, Any] = {
            "mode": outage.mode,
            "seconds": outage.seconds,
            "at_s": round(began - self.started, 1),
        }
        ends = began + outage.seconds
        if outage.mode == "refuse":
            time.sleep(outage.seconds / 2)
            played["refused_seen"] = refuses_connections(self.url)
        time.sleep(max(0.0, ends - time.monotonic()))
        state = self._state_again(ends)
        if state is not None and state.get("outage"):
            played["calls"] = state["outage"]["calls"]
        return played

    def _state_again(self, ends: float) -> dict[str, Any] | None:
        """The fake's state once it answers again (a refuse outage re-binds its port)."""
        for _ in range(120):
            try:
                state: dict[str, Any] = fake_admin(self.url, "state", timeout=10)
            except (URLError, OSError):
                time.sleep(0.5)
                continue
            while state.get("outage") and state["outage"]["ends_in_s"] > 0:
                time.sleep(state["outage"]["ends_in_s"])
                state = fake_admin(self.url, "state", timeout=10)
            return state
        self.errors.append(f"the fake did not answer for 60 s after the outage ended at {ends}")
        return None


class GatewayMeter(Driver):
    """Samples the fake's `calls_total` and `throttled` every 2 s (admin calls are
    never counted or throttled): the busiest 2 s of calls, for reading a run. A
    sample during a refuse outage fails and is skipped."""

    def __init__(self, stop: threading.Event, rng: random.Random, url: str) -> None:
        super().__init__("gateway-meter", stop, rng)
        self.url = url
        self.samples: list[tuple[float, int, int]] = []  # (monotonic, calls_total, throttled)

    def pause(self) -> float:
        return 2.0

    def act(self) -> None:
        try:
            state = fake_admin(self.url, "state", timeout=10)
        except (URLError, OSError):
            return  # refused: an outage
        self.samples.append((time.monotonic(), state["calls_total"], state["throttled"]))

    def peak_calls_per_s(self) -> float:
        rates = [
            (c2 - c1) / (t2 - t1)
            for (t1, c1, _), (t2, c2, _) in zip(self.samples, self.samples[1:], strict=False)
            if t2 > t1
        ]
        return round(max(rates, default=0.0), 1)
