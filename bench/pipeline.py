"""Pipeline benchmark: N brands through RabbitMQ + PostgreSQL + the fake gateway over HTTP.

    .venv/bin/python bench/pipeline.py [--brands 1000] [--concurrency 16] [--workers 2]
                                       [--latency-ms 0] [--json]

Runs the real processes: the fake gateway, `provisioner relay` and
`provisioner worker` (x --workers, each at --concurrency), all as
subprocesses. The benchmark process requests every brand (the request path,
from 8 threads) and listens for `workspace.ready` on the integration-event
exchange. Printed: end-to-end provisions/s (first request to last ready),
hop latency p50/p99/mean (from the workers' Prometheus histograms), the share
of slot time spent in hops (`slot_busy`), the largest worker RSS, CPU ms per
provision of each process (workers, relay, fake, this process, this run's
PostgreSQL backends and server processes, RabbitMQ), the machine's busy share,
the share used by processes outside the run (`other_share`) and the load
average, and in the same run the raw kombu publish-with-confirms rate and the
bare event-store save rate. `--profile DIR` runs the workers under cProfile
(bench/profiled.py). With --latency-ms 100 it also reports the time for
the whole batch (`seconds_for_1000_at_100ms` when --brands is 1000).

Without PROVISIONER_DATABASE_URL it creates a fresh database on the local
server and drops it afterwards; without PROVISIONER_BROKER_URL, a fresh virtual
host on the local RabbitMQ (made with `rabbitmqctl`; the default vhost where
that cannot run), deleted afterwards. The run purges the project's queues in
the vhost it uses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import (
    add_pipeline_args,
    cpu_by_name,
    delete_vhost,
    drop_database,
    fresh_database,
    fresh_vhost,
    machine_busy_s,
    pipeline_args,
    postgres_cpu,
    proc_cpu_s,
    start_fake,
)
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate
from kombu.connection import Connection
from kombu.entity import Exchange, Queue

from infrastructure.broker.publisher import Broker
from infrastructure.broker.topology import EVENTS_EXCHANGE, Topology
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.store.eventstore import init_database, open_event_store, persistence_env


class Trivial(Aggregate):
    """The smallest aggregate: one Created event per save."""


def purge(broker_url: str) -> None:
    topology = Topology()
    with Connection(broker_url) as conn:
        channel = conn.channel()
        topology.declare(channel)
        for queue in (topology.hops, topology.commands, topology.dead):
            queue.bind(channel).purge()


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )


class CpuMeter:
    """CPU seconds used by each part of the pipeline between `start` and `stop`."""

    def __init__(self, parts: dict[str, int], database: str) -> None:
        self.parts = parts  # name -> pid
        self.database = database
        self.before: dict[str, float] = {}
        self.after: dict[str, float] = {}

    def _sample(self) -> dict[str, float]:
        sample = {name: proc_cpu_s(pid) for name, pid in self.parts.items()}
        sample["bench"] = proc_cpu_s(os.getpid())
        sample["postgres"] = sum(postgres_cpu(self.database).values())
        sample["rabbitmq"] = sum(cpu_by_name("beam.smp").values())
        sample["machine"] = machine_busy_s()
        return sample

    def start(self) -> None:
        self.before = self._sample()

    def stop(self) -> None:
        self.after = self._sample()

    def used(self) -> dict[str, float]:
        return {k: self.after[k] - self.before.get(k, 0.0) for k in self.after}


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def quantile_from_histogram(text: str, label: str, q: float) -> float:
    """Approximate a quantile (ms) from Prometheus histogram buckets (linear in a bucket)."""
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith("provisioner_handle_seconds_bucket") and f'type="{label}"' in line:
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0
    if not total:
        return 0.0
    target, prev_le, prev_count = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= target:
            if le == float("inf"):
                return prev_le * 1000
            share = (target - prev_count) / max(count - prev_count, 1e-9)
            return (prev_le + (le - prev_le) * share) * 1000
        prev_le, prev_count = le, count
    return prev_le * 1000


def histogram_total(text: str, label: str, what: str) -> float:
    """The `sum` (seconds) or `count` of the merged hop histogram for one type."""
    for line in text.splitlines():
        if line.startswith(f"provisioner_handle_seconds_{what}") and f'type="{label}"' in line:
            return float(line.split()[-1])
    return 0.0


def merged_metrics(ports: list[int]) -> str:
    """Sum the workers' histograms line by line (same buckets everywhere)."""
    sums: dict[str, float] = {}
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(
                    (
                        "provisioner_handle_seconds_bucket",
                        "provisioner_handle_seconds_sum",
                        "provisioner_handle_seconds_count",
                    )
                ):
                    key, value = line.rsplit(" ", 1)
                    sums[key] = sums.get(key, 0.0) + float(value)
    return "\n".join(f"{k} {v}" for k, v in sums.items())


def raw_publish_rate(broker_url: str, count: int = 2000) -> float:
    queue_name = f"bench.raw.{uuid.uuid4().hex[:6]}"
    with Connection(broker_url, transport_options={"confirm_publish": True}) as conn:
        channel = conn.channel()
        queue = Queue(queue_name, Exchange(""), routing_key=queue_name, auto_delete=False)
        queue.bind(channel).declare()
        producer = conn.Producer(channel)
        started = time.perf_counter()
        for n in range(count):
            producer.publish(
                b'{"n": %d}' % n, routing_key=queue_name, delivery_mode=2, mandatory=True
            )
        rate = count / (time.perf_counter() - started)
        queue.bind(channel).delete()
    return rate


def bare_save_rate(url: str, count: int = 1000) -> float:
    class Bare(Application[Any]):
        name = "bench_bare"

    app = Bare(persistence_env(url, create_table=True))
    started = time.perf_counter()
    for _ in range(count):
        app.save(Trivial())
    rate = count / (time.perf_counter() - started)
    app.close()
    return rate


class ReadyListener(threading.Thread):
    """Collects workspace.ready / provisioning.failed events for our brands."""

    def __init__(self, broker_url: str, brands: set[str]) -> None:
        super().__init__(daemon=True)
        self.broker_url = broker_url
        self.brands = brands
        self.done: dict[str, tuple[str, float]] = {}
        self.ready = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        with Connection(self.broker_url) as conn:
            queue = Queue(
                f"bench.events.{uuid.uuid4().hex[:6]}",
                Exchange(EVENTS_EXCHANGE, type="topic", durable=True),
                routing_key="#",
                exclusive=True,
            )

            def on_message(body: Any, message: Any) -> None:
                event = json.loads(body) if isinstance(body, (bytes, str)) else body
                brand = event.get("brand_id")
                kind = event.get("type")
                if brand in self.brands and kind in ("workspace.ready", "provisioning.failed"):
                    self.done.setdefault(brand, (kind, time.perf_counter()))
                message.ack()

            with conn.Consumer(queue, callbacks=[on_message], accept=["json"]):
                self.ready.set()
                while not self.stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        conn.drain_events(timeout=0.2)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The run on a fresh database and virtual host (unless the environment names them)."""
    created_db = vhost = None
    url = os.environ.get("PROVISIONER_DATABASE_URL")
    broker_url = os.environ.get("PROVISIONER_BROKER_URL")
    try:
        if not url:
            url, created_db = fresh_database()
        if not broker_url:
            broker_url, vhost = fresh_vhost()
        return measure(args, url, broker_url)
    finally:
        if created_db:
            drop_database(created_db)
        delete_vhost(vhost)


def measure(args: argparse.Namespace, url: str, broker_url: str) -> dict[str, Any]:
    init_database(url)
    purge(broker_url)
    publisher = Broker(broker_url, Topology(), scheduler=None)
    publisher.declare()
    publisher.close()
    parents = [f"org-{n}" for n in range(max(1, args.brands // args.brands_per_parent))]
    fake, gateway_url = start_fake(parents, latency_ms=args.latency_ms)
    env = dict(os.environ)
    env.update(
        {
            "PROVISIONER_DATABASE_URL": url,
            "PROVISIONER_BROKER_URL": broker_url,
            "PROVISIONER_GATEWAY_URL": gateway_url,
            "PROVISIONER_GATEWAY_TOKEN": "bench-token",
            "PROVISIONER_CONCURRENCY": str(args.concurrency),
            "PROVISIONER_PARENT_IDS": ",".join(parents),  # the processes act under these only
            "PYTHONPATH": str(ROOT),
        }
    )
    ports = [9300 + n for n in range(args.workers)]
    procs = [spawn(["-m", "worker.cli.main", "relay"], env)]
    for n, port in enumerate(ports):
        worker = ["-m", "worker.cli.main", "worker"]
        if args.profile:
            out = Path(args.profile).resolve() / f"worker{n}.pstats"
            worker = [str(ROOT / "bench" / "profiled.py"), str(out), *worker]
        procs.append(spawn(worker, env | {"PROVISIONER_METRICS_PORT": str(port)}))
    workers = procs[1:]
    run_id = uuid.uuid4().hex[:6]
    brands = [
        (f"pipe-{run_id}-{n}", f"Pipe {run_id} {n}", parents[n % len(parents)])
        for n in range(args.brands)
    ]
    listener = ReadyListener(broker_url, {b for b, _, _ in brands})
    listener.start()
    listener.ready.wait(10)
    app = open_event_store(url, pool_size=10)
    service = ProvisioningService(app, HttpGateway(gateway_url, "bench-token"))
    peak_rss = 0.0
    try:
        time.sleep(1.5)  # let the workers connect
        parts = {"relay": procs[0].pid, "fake": fake.pid}
        parts |= {f"worker{n}": p.pid for n, p in enumerate(workers)}
        meter = CpuMeter(parts, url.rsplit("/", 1)[-1])
        load_before = os.getloadavg()[0]
        meter.start()
        started = time.perf_counter()
        requested: dict[str, float] = {}

        def request(brand: tuple[str, str, str]) -> None:
            requested[brand[0]] = time.perf_counter()
            service.request_provisioning(*brand)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(request, brands))
        deadline = time.perf_counter() + args.timeout
        while len(listener.done) < len(brands) and time.perf_counter() < deadline:
            peak_rss = max([peak_rss, *(rss_mb(p.pid) for p in workers)])
            time.sleep(0.1)
        meter.stop()
        finished = max((t for _, t in listener.done.values()), default=time.perf_counter())
        elapsed = finished - started
        wall = time.perf_counter() - started
        text = merged_metrics(ports)
        peak_rss = max([peak_rss, *(rss_mb(p.pid) for p in workers)])
    finally:
        listener.stop.set()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)
        fake.terminate()
        fake.wait(5)
        app.close()
    ready = sum(1 for kind, _ in listener.done.values() if kind == "workspace.ready")
    result = {
        "brands": args.brands,
        "ready": ready,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "latency_ms": args.latency_ms,
        "seconds": round(elapsed, 2),
        "provisions_per_s": round(ready / elapsed, 1),
        "hop_p50_ms": round(quantile_from_histogram(text, "hop", 0.50), 1),
        "hop_p99_ms": round(quantile_from_histogram(text, "hop", 0.99), 1),
        "hop_mean_ms": round(
            1000
            * histogram_total(text, "hop", "sum")
            / max(histogram_total(text, "hop", "count"), 1),
            1,
        ),
        # Share of the run during which the hop slots were busy with a hop: below 1,
        # slots waited for work (acks, delivery, the request rate, the tail).
        "slot_busy": round(
            histogram_total(text, "hop", "sum") / (elapsed * args.workers * args.concurrency), 2
        ),
        "worker_rss_mb": round(peak_rss, 1),
        "raw_publish_per_s": round(raw_publish_rate(broker_url), 1),
        "bare_saves_per_s": round(bare_save_rate(url), 1),
    }
    used = meter.used()
    machine = used.pop("machine")
    result["cpu_ms_per_provision"] = {
        k: round(1000 * v / max(ready, 1), 2) for k, v in used.items()
    }
    result["machine_busy"] = round(machine / (wall * (os.cpu_count() or 1)), 2)
    result["other_share"] = round(
        max(0.0, machine - sum(used.values())) / (wall * (os.cpu_count() or 1)), 2
    )
    result["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    if args.latency_ms == 100 and args.brands == 1000:
        result["seconds_for_1000_at_100ms"] = result["seconds"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pipeline_args(parser)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="run each worker under cProfile (every thread; bench/profiled.py) and write "
        "DIR/worker<N>.pstats: a diagnosis, its figures are not comparable",
    )
    args = parser.parse_args()
    result = run(pipeline_args(args, args.latency_ms, args.profile))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    return 0 if result["ready"] == args.brands else 1


if __name__ == "__main__":
    raise SystemExit(main())
