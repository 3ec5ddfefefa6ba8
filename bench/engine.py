"""Engine benchmark: N attempts across worker processes against the fake gateway on PostgreSQL.

    .venv/bin/python bench/engine.py [--attempts 2000] [--processes 2] [--concurrency 8]
                                     [--brands-per-parent 100] [--json]

The engine runs as the production worker scales: P worker processes (spawned),
each with its own event store (pool size = concurrency + 2), its own
`HttpGateway` and its own `InProcessEngine` at `--concurrency` threads, each
handling N/P of the brands. All processes start together on one signal; the
parent times from that signal to the last process's report.

The fake gateway runs in its own process (zero latency, a created workspace is
ready at its first poll). Brands are spread over parents org-0..org-M so that a
family listing holds K = `--brands-per-parent` children, like an organisation
with K brands (`--brands-per-parent` >= N puts every brand under one parent).
The fake is reset after the warm-up so the measured listings hold only the
measured run's children.

The bare `Application.save` rate of a trivial aggregate is measured in the same
run on the same table, by the same layout (P processes x concurrency threads)
and by one writer; the ratio is engine saves/s over the BETTER of the two.

Also printed: CPU milliseconds per attempt spent by the worker processes, the
fake and the PostgreSQL server (Linux /proc), and the box's CPU utilisation,
which say what bounds the figures on a small machine.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import queue
import resource
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from eventsourcing.domain import Aggregate  # noqa: E402

from domain.outcomes import Outcome  # noqa: E402
from infrastructure.eventstore import init_database, open_event_store  # noqa: E402
from infrastructure.gateway import HttpGateway  # noqa: E402
from infrastructure.service import ProvisioningService  # noqa: E402
from worker.inprocess import InProcessEngine  # noqa: E402

DEFAULT_URL = "postgresql://root@127.0.0.1:5432/test"
TARGET_TX_PER_ATTEMPT = 4.0
TARGET_RATIO = 0.8
NOISY_SHARE = 0.1  # share of the machine's CPU used by others above which a run is noisy
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Trivial(Aggregate):
    """The smallest aggregate: one Created event per save."""


# --------------------------------------------------------------------------- CPU accounting


def _proc_cpu_s(pid: int | str) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _postgres_cpu_s() -> float:
    """CPU seconds of every live process named postgres (server and backends)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm == "postgres":
            total += _proc_cpu_s(entry.name)
    return total


def _box_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all cores), from /proc/stat."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return (sum(values[:8]) - idle) / CLK_TCK


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # all threads of this process
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------- worker processes


def _worker(
    index: int,
    url: str,
    gateway_url: str,
    concurrency: int,
    commands: mp.Queue[tuple[Any, ...]],
    results: mp.Queue[tuple[Any, ...]],
    go: Event,
    switch_interval: float | None,
) -> None:
    """One worker process: its own event store, gateway and engine; obeys commands."""
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    app = open_event_store(url, pool_size=concurrency + 2)
    gateway = HttpGateway(gateway_url, "bench-token", max_connections=concurrency * 2)
    service = ProvisioningService(app, gateway)
    results.put(("ready", index, os.getpid()))
    try:
        while True:
            command = commands.get()
            if command[0] == "stop":
                return
            if command[0] == "engine":
                results.put(
                    (
                        "done",
                        index,
                        _engine_phase(service, command[1], concurrency, go, results, index),
                    )
                )
            elif command[0] == "bare":
                results.put(
                    (
                        "done",
                        index,
                        _bare_phase(service, command[1], command[2], go, results, index),
                    )
                )
    finally:
        gateway.close()
        app.close()


def _engine_phase(
    service: ProvisioningService,
    brands: Sequence[tuple[str, str, str]],
    concurrency: int,
    go: Event,
    results: mp.Queue[tuple[Any, ...]],
    index: int,
) -> dict[str, Any]:
    engine = InProcessEngine(service, concurrency=concurrency)

    def request(brand: tuple[str, str, str]) -> None:
        engine.submit(service.request_provisioning(*brand))

    with ThreadPoolExecutor(concurrency) as pool:
        results.put(("armed", index))
        go.wait()
        saves_before, cpu_before = service.app.saves, _self_cpu_s()
        list(pool.map(request, brands))
        report = engine.run()
    return {
        "saves": service.app.saves - saves_before,
        "cpu_s": _self_cpu_s() - cpu_before,
        "attempts": len(brands),
        "promoted": sum(1 for o in report.finals.values() if o.outcome is Outcome.PROMOTED),
        "hops": report.hops,
        "errors": report.errors,
    }


def _bare_phase(
    service: ProvisioningService,
    saves: int,
    writers: int,
    go: Event,
    results: mp.Queue[tuple[Any, ...]],
    index: int,
) -> dict[str, Any]:
    app = service.app
    per_writer = max(1, saves // writers)

    def write(_: int) -> None:
        go.wait()
        for _ in range(per_writer):
            app.save(Trivial())

    with ThreadPoolExecutor(writers) as pool:
        futures = [pool.submit(write, n) for n in range(writers)]
        results.put(("armed", index))
        go.wait()
        saves_before, cpu_before = app.saves, _self_cpu_s()
        for future in futures:
            future.result()
    return {"saves": app.saves - saves_before, "cpu_s": _self_cpu_s() - cpu_before}


# --------------------------------------------------------------------------- the parent


@dataclass
class Phase:
    seconds: float
    reports: list[dict[str, Any]]
    fake_cpu_s: float
    postgres_cpu_s: float
    box_busy_s: float

    def total(self, key: str) -> float:
        return float(sum(r[key] for r in self.reports))


@dataclass
class Pool:
    """The worker processes, the fake gateway process, and the start signal."""

    fake: subprocess.Popen[str]
    processes: list[mp.process.BaseProcess] = field(default_factory=list)
    commands: list[mp.Queue[tuple[Any, ...]]] = field(default_factory=list)
    results: mp.Queue[tuple[Any, ...]] | None = None
    go: Event | None = None

    def run(self, orders: dict[int, tuple[Any, ...]]) -> Phase:
        """Give each listed worker its order, start them together, wait for all."""
        assert self.results is not None and self.go is not None
        self.go.clear()
        for index, order in orders.items():
            self.commands[index].put(order)
        self._collect("armed", len(orders))
        fake0, pg0, box0 = _proc_cpu_s(self.fake.pid), _postgres_cpu_s(), _box_busy_s()
        started = time.perf_counter()
        self.go.set()
        reports = self._collect("done", len(orders))
        seconds = time.perf_counter() - started
        return Phase(
            seconds,
            reports,
            _proc_cpu_s(self.fake.pid) - fake0,
            _postgres_cpu_s() - pg0,
            _box_busy_s() - box0,
        )

    def _collect(self, kind: str, count: int) -> list[dict[str, Any]]:
        assert self.results is not None
        got: list[dict[str, Any]] = []
        while len(got) < count:
            try:
                message = self.results.get(timeout=5)
            except queue.Empty:
                dead = [p.name for p in self.processes if not p.is_alive()]
                if dead:
                    raise SystemExit(f"worker process(es) died: {', '.join(dead)}") from None
                continue
            if message[0] != kind:
                raise SystemExit(f"unexpected message from a worker: {message!r}")
            if kind == "done":
                got.append(message[2])
            elif kind == "ready":
                got.append({"pid": message[2]})
            else:
                got.append({})
        return got


def start_fake(parents: Sequence[str]) -> tuple[subprocess.Popen[str], str]:
    args = [sys.executable, "-m", "infrastructure.fake_gateway", "--port", "0"]
    for parent in parents:
        args += ["--parent", parent]
    args += ["--seed", str(uuid.uuid4().int % 2**31)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    url = line.strip().rsplit(" ", 1)[-1]
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit(f"fake gateway did not start: {line!r}")
    return proc, url


def brands_for(
    run: str, attempts: int, per_parent: int, processes: int
) -> dict[int, tuple[Any, ...]]:
    """Brand n goes under parent org-(n // K) and to process n % P (interleaved)."""
    orders: dict[int, list[tuple[str, str, str]]] = {p: [] for p in range(processes)}
    for n in range(attempts):
        brand = (f"bench-{run}-{n}", f"Bench {run} {n}", f"org-{n // per_parent}")
        orders[n % processes].append(brand)
    return {p: ("engine", brands) for p, brands in orders.items()}


def engine_phase(pool: Pool, attempts: int, per_parent: int, processes: int) -> Phase:
    phase = pool.run(brands_for(uuid.uuid4().hex[:8], attempts, per_parent, processes))
    promoted = int(phase.total("promoted"))
    if promoted != attempts:
        raise SystemExit(
            f"only {promoted} of {attempts} attempts were promoted "
            f"({int(phase.total('errors'))} hop errors)"
        )
    return phase


def bare_phase(pool: Pool, saves: int, processes: int, writers: int) -> Phase:
    per_process = max(1, saves // processes)
    return pool.run(dict.fromkeys(range(processes), ("bare", per_process, writers)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2, help="worker processes (one a core)")
    parser.add_argument("--concurrency", type=int, default=8, help="hop threads per process")
    parser.add_argument(
        "--brands-per-parent",
        type=int,
        default=100,
        help="children per family listing (>= attempts: one parent for all)",
    )
    parser.add_argument("--bare-saves", type=int, default=4000)
    parser.add_argument("--warmup", type=int, default=200, help="attempts run before measuring")
    parser.add_argument(
        "--switch-interval", type=float, default=None,
        help="sys.setswitchinterval() in the worker processes (default: Python's 0.005 s)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if min(args.attempts, args.processes, args.concurrency, args.brands_per_parent) < 1:
        parser.error("attempts, processes, concurrency and brands-per-parent must be >= 1")

    say: Callable[[str], None] = (
        (lambda _: None) if args.json else (lambda text: print(text, flush=True))
    )
    url = os.environ.get("PROVISIONER_DATABASE_URL", DEFAULT_URL)
    init_database(url)
    per_parent = min(args.brands_per_parent, args.attempts)
    parents = [f"org-{m}" for m in range(math.ceil(args.attempts / per_parent))]
    fake, gateway_url = start_fake(parents)
    ctx = mp.get_context("spawn")
    pool = Pool(fake, results=ctx.Queue(), go=ctx.Event())
    try:
        for index in range(args.processes):
            commands: mp.Queue[tuple[Any, ...]] = ctx.Queue()
            process = ctx.Process(
                target=_worker,
                name=f"engine-{index}",
                args=(
                    index, url, gateway_url, args.concurrency, commands, pool.results,
                    pool.go, args.switch_interval,
                ),
                daemon=True,
            )
            process.start()
            pool.processes.append(process)
            pool.commands.append(commands)
        pids = [str(r["pid"]) for r in pool._collect("ready", args.processes)]
        say(
            f"layout: {args.processes} processes x {args.concurrency} threads; "
            f"{args.attempts} attempts; {per_parent} brands per parent ({len(parents)} parents); "
            f"worker pids {' '.join(pids)}, fake pid {fake.pid}"
        )

        say("warm-up ...")
        if args.warmup > 0:
            engine_phase(pool, min(args.warmup, args.attempts), per_parent, args.processes)
        bare_phase(pool, min(400, args.bare_saves), args.processes, args.concurrency)
        httpx.post(f"{gateway_url}/_fake/reset", timeout=10).raise_for_status()

        say("bare saves, one writer ...")
        one = bare_phase(pool, args.bare_saves // 2, 1, 1)
        say(f"bare saves, {args.processes} x {args.concurrency} writers ...")
        many = bare_phase(pool, args.bare_saves, args.processes, args.concurrency)
        say(f"engine, {args.attempts} attempts ...")
        eng = engine_phase(pool, args.attempts, per_parent, args.processes)
        calls = httpx.get(f"{gateway_url}/_fake/state", timeout=10).json().get("calls", {})
    finally:
        for commands in pool.commands:
            commands.put(("stop",))
        for process in pool.processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
        fake.terminate()
        fake.wait(5)

    n = args.attempts
    bare_one = one.total("saves") / one.seconds
    bare_many = many.total("saves") / many.seconds
    bare = max(bare_one, bare_many)
    saves = eng.total("saves")
    engine_saves_per_s = saves / eng.seconds
    engine_cpu = eng.total("cpu_s")
    cpus = os.cpu_count() or 1
    result = {
        "attempts": n,
        "processes": args.processes,
        "concurrency": args.concurrency,
        "brands_per_parent": per_parent,
        "seconds": round(eng.seconds, 2),
        "attempts_per_s": round(n / eng.seconds, 1),
        "transactions_per_attempt": round(saves / n, 3),
        "engine_saves_per_s": round(engine_saves_per_s, 1),
        "bare_saves_per_s": round(bare, 1),
        "bare_saves_per_s_one_writer": round(bare_one, 1),
        "bare_saves_per_s_same_layout": round(bare_many, 1),
        "ratio": round(engine_saves_per_s / bare, 3),
        "gateway_calls_per_attempt": {k: round(v / n, 2) for k, v in calls.items() if v},
        "cpu_ms_per_attempt": {
            "engine": round(1000 * engine_cpu / n, 2),
            "fake": round(1000 * eng.fake_cpu_s / n, 2),
            "postgres": round(1000 * eng.postgres_cpu_s / n, 2),
        },
        "cpu_ms_per_bare_save": {
            "client": round(1000 * many.total("cpu_s") / many.total("saves"), 3),
            "postgres": round(1000 * many.postgres_cpu_s / many.total("saves"), 3),
        },
        "box_cpu_utilisation": {
            "engine_run": round(eng.box_busy_s / (eng.seconds * cpus), 2),
            "bare_same_layout": round(many.box_busy_s / (many.seconds * cpus), 2),
            "bare_one_writer": round(one.box_busy_s / (one.seconds * cpus), 2),
        },
        # Busy CPU of the machine not accounted to this run's processes (other load).
        "other_cpu_share": {
            "engine_run": round(
                (eng.box_busy_s - engine_cpu - eng.fake_cpu_s - eng.postgres_cpu_s)
                / (eng.seconds * cpus), 2,
            ),
            "bare_same_layout": round(
                (many.box_busy_s - many.total("cpu_s") - many.postgres_cpu_s - many.fake_cpu_s)
                / (many.seconds * cpus), 2,
            ),
        },
    }
    tx_ok = result["transactions_per_attempt"] <= TARGET_TX_PER_ATTEMPT
    ratio_ok = result["ratio"] >= TARGET_RATIO
    result["targets_met"] = tx_ok and ratio_ok
    if args.json:
        print(json.dumps(result))
        return 0
    cpu = result["cpu_ms_per_attempt"]
    print(f"attempts/s:                 {result['attempts_per_s']} ({n} in {result['seconds']} s)")
    print(f"transactions per attempt:   {result['transactions_per_attempt']}")
    print(f"gateway calls per attempt:  {result['gateway_calls_per_attempt']}")
    print(f"engine saves/s:             {result['engine_saves_per_s']}")
    print(f"bare saves/s, one writer:   {result['bare_saves_per_s_one_writer']}")
    print(
        f"bare saves/s, same layout:  {result['bare_saves_per_s_same_layout']} "
        f"({args.processes} x {args.concurrency})"
    )
    print(f"ratio (engine / best bare): {result['ratio']}")
    print(
        f"CPU ms per attempt:         engine {cpu['engine']}, fake {cpu['fake']}, "
        f"postgres {cpu['postgres']}"
    )
    bare_cpu = result["cpu_ms_per_bare_save"]
    print(
        f"CPU ms per bare save:       client {bare_cpu['client']}, postgres {bare_cpu['postgres']}"
    )
    util = result["box_cpu_utilisation"]
    other = result["other_cpu_share"]
    print(
        f"box CPU busy ({cpus} cores):    engine run {util['engine_run']} "
        f"(other load {other['engine_run']}), bare same layout {util['bare_same_layout']} "
        f"(other load {other['bare_same_layout']}), bare one writer {util['bare_one_writer']}"
    )
    if max(other.values()) > NOISY_SHARE:
        print(
            "WARNING: other processes used a noticeable share of the CPU during the run; "
            "the figures are not representative"
        )
    print(
        f"targets: transactions/attempt <= {TARGET_TX_PER_ATTEMPT:g} "
        f"({'met' if tx_ok else 'MISSED'}), ratio >= {TARGET_RATIO:g} "
        f"({'met' if ratio_ok else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
