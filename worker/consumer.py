"""The hop worker: consumes work and command messages and runs them on a thread pool.

It holds no business logic: each message's handler is `worker.handlers`'
(selected by type), what becomes of a delivery once its handler has run is
`worker.retry_policy`'s decision, and `worker.delivery.Settler` applies it.

The consuming thread owns the broker connection: it drains events (which also
services heartbeats), decodes and validates each message, hands valid ones to
the pool, and acks each only after its handler has committed. Pool threads
never touch the connection; they put finished work on a queue that the
consuming thread empties between drains.

- Invalid messages (too large, too deeply nested, not UTF-8, bad JSON, a bad
  header, unknown type or version, schema errors, a type the queue it came
  from does not accept: a hop on the commands queue) and permanent failures
  (unknown attempt or brand, a refused command) go to the dead-letter queue
  with the reason in their headers, then are acked (worker/delivery.py). An
  unexpected failure while settling one message is contained there too.
- An infrastructure failure (database down, too much contention) is not the
  brand's fault: the message is re-published after a delay with a retry count
  and the attempt stays untouched; after the last retry it is dead-lettered.
  A command refused only for now (RetryLater: a decommission in progress), or
  a release the gateway did not answer (TransientGatewayError), is
  re-published on its own schedule, for about an hour (worker/retry_policy.py).
- Prefetch is the concurrency plus a little headroom (a quarter, at least 2):
  a pool thread that finishes a hop starts the next message at once instead
  of waiting for its ack to reach the broker and a new delivery to come back.
- `stop` (SIGTERM): stop consuming, finish the hops in flight, ack them, hand
  the prefetched messages not started yet back to the broker, return.
- A broker that is down (at start too) or drops the connection: reconnect
  with jittered backoff (0.5 s doubling to 15 s), logging the outage once and
  "connected to ..." once; unacked messages are redelivered by the broker, and
  hops are idempotent. A broker that refuses the credentials or the vhost
  raises ServiceRefused out of `run` (retrying cannot fix it).
- It beats (infrastructure/views/heartbeats.py) as its loop turns, while it waits for
  the broker too: its threads, the deliveries in flight (received and not settled
  yet) and the count handled; the beat's write is at most one upsert every few
  seconds, on the consuming thread.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kombu.entity import Queue
from kombu.messaging import Consumer

from domain.producer_scopes import Scope
from domain.waits import RETRY_DELAYS_S, WAIT_DELAYS_S
from infrastructure.broker.connection import connect
from infrastructure.broker.delays import DelayScheduler
from infrastructure.broker.failures import BROKER_ERRORS, broker_refusal
from infrastructure.broker.publisher import Broker
from infrastructure.broker.topology import Topology
from infrastructure.failures import ReconnectPauses
from infrastructure.outages import Outage
from infrastructure.service import ProvisioningService
from infrastructure.settings.model import BrokerTls, log_secrets
from infrastructure.views.heartbeats import Heartbeat
from worker.delivery import Settler
from worker.handlers import give_up, handle
from worker.reading import Delivery

__all__ = [
    "HopWorker",
    "WorkerStats",
]

log = logging.getLogger("provisioner.worker")

# Drain timeouts of the consuming thread: every slot busy / otherwise (see _drain_timeout).
SATURATED_DRAIN_S = 0.005
IDLE_DRAIN_S = 0.1


@dataclass
class WorkerStats:
    handled: int = 0
    dead_lettered: int = 0
    retried: int = 0
    reconnects: int = 0
    by_type: dict[str, int] = field(default_factory=dict)


class HopWorker:
    def __init__(
        self,
        service: ProvisioningService,
        broker_url: str,
        *,
        topology: Topology | None = None,
        concurrency: int = 8,
        scheduler: DelayScheduler | None = None,
        retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S,
        wait_delays_s: tuple[float, ...] = WAIT_DELAYS_S,
        prefetch_headroom: int | None = None,
        database_url: str | None = None,
        tls: BrokerTls | None = None,
        scopes: Mapping[str, Scope] | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.service = service
        self.scopes = scopes or {}  # each producer's brands (domain/producer_scopes.py)
        self.url = broker_url
        self.tls = tls
        self.topology = topology or Topology()
        self.concurrency = concurrency
        headroom = max(2, concurrency // 4) if prefetch_headroom is None else prefetch_headroom
        self.prefetch = concurrency + headroom
        self.scheduler = scheduler
        self.retry_delays_s = retry_delays_s
        self.wait_delays_s = wait_delays_s
        self.stats = WorkerStats()
        self.ready = threading.Event()
        self.broker_outage = Outage(log, "worker", broker_url)
        database = database_url or "the event store"
        self.database_outage = Outage(log, "worker", database, announce_start=False)
        # (connection generation, message, delivery, future) of finished handlers
        self._finished: queue.Queue[tuple[int, Any, Delivery, Future[str]]] = queue.Queue()
        self._generation = 0
        self._in_flight = 0
        # Handlers submitted on the current connection and not settled yet.
        self._submitted: set[Future[str]] = set()
        self.heartbeat = heartbeat or Heartbeat(None, "worker")
        self.heartbeat.gauges = lambda: (self.concurrency, self._in_flight, self.stats.handled)
        with connect(broker_url, tls) as probe:
            self._connection_errors = (
                *BROKER_ERRORS,
                *probe.connection_errors,
                *probe.channel_errors,
            )

    def run(self, stop: threading.Event) -> None:
        """Consume until `stop` is set. A broker that is down (at start too) or drops
        the connection is waited for with backoff, the outage logged once; one that
        refuses us for good raises ServiceRefused. Nothing else ends the loop."""
        backoff = ReconnectPauses()
        try:
            with ThreadPoolExecutor(self.concurrency, thread_name_prefix="hop") as pool:
                while not stop.is_set():
                    self.heartbeat.beat()
                    try:
                        self._consume(pool, stop, backoff)
                    except Exception as exc:  # classified here: only a refusal ends the loop
                        refused = broker_refusal(exc, self.url)
                        if refused is not None:
                            raise refused from None
                        # Messages not started yet are void with their connection.
                        self._cancel_queued()
                        self.stats.reconnects += 1
                        pause = backoff.next()
                        if isinstance(exc, self._connection_errors):
                            self.broker_outage.failed(self.url, exc, pause)
                        else:
                            log.exception("worker: unexpected error; reconnecting in %.1fs", pause)
                        self.heartbeat.wait(stop, pause)
        finally:
            self.heartbeat.close()

    def _consume(
        self, pool: ThreadPoolExecutor, stop: threading.Event, backoff: ReconnectPauses
    ) -> None:
        # Results of handlers started on an earlier connection are dropped: their
        # delivery tags are void, and the broker redelivers those messages.
        self._generation += 1
        self._in_flight = 0
        self._submitted = set()
        with connect(self.url, self.tls) as conn:
            conn.connect()  # one try: run() backs off between tries
            channel = conn.channel()
            self.topology.declare(channel)
            publisher = Broker(self.url, self.topology, scheduler=self.scheduler, tls=self.tls)
            settler = Settler(
                publisher,
                stats=self.stats,
                retry_delays_s=self.retry_delays_s,
                wait_delays_s=self.wait_delays_s,
                connection_errors=self._connection_errors,
                database=self.database_outage,
                # A release or decommission the gateway did not answer (or the pace held
                # back) waits on the long schedule, as a decommission in progress does
                # (domain.waits.REFUSED_FOR_NOW).
                # Dead letters hide every configured secret, not only the token the
                # service refuses in a producer's text.
                secrets=(*self.service.secrets, *log_secrets()),
                given_up=functools.partial(give_up, self.service),
                scopes=self.scopes,
            )
            try:
                # One limit for the channel (global), not one per consumer: with two
                # queues a per-consumer prefetch would hold twice as many messages.
                channel.basic_qos(0, self.prefetch, True)
                hops = self._consumer(channel, self.topology.hops, pool, settler)
                commands = self._consumer(channel, self.topology.commands, pool, settler)
                with hops, commands:
                    self.broker_outage.up()
                    backoff.reset()
                    self.ready.set()
                    while not stop.is_set():
                        self.heartbeat.beat()
                        self._settle_finished(settler)
                        with contextlib.suppress(TimeoutError):
                            conn.drain_events(timeout=self._drain_timeout())
                        conn.heartbeat_check()
                    hops.cancel()
                    commands.cancel()
                    self._cancel_queued()
                    self._drain_in_flight(settler)
            finally:
                with contextlib.suppress(Exception):
                    publisher.close()

    def _consumer(
        self, channel: Any, queue: Queue, pool: ThreadPoolExecutor, settler: Settler
    ) -> Consumer:
        """A consumer of one queue: each delivery is read knowing the queue it came
        from, which decides the types it may hold (messages.QUEUE_RULES)."""
        name = str(queue.name)
        return Consumer(
            channel,
            queues=[queue],
            on_message=lambda m: self._received(m, name, pool, settler),
            # kombu raises a message's decode errors (a compression header
            # with junk) out of drain_events unless told where they go.
            on_decode_error=lambda m, _exc: self._received(m, name, pool, settler),
            prefetch_count=None,
            no_ack=False,
        )

    def _drain_timeout(self) -> float:
        """How long to wait for the broker before looking at finished hops again.

        With every prefetched message taken the broker sends nothing until we
        ack, so a finished hop would wait for the drain to time out before its
        ack makes room for the next delivery: look again soon. Otherwise a new
        message wakes us.
        """
        return SATURATED_DRAIN_S if self._in_flight >= self.prefetch else IDLE_DRAIN_S

    def _received(
        self, message: Any, queue: str, pool: ThreadPoolExecutor, settler: Settler
    ) -> None:
        delivery = settler.read(message, queue)  # None: dead-lettered already
        if delivery is None:
            return
        generation = self._generation
        try:
            future = pool.submit(handle, self.service, delivery.message)
        except RuntimeError:  # the pool is shutting down: leave it to another worker
            settler.requeue(message)
            return
        self._in_flight += 1
        self._submitted.add(future)
        future.add_done_callback(lambda f: self._finished.put((generation, message, delivery, f)))

    def _cancel_queued(self) -> None:
        """Cancel the handlers that have not started (prefetched, waiting for a thread)."""
        for future in list(self._submitted):
            future.cancel()

    def _settle_finished(self, settler: Settler, timeout: float | None = None) -> None:
        while True:
            try:
                if timeout is None:
                    generation, message, delivery, future = self._finished.get_nowait()
                else:
                    generation, message, delivery, future = self._finished.get(timeout=timeout)
            except queue.Empty:
                return
            if generation != self._generation:
                continue
            self._in_flight -= 1
            self._submitted.discard(future)
            if future.cancelled():
                settler.requeue(message)  # never started: back to the queue for any worker
                continue
            settler.settle(message, delivery, future)

    def _drain_in_flight(self, settler: Settler) -> None:
        """On stop: let the hops in flight finish, and ack them."""
        deadline = time.monotonic() + 60
        while self._in_flight > 0 and time.monotonic() < deadline:
            self._settle_finished(settler, timeout=0.5)
