"""Engine benchmark: N attempts in P worker processes against the fake gateway on PostgreSQL.

    .venv/bin/python bench/engine.py [--attempts 2000] [--processes 2] [--concurrency 8]
                                     [--brands-per-parent 100] [--json]

The engine runs as the production worker scales: P worker processes (spawned),
each with its own event store (pool size = concurrency + 2), its own
`HttpGateway` and its own `InProcessEngine` at `--concurrency` hop threads,
each handling N/P of the brands (request, then every hop until promoted). All
processes start on one signal; the parent times from that signal to the last
process's report, and sums their saves (event-store transactions).

The fake gateway runs in its own process (zero latency, a created workspace is
ready at its first poll). Brands are spread over parents org-0..org-M so that a
family listing holds at most K = `--brands-per-parent` children, like an
organisation with K brands; `--brands-per-parent` >= N puts every brand under
one parent, whose listing then grows to N. The fake is reset after the warm-up.

The bare `Application.save` rate of a trivial aggregate (one event) is measured
in the same run on the same table, before and after the engine, by one writer
and by the same layout (P processes x concurrency threads); `ratio` is
engine saves/s over the BEST of these rates (the strict reading, and the one
the target is judged on); `ratio_one_writer` is over the one-writer rate alone
(the best of before and after), for comparison.

Without PROVISIONER_DATABASE_URL it runs on a fresh database on the local
server, dropped afterwards.

CPU milliseconds per attempt of the worker processes, the fake and the
PostgreSQL server (Linux /proc) are printed too, with the machine's CPU
utilisation and the share used by processes outside the run (a run with more
than 10% is flagged as not representative).
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
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx
from common import (
    cpu_since,
    drop_database,
    fresh_database,
    machine_busy_s,
    postgres_cpu,
    proc_cpu_s,
    start_fake,
)
from eventsourcing.domain import Aggregate, event
from inprocess import InProcessEngine

from domain.outcomes import Outcome
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.store.eventstore import init_database, open_event_store

TARGET_TX_PER_ATTEMPT = 4.0
TARGET_RATIO = 0.8
NOISY_SHARE = 0.1  # machine CPU share used by other processes above which a run is noisy

Brand = tuple[str, str, str]  # brand id, title, parent workspace id
Message = tuple[Any, ...]


class Trivial(Aggregate):
    """The smallest aggregate: one Created event per save."""


class Stand_in(Aggregate):  # noqa: N801 - reads as what it is
    """An aggregate standing in for a brand, attempt, slot or claim in the skeleton."""

    @event("Noted")
    def note(self, what: str) -> None:
        pass


# --------------------------------------------------------------------------- CPU accounting


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # all threads of this process
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------- worker processes


def _worker(
    index: int,
    url: str,
    gateway_url: str,
    concurrency: int,
    commands: mp.Queue[Message],
    results: mp.Queue[Message],
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

    def armed() -> None:
        results.put(("armed", index))

    try:
        while True:
            command = commands.get()
            if command[0] == "engine":
                report = _run_engine(service, command[1], concurrency, go, armed)
            elif command[0] == "skeleton":
                report = _run_skeleton(service, command[1], concurrency, go, armed)
            elif command[0] == "bare":
                report = _run_bare(service, command[1], command[2], go, armed)
            else:
                return
            results.put(("done", index, report))
    finally:
        gateway.close()
        app.close()


def _run_engine(
    service: ProvisioningService,
    brands: Sequence[Brand],
    concurrency: int,
    go: Event,
    armed: Callable[[], None],
) -> dict[str, Any]:
    engine = InProcessEngine(service, concurrency=concurrency)

    def request(brand: Brand) -> None:
        engine.submit(service.request_provisioning(*brand))

    def run() -> tuple[int, int]:
        _each_on_signal(request, brands, concurrency, go, armed)
        report = engine.run()
        promoted = sum(1 for o in report.finals.values() if o.outcome is Outcome.PROMOTED)
        return promoted, report.errors

    return _measured(service, run)


def _each_on_signal(
    work: Callable[[Brand], None],
    brands: Sequence[Brand],
    concurrency: int,
    go: Event,
    armed: Callable[[], None],
) -> None:
    """Run `work` for every brand on `concurrency` threads, started by the signal."""
    with ThreadPoolExecutor(concurrency) as pool:
        armed()
        go.wait()
        list(pool.map(work, brands))


def _measured(service: ProvisioningService, run: Callable[[], tuple[int, int]]) -> dict[str, Any]:
    """The saves and CPU of `run` (which returns promoted attempts and errors)."""
    saves, cpu = service.app.saves, _self_cpu_s()
    promoted, errors = run()
    return {
        "saves": service.app.saves - saves,
        "cpu_s": _self_cpu_s() - cpu,
        "promoted": promoted,
        "errors": errors,
    }


def _run_skeleton(
    service: ProvisioningService,
    brands: Sequence[Brand],
    concurrency: int,
    go: Event,
    armed: Callable[[], None],
) -> dict[str, Any]:
    """Each brand's attempt as bare I/O: the reads, saves (same aggregates and event
    counts as a created attempt ready at its first poll) and gateway calls the
    design requires, with no engine logic at all. What no engine can beat."""
    app, gateway = service.app, service.gateway
    read = app.recorder.select_events_of  # type: ignore[attr-defined]

    def attempt(brand: Brand) -> None:
        _, title, parent = brand
        brand_agg, attempt_agg = Stand_in(), Stand_in()  # Registered; Started
        read([brand_agg.id])  # the request reads the brand
        brand_agg.note("attempt begun")
        app.save(brand_agg, attempt_agg)  # 3 events
        read([attempt_agg.id, uuid.uuid4(), brand_agg.id])  # attempt, slot, brand
        gateway.family(parent, title)
        slot = Stand_in()  # Opened
        slot.note("reserved")
        attempt_agg.note("create requested")
        app.save(attempt_agg, slot)  # 3 events
        workspace_id = gateway.create_child(parent, title)
        gateway.status(workspace_id)
        claim = Stand_in()  # Opened
        claim.note("claimed")
        slot.note("freed")
        attempt_agg.note("candidate accepted")
        attempt_agg.note("promoted")
        brand_agg.note("bound")
        app.save(attempt_agg, slot, claim, brand_agg)  # 6 events

    def run() -> tuple[int, int]:
        _each_on_signal(attempt, brands, concurrency, go, armed)
        return len(brands), 0

    return _measured(service, run)


def _run_bare(
    service: ProvisioningService, saves: int, writers: int, go: Event, armed: Callable[[], None]
) -> dict[str, Any]:
    app = service.app
    per_writer = max(1, saves // writers)

    def write(_: int) -> None:
        go.wait()
        for _ in range(per_writer):
            app.save(Trivial())

    with ThreadPoolExecutor(writers) as pool:
        futures = [pool.submit(write, n) for n in range(writers)]
        armed()
        go.wait()
        before, cpu = app.saves, _self_cpu_s()
        for future in futures:
            future.result()
    return {"saves": app.saves - before, "cpu_s": _self_cpu_s() - cpu}


# --------------------------------------------------------------------------- the parent


@dataclass
class Phase:
    seconds: float
    reports: list[dict[str, Any]]
    fake_cpu_s: float
    postgres_cpu_s: float
    machine_busy_s: float

    def total(self, key: str) -> float:
        return float(sum(r[key] for r in self.reports))

    def other_share(self, cpus: int) -> float:
        """Share of the machine's CPU used by processes outside this run."""
        ours = self.total("cpu_s") + self.fake_cpu_s + self.postgres_cpu_s
        return max(0.0, self.machine_busy_s - ours) / (self.seconds * cpus)


@dataclass
class Workers:
    """The worker processes, their command queues, the shared results queue and start signal."""

    fake: subprocess.Popen[str]
    results: mp.Queue[Message]
    go: Event
    database: str  # PostgreSQL's CPU is counted for this database's backends and the server
    processes: list[BaseProcess] = field(default_factory=list)
    commands: list[mp.Queue[Message]] = field(default_factory=list)

    def run(self, orders: dict[int, Message]) -> Phase:
        """Give each listed worker its order, start them together, wait for all."""
        self.go.clear()
        for index, order in orders.items():
            self.commands[index].put(order)
        self.collect("armed", len(orders))
        fake, busy = proc_cpu_s(self.fake.pid), machine_busy_s()
        pg = postgres_cpu(self.database)
        started = time.perf_counter()
        self.go.set()
        reports = self.collect("done", len(orders))
        seconds = time.perf_counter() - started
        return Phase(
            seconds,
            [r[2] for r in reports],
            proc_cpu_s(self.fake.pid) - fake,
            cpu_since(pg, postgres_cpu(self.database)),
            machine_busy_s() - busy,
        )

    def collect(self, kind: str, count: int) -> list[Message]:
        got: list[Message] = []
        while len(got) < count:
            try:
                message = self.results.get(timeout=5)
            except queue.Empty:
                dead = [p.name or "?" for p in self.processes if not p.is_alive()]
                if dead:
                    raise SystemExit(f"worker process(es) died: {', '.join(dead)}") from None
                continue
            if message[0] != kind:
                raise SystemExit(f"unexpected message from a worker: {message!r}")
            got.append(message)
        return got


def engine_phase(workers: Workers, attempts: int, per_parent: int, kind: str = "engine") -> Phase:
    """Brand n goes under parent org-(n // K), to worker n % P (interleaved)."""
    run = uuid.uuid4().hex[:8]
    shares: list[list[Brand]] = [[] for _ in workers.processes]
    for n in range(attempts):
        brand = (f"bench-{run}-{n}", f"Bench {run} {n}", f"org-{n // per_parent}")
        shares[n % len(shares)].append(brand)
    phase = workers.run({p: (kind, share) for p, share in enumerate(shares)})
    promoted = int(phase.total("promoted"))
    if promoted != attempts:
        raise SystemExit(
            f"only {promoted} of {attempts} attempts were promoted "
            f"({int(phase.total('errors'))} hop errors)"
        )
    return phase


def bare_phase(workers: Workers, saves: int, processes: int, writers: int) -> Phase:
    return workers.run({p: ("bare", max(1, saves // processes), writers) for p in range(processes)})


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
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval() in the workers (experiment; Python's default 0.005 s)",
    )
    parser.add_argument(
        "--skeleton",
        action="store_true",
        help="also run the attempts as bare I/O (same reads, saves, events and gateway "
        "calls, no engine logic): the ratio no engine can beat on this machine",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if min(args.attempts, args.processes, args.concurrency, args.brands_per_parent) < 1:
        parser.error("attempts, processes, concurrency and brands-per-parent must be >= 1")

    def say(text: str) -> None:
        if not args.json:
            print(text, flush=True)

    url = os.environ.get("PROVISIONER_DATABASE_URL")
    created = None
    if not url:
        url, created = fresh_database()
    try:
        return run(args, url, say)
    finally:
        if created:
            drop_database(created)


def run(args: argparse.Namespace, url: str, say: Callable[[str], None]) -> int:
    """The phases against the event store at `url`; prints the result."""
    init_database(url)
    per_parent = min(args.brands_per_parent, args.attempts)
    parents = [f"org-{m}" for m in range(math.ceil(args.attempts / per_parent))]
    fake, gateway_url = start_fake(parents)
    ctx = mp.get_context("spawn")
    database = urlsplit(url).path.lstrip("/")
    workers = Workers(fake, ctx.Queue(), ctx.Event(), database)
    try:
        for index in range(args.processes):
            commands: mp.Queue[Message] = ctx.Queue()
            process = ctx.Process(
                target=_worker,
                name=f"engine-{index}",
                args=(
                    index,
                    url,
                    gateway_url,
                    args.concurrency,
                    commands,
                    workers.results,
                    workers.go,
                    args.switch_interval,
                ),
                daemon=True,
            )
            process.start()
            workers.processes.append(process)
            workers.commands.append(commands)
        pids = [str(m[2]) for m in workers.collect("ready", args.processes)]
        say(
            f"layout: {args.processes} processes x {args.concurrency} threads, "
            f"{args.attempts} attempts, {per_parent} brands per parent ({len(parents)} parents); "
            f"worker pids {' '.join(pids)}, fake pid {fake.pid}"
        )
        say("warm-up ...")
        if args.warmup > 0:
            engine_phase(workers, min(args.warmup, args.attempts), per_parent)
        bare_phase(workers, min(400, args.bare_saves), args.processes, args.concurrency)
        httpx.post(f"{gateway_url}/_fake/reset", timeout=10).raise_for_status()
        ones, manys = [], []

        def bare_phases(when: str) -> None:
            say(f"bare saves {when}, one writer ...")
            ones.append(bare_phase(workers, args.bare_saves // 2, 1, 1))
            say(f"bare saves {when}, {args.processes} x {args.concurrency} writers ...")
            manys.append(bare_phase(workers, args.bare_saves, args.processes, args.concurrency))

        bare_phases("before")
        say(f"engine, {args.attempts} attempts ...")
        eng = engine_phase(workers, args.attempts, per_parent)
        calls = httpx.get(f"{gateway_url}/_fake/state", timeout=30).json().get("calls", {})
        skeleton = None
        if args.skeleton:
            say(f"skeleton, {args.attempts} attempts' worth of bare I/O ...")
            # The same family sizes as the engine met.
            httpx.post(f"{gateway_url}/_fake/reset", timeout=10).raise_for_status()
            skeleton = engine_phase(workers, args.attempts, per_parent, "skeleton")
        bare_phases("after")
    finally:
        for commands in workers.commands:
            commands.put(("stop",))
        for child in workers.processes:
            child.join(10)
            if child.is_alive():
                child.terminate()
        fake.terminate()
        fake.wait(5)

    n, cpus = args.attempts, os.cpu_count() or 1
    # The better of the measurements before and after the engine run: the strict choice.
    one = max(ones, key=lambda p: p.total("saves") / p.seconds)
    many = max(manys, key=lambda p: p.total("saves") / p.seconds)
    bare_one = one.total("saves") / one.seconds
    bare_many = many.total("saves") / many.seconds
    bare = max(bare_one, bare_many)
    saves = eng.total("saves")
    engine_saves_per_s = saves / eng.seconds
    result: dict[str, Any] = {
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
        "ratio_one_writer": round(engine_saves_per_s / bare_one, 3),
        "bare_runs": {
            "one_writer": [round(p.total("saves") / p.seconds, 1) for p in ones],
            "same_layout": [round(p.total("saves") / p.seconds, 1) for p in manys],
        },
        "gateway_calls_per_attempt": {k: round(v / n, 2) for k, v in calls.items() if v},
        "cpu_ms_per_attempt": {
            "engine": round(1000 * eng.total("cpu_s") / n, 2),
            "fake": round(1000 * eng.fake_cpu_s / n, 2),
            "postgres": round(1000 * eng.postgres_cpu_s / n, 2),
        },
        "cpu_ms_per_bare_save": {
            "client": round(1000 * many.total("cpu_s") / many.total("saves"), 2),
            "postgres": round(1000 * many.postgres_cpu_s / many.total("saves"), 2),
        },
        "machine_cpu_busy": {
            "engine": round(eng.machine_busy_s / (eng.seconds * cpus), 2),
            "bare_one_writer": round(one.machine_busy_s / (one.seconds * cpus), 2),
            "bare_same_layout": round(many.machine_busy_s / (many.seconds * cpus), 2),
        },
        "other_load": round(max(p.other_share(cpus) for p in (eng, *ones, *manys)), 2),
    }
    if skeleton is not None:
        skeleton_saves_per_s = skeleton.total("saves") / skeleton.seconds
        result["skeleton"] = {
            "attempts_per_s": round(n / skeleton.seconds, 1),
            "saves_per_s": round(skeleton_saves_per_s, 1),
            "ratio": round(skeleton_saves_per_s / bare, 3),
            "ratio_one_writer": round(skeleton_saves_per_s / bare_one, 3),
            "cpu_ms_per_attempt": {
                "client": round(1000 * skeleton.total("cpu_s") / n, 2),
                "fake": round(1000 * skeleton.fake_cpu_s / n, 2),
                "postgres": round(1000 * skeleton.postgres_cpu_s / n, 2),
            },
            "machine_cpu_busy": round(skeleton.machine_busy_s / (skeleton.seconds * cpus), 2),
        }
    tx_ok = result["transactions_per_attempt"] <= TARGET_TX_PER_ATTEMPT
    ratio_ok = result["ratio"] >= TARGET_RATIO
    result["targets_met"] = tx_ok and ratio_ok
    if args.json:
        print(json.dumps(result))
        return 0
    cpu, bare_cpu, busy = (
        result["cpu_ms_per_attempt"],
        result["cpu_ms_per_bare_save"],
        result["machine_cpu_busy"],
    )
    print(f"brands per parent:          {per_parent}")
    print(f"attempts/s:                 {result['attempts_per_s']} ({n} in {result['seconds']} s)")
    print(f"transactions per attempt:   {result['transactions_per_attempt']}")
    print(f"gateway calls per attempt:  {result['gateway_calls_per_attempt']}")
    print(f"engine saves/s:             {result['engine_saves_per_s']}")
    runs = result["bare_runs"]
    print(
        f"bare saves/s, one writer:   {result['bare_saves_per_s_one_writer']} "
        f"(before, after: {runs['one_writer']})"
    )
    print(
        f"bare saves/s, same layout:  {result['bare_saves_per_s_same_layout']} "
        f"({args.processes} x {args.concurrency}; before, after: {runs['same_layout']})"
    )
    print(f"ratio (engine / best bare): {result['ratio']}")
    print(f"ratio (engine / one writer): {result['ratio_one_writer']}")
    if skeleton is not None:
        sk = result["skeleton"]
        print(
            f"skeleton (bare I/O):        {sk['attempts_per_s']} attempts/s, "
            f"{sk['saves_per_s']} saves/s, ratio {sk['ratio']} "
            f"(one writer {sk['ratio_one_writer']}), CPU ms per attempt {sk['cpu_ms_per_attempt']}"
        )
    print(
        f"CPU ms per attempt:         engine {cpu['engine']}, fake {cpu['fake']}, "
        f"postgres {cpu['postgres']}"
    )
    print(
        f"CPU ms per bare save:       client {bare_cpu['client']}, postgres {bare_cpu['postgres']}"
    )
    print(
        f"machine CPU busy ({cpus} cores): engine {busy['engine']}, bare one writer "
        f"{busy['bare_one_writer']}, bare same layout {busy['bare_same_layout']}; "
        f"other load {result['other_load']}"
    )
    if result["other_load"] > NOISY_SHARE:
        print("WARNING: other processes used a noticeable share of the CPU: not representative")
    print(
        f"targets: transactions/attempt <= {TARGET_TX_PER_ATTEMPT:g} "
        f"({'met' if tx_ok else 'MISSED'}), ratio >= {TARGET_RATIO:g} "
        f"({'met' if ratio_ok else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
