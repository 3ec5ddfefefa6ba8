"""Against a conventional peer: the same 1,000 provisions by a Celery design, beside ours.

    .venv/bin/python bench/peer.py [--brands 1000] [--latency-ms 0 100] [--settle-polls 1]
                                   [--settle-s 0]
                                   [--workers 2] [--concurrency 16] [--peer-poll-s 1.0]
                                   [--repeat 1] [--only peer|ours] [--json]

The peer (bench/peer_tasks.py, bench/peer_rows.py): for each brand, a Celery task on
RabbitMQ (`--pool threads`, WORKERS processes x CONCURRENCY threads, started here as
subprocesses) creates the sub-workspace on the fake gateway over HTTP, polls its
status (again later, by re-enqueueing itself with a countdown of PEER_POLL_S doubled
each time, while it is not ready), and binds it by compare-and-set on the brand's row
in PostgreSQL (`UPDATE brands SET workspace_id=..., state='ready' WHERE brand_id=...
AND attempt_id=...`); the attempt id is set when the provision is requested. The
request (the row's upsert with a new attempt id, then the task sent) is made from 8
threads, as bench/pipeline.py requests ours; the clock runs from the first request to
the last row's `ready_at`.

Ours: bench/pipeline.py's run (the fake, `provisioner relay`, WORKERS x `provisioner
worker` at CONCURRENCY, brands requested from 8 threads, the clock to the last
`workspace.ready`), with the fake started with the same knobs as the peer's.

Both on a fresh database and RabbitMQ virtual host each (dropped afterwards), against
the project's fake gateway (`provisioner fake-gateway`: FakeGateway) with LATENCY ms
per call and a workspace ready at its (SETTLE_POLLS + 1)-th status poll (1, as
bench/rollout.py metered has it; 0 as bench/pipeline.py has it) and, with
`--settle-s S`, no sooner than S seconds after its create (a real gateway's
workspace settles in time, whoever polls it), brands spread over
parents of 100. Per latency, ours then the peer's (alternating with --repeat), then
the ratios: at 0 ms ours / peer's provisions per second (target >= 1.0), at 100 ms
our seconds / the peer's (target <= 1.0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

import common
import peer_rows
import psycopg
from celery import Celery
from common import (
    add_pipeline_args,
    cpu_by_name,
    delete_vhost,
    drop_database,
    fake_call,
    fresh_database,
    fresh_vhost,
    machine_busy_s,
    postgres_cpu,
    proc_cpu_s,
    start_fake,
)
from psycopg_pool import ConnectionPool

CELERY_WORKER = (
    *(sys.executable, "-m", "celery", "-A", "peer_tasks", "worker"),
    *("--pool", "threads", "--loglevel", "WARNING", "--queues", "peer"),
)
TARGETS = {0.0: ("ours / peer provisions/s", ">=", 1.0), 100.0: ("our s / peer s", "<=", 1.0)}


def say(text: str) -> None:
    print(f"[peer] {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the peer


def peer_run(args: argparse.Namespace, latency_ms: float) -> dict[str, Any]:
    url, database = fresh_database()
    broker_url, vhost = fresh_vhost()
    try:
        return peer_measure(args, latency_ms, url, database, broker_url)
    finally:
        drop_database(database)
        delete_vhost(vhost)


def peer_measure(
    args: argparse.Namespace, latency_ms: float, url: str, database: str, broker_url: str
) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        peer_rows.create_table(conn)
    parents = [f"org-{n}" for n in range(max(1, args.brands // args.brands_per_parent))]
    fake, gateway_url = start_fake(parents, latency_ms=latency_ms, knobs=settle_knobs(args))
    env = {
        **os.environ,
        "PYTHONPATH": f"{BENCH}{os.pathsep}{ROOT}",
        "PEER_BROKER_URL": broker_url,
        "PEER_DATABASE_URL": url,
        "PEER_GATEWAY_URL": gateway_url,
        "PEER_POOL_SIZE": str(args.concurrency),
        "PEER_POLL_BASE_S": str(args.peer_poll_s),
    }
    logs = Path(args.logs) if args.logs else None
    workers: list[subprocess.Popen[bytes]] = []
    celery = Celery(broker=broker_url)
    celery.conf.update(task_default_queue="peer", broker_connection_retry_on_startup=True)
    pool = ConnectionPool(url, min_size=8, max_size=8, kwargs={"autocommit": True}, open=True)
    try:
        for n in range(args.workers):
            out = (logs / f"peer-{latency_ms:g}ms-worker{n}.log").open("ab") if logs else None
            workers.append(
                subprocess.Popen(
                    [*CELERY_WORKER, "--concurrency", str(args.concurrency), "-n", f"peer{n}@%h"],
                    cwd=BENCH,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out or subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                )
            )
        wait_workers(celery, args.workers)
        run_id = uuid.uuid4().hex[:6]
        brands = [
            (f"peer-{run_id}-{n}", f"Peer {run_id} {n}", parents[n % len(parents)])
            for n in range(args.brands)
        ]
        parts = {f"worker{n}": w.pid for n, w in enumerate(workers)} | {"fake": fake.pid}
        before = cpu_sample(parts, database)
        load_before = os.getloadavg()[0]
        started = time.time()

        def request(brand: tuple[str, str, str]) -> None:
            attempt = uuid.uuid4().hex
            with pool.connection() as conn:
                peer_rows.request(conn, brand[0], attempt, time.time())
            celery.send_task("peer_tasks.provision", args=(*brand, attempt), queue="peer")

        with ThreadPoolExecutor(8) as threads:
            list(threads.map(request, brands))
        deadline = time.monotonic() + args.timeout
        while True:
            with pool.connection() as conn:
                ready, failed, _, last = peer_rows.tally(conn)
            if ready + failed >= len(brands) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        wall = time.time() - started
        after = cpu_sample(parts, database)
        calls = fake_call(gateway_url, "/_fake/state").get("calls_total", 0)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.terminate()
        for worker in workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(5)
        pool.close()
        fake.terminate()
        fake.wait(5)
    elapsed = (last or time.time()) - started
    used = cpu_used(before, after)
    machine = used.pop("machine")
    cores = os.cpu_count() or 1
    return {
        "side": "peer",
        "brands": args.brands,
        "ready": ready,
        "failed": failed,
        "latency_ms": latency_ms,
        "settle_polls": args.settle_polls,
        "settle_s": args.settle_s,
        "seconds": round(elapsed, 2),
        "provisions_per_s": round(ready / elapsed, 1) if elapsed > 0 else 0.0,
        "gateway_calls_per_brand": round(calls / max(args.brands, 1), 2),
        "cpu_ms_per_provision": {k: round(1000 * v / max(ready, 1), 2) for k, v in used.items()},
        "other_share": round(max(0.0, machine - sum(used.values())) / (wall * cores), 2),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def wait_workers(celery: Celery, count: int, timeout_s: float = 60.0) -> None:
    """Until every Celery worker answers a ping over the broker."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(celery.control.ping(timeout=1.0) or []) >= count:
            return
    raise SystemExit(f"the peer's {count} Celery workers did not all answer in {timeout_s:g} s")


def cpu_sample(parts: dict[str, int], database: str) -> dict[str, Any]:
    """CPU seconds so far of each part, of this process, of PostgreSQL (the server and this
    database's backends) and of RabbitMQ by pid, and the machine's busy seconds."""
    sample: dict[str, Any] = {name: proc_cpu_s(pid) for name, pid in parts.items()}
    sample["bench"] = proc_cpu_s(os.getpid())
    sample["postgres"] = postgres_cpu(database)
    sample["rabbitmq"] = cpu_by_name("beam.smp")
    sample["machine"] = machine_busy_s()
    return sample


def cpu_used(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """CPU seconds between two samples; a server's processes counted only when alive in
    both (another user's broker or backend that came or went meanwhile is not ours)."""
    used: dict[str, float] = {}
    for key, now in after.items():
        if isinstance(now, dict):
            used[key] = sum(
                cpu - before[key][pid] for pid, cpu in now.items() if pid in before[key]
            )
        else:
            used[key] = now - before.get(key, 0.0)
    return used


# --------------------------------------------------------------------------- ours


def settle_knobs(args: argparse.Namespace) -> dict[str, float]:
    """When the fake's workspaces are ready: after SETTLE_POLLS not-ready polls and
    SETTLE_S seconds since the create (both, when both are given)."""
    return {"settle_polls": args.settle_polls, "settle_s": args.settle_s}


def ours_run(args: argparse.Namespace, latency_ms: float) -> dict[str, Any]:
    """bench/pipeline.py's run, its fake started with the peer's knobs."""
    import pipeline  # noqa: PLC0415 - imports the service, which the peer's side never needs

    calls: list[int] = []

    def start_fake_alike(parents: Any, *, latency_ms: float = 0.0, **_: Any) -> Any:
        fake, url = common.start_fake(parents, latency_ms=latency_ms, knobs=settle_knobs(args))
        stop = fake.terminate

        def count_then_stop() -> None:  # the run stops its fake: read its calls first
            with contextlib.suppress(OSError):
                calls.append(int(fake_call(url, "/_fake/state").get("calls_total", 0)))
            stop()

        fake.terminate = count_then_stop
        return fake, url

    pipeline.start_fake = start_fake_alike
    result: dict[str, Any] = pipeline.run(common.pipeline_args(args, latency_ms))
    if calls:
        result["gateway_calls_per_brand"] = round(calls[0] / max(args.brands, 1), 2)
    return {"side": "ours", **settle_knobs(args), **result}


# --------------------------------------------------------------------------- main


def ratio(latency_ms: float, ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    """The issue's ratio at this latency, with its target (none but at 0 and 100 ms)."""
    if latency_ms in TARGETS:
        name, op, target = TARGETS[latency_ms]
    else:
        name, op, target = "our s / peer s", "<=", float("nan")
    if name.startswith("ours"):
        value = ours["provisions_per_s"] / max(peer["provisions_per_s"], 1e-9)
    else:
        value = ours["seconds"] / max(peer["seconds"], 1e-9)
    met = value >= target if op == ">=" else value <= target
    return {"latency_ms": latency_ms, "ratio": name, "value": round(value, 2),
            "target": f"{op} {target:g}", "met": bool(met)}  # fmt: skip


def verdict(x: dict[str, Any]) -> str:
    met = "met" if x["met"] else "MISSED"
    return f"{x['latency_ms']:g} ms: {x['ratio']} = {x['value']:.2f} (target {x['target']}: {met})"


def line(r: dict[str, Any]) -> str:
    cpu = r.get("cpu_ms_per_provision", {})
    workers = sum(v for k, v in cpu.items() if k.startswith("worker"))
    return (
        f"{r['side']:>4} {r['latency_ms']:>5g} ms: {r['ready']}/{r['brands']} ready in "
        f"{r['seconds']:.2f} s = {r['provisions_per_s']:.1f} provisions/s, "
        f"{r.get('gateway_calls_per_brand', '?')} gateway calls a brand; workers' CPU "
        f"{workers:.2f} ms, PostgreSQL {cpu.get('postgres', 0):.2f} ms, RabbitMQ "
        f"{cpu.get('rabbitmq', 0):.2f} ms per provision; other {r.get('other_share', 0):.2f}, "
        f"load {r.get('load_average')}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pipeline_args(parser)  # the layout and size of both sides
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 100.0])
    parser.add_argument("--settle-polls", type=int, default=1, help="not-ready polls first")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=0.0,
        help="seconds from the create before ready, as a real gateway settles (with"
        " --settle-polls 0: by time alone)",
    )
    parser.add_argument("--peer-poll-s", type=float, default=1.0, help="the peer's first re-poll")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each side, alternating")
    parser.add_argument("--only", choices=("ours", "peer"), help="run one side only")
    parser.add_argument("--logs", metavar="DIR", help="keep the peer workers' logs here")
    args = parser.parse_args()
    if args.logs:
        Path(args.logs).mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    ratios: list[dict[str, Any]] = []
    for latency in args.latency_ms:
        for _ in range(args.repeat):
            pair: dict[str, dict[str, Any]] = {}
            for side, run in (("ours", ours_run), ("peer", peer_run)):
                if args.only in (None, side):
                    pair[side] = run(args, latency)
                    runs.append(pair[side])
                    say(line(pair[side]))
            if len(pair) == 2:
                ratios.append(ratio(latency, pair["ours"], pair["peer"]))
                say(verdict(ratios[-1]))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
        check=False,
    ).stdout.strip()  # fmt: skip
    report = {"commit": commit, "settle_polls": args.settle_polls, "runs": runs, "ratios": ratios}
    report["settle_s"] = args.settle_s
    report["peer_poll_s"] = args.peer_poll_s  # the peer's first re-poll, doubling after
    if args.json:
        print(json.dumps(report))
    else:
        print(f"commit {commit}, {args.brands} brands, {args.workers} x {args.concurrency}, "
              f"workspace ready at status poll {args.settle_polls + 1}, "
              f"{args.settle_s:g} s after its create at the earliest")  # fmt: skip
        for r in runs:
            print(line(r))
        for x in ratios:
            print(verdict(x))
    complete = all(r["ready"] == r["brands"] for r in runs)
    return 0 if complete else 1


if __name__ == "__main__":
    raise SystemExit(main())
