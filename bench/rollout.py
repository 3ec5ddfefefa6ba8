"""Rollout benchmarks: many brands at once against a metered gateway, and a gateway
outage longer than the settle budget, on the service's own processes.

    .venv/bin/python bench/rollout.py metered [--brands 300] [--rate-limit 20] [--burst 5]
                                              [--window 0] [--settle-s 0]
                                              [--only configured|learned] [--repeat N]
                                              [--latency-ms 0]
                                              [--json]
    .venv/bin/python bench/rollout.py outage [--brands 200] [--outage-s 600]
                                             [--mode 503|refuse] [--settle-polls 2] [--json]
    .venv/bin/python bench/rollout.py crowded [--brands 300] [--others 50000] [--json]

Both run the fake gateway (`provisioner fake-gateway`), two `provisioner worker
--concurrency 16`, `provisioner relay`, `provisioner projections run` and
`provisioner reconcile`, each a subprocess, on a fresh database and RabbitMQ
virtual host (made here, dropped afterwards), with every setting at its
production default (PROVISIONER_BACKOFF_BASE_S=5, PROVISIONER_MAX_REQUEUES=5,
...): no PROVISIONER_* variable of the caller's environment reaches them. The
brands are published by `provisioner rollout FILE` (a CSV written here), and
the clock starts when that command is started. A brand is ready when
`brand_workspaces` says so, at the time of the event that bound it (the row's
`updated_at`); the view is polled.

`metered`: the fake admits `--rate-limit` calls/s with a bucket of `--burst`
(429 with a whole-second Retry-After beyond it; with `--window S`, a quota of
rate x S calls in each S-second window, a call past it told to wait until the
window ends) and a workspace is ready at
its second status poll (`--settle-polls 1`; with `--settle-s S`, S seconds after
its create, however often it is polled); `--latency-ms` delays each answer
(the floor holds while the threads could send faster than the rate: 32 threads
at 200 ms each send 160 calls/s). Two runs, each on its own
database (the fleet's pace is a row in it), the fake reset in between: the
fleet's rate configured (PROVISIONER_GATEWAY_RATE=R, PROVISIONER_GATEWAY_BURST=1)
and learned from 429s (no rate set). For each: seconds to the last brand
ready; calls per brand (the calls the fake answered, 429s left out, over N);
the floor, N x calls per brand / R, which no client can beat; seconds / floor;
the share of calls answered 429; brands failed, with their reasons.

`outage`: no rate limit; N brands are published and, as soon as every one has
an attempt, the fake answers every call 503 (`--mode refuse`: refuses
connections) for `--outage-s` seconds, longer than the settle budget (about 2.5
minutes). Meanwhile the fleet's pace row is watched for the circuit opening.
Measured: calls that reached the gateway during the outage (503: the fake's
`outage_calls`; refuse: the workers' requests with no answer), split at the
moment the circuit opened, against one call per probe interval
(PROVISIONER_GATEWAY_PROBE_S, 10 s) after it; the seconds from the gateway's
return to every brand ready; brands failed.

`crowded`: no rate limit, a workspace ready at its second poll, every brand under
one parent; the rollout into that parent empty, then (the fake reset, a fresh
database) holding `--others` children of another title. For each: seconds to the
last brand ready; family reads and calls per brand (the fake's count); bytes of
gateway answers per brand (`provisioner_gateway_bytes_total`, all operations and
the family alone); family asks made into a read or served by one shared. Then
crowded seconds / empty seconds against its target.

Each run prints its figures and pass/fail against the targets (docs/benchmarks.md,
"Rollouts"); `--json` prints one object. Exit 0 when the run was measured,
whatever the verdict (`passed` says it). The processes' logs go to a temporary
directory, kept (and named on stderr) when a target was missed, or to `--logs DIR`.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import (
    delete_vhost,
    drop_database,
    fake_call,
    free_port,
    fresh_database,
    fresh_vhost,
    metric,
    proc_cpu_s,
    provisioner,
    scrape,
    service_env,
    start_fake,
    stop,
    wait_live,
)

PROBE_S = 10.0  # PROVISIONER_GATEWAY_PROBE_S, left at its default
TERMINAL = ("ready", "failed", "cancelled", "deactivated")
TARGETS = {  # run -> (seconds / floor at most, share of calls answered 429 at most)
    "configured": (1.05, 0.0),
    "learned": (1.15, 0.05),
}
RECOVERY_TARGET_S = 60.0


def say(text: str) -> None:
    print(f"[rollout] {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the service


@dataclass
class Progress:
    """Where our brands stand in `brand_workspaces`."""

    pending: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # brand -> "reason: last error"
    ready_at: dict[str, float] = field(default_factory=dict)  # brand -> epoch s of its binding

    @property
    def ready(self) -> int:
        return len(self.ready_at)

    @property
    def done(self) -> bool:
        return self.pending == 0

    def last_ready(self, among: Iterable[str] | None = None) -> float | None:
        """When the last of the brands (`among` them) was bound; None if none was."""
        pool = self.ready_at if among is None else among
        times = [self.ready_at[b] for b in pool if b in self.ready_at]
        return max(times, default=None)

    def reasons(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for why in self.failed.values():
            reason = why.split(":", 1)[0]
            counts[reason] = counts.get(reason, 0) + 1
        return counts


class Deployment:
    """The workers (last in `procs`), the relays, the projections and the reconcilers, as
    processes, on a fresh database and virtual host, against `gateway_url`."""

    def __init__(
        self,
        gateway_url: str,
        logs: Path,
        workers: int,
        concurrency: int,
        *,
        relays: int = 1,
        reconcilers: int = 1,
    ) -> None:
        self.gateway_url = gateway_url
        self.logs = logs
        self.workers = workers
        self.concurrency = concurrency
        self.relays = relays
        self.reconcilers = reconcilers
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env: dict[str, str] = {}
        self.db: psycopg.Connection[Any] | None = None

    @contextmanager
    def running(self, **settings: str) -> Iterator[Deployment]:
        url, database = fresh_database()
        broker_url, vhost = fresh_vhost()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = service_env(
            PROVISIONER_DATABASE_URL=url,
            PROVISIONER_BROKER_URL=broker_url,
            PROVISIONER_GATEWAY_URL=self.gateway_url,
            PROVISIONER_GATEWAY_TOKEN="bench-token",
            **settings,
        )
        try:
            for init in (["db", "init"], ["broker", "init"]):
                self.command(init)
            parts = [("relay", n) for n in range(self.relays)] + [("projections run", 0)]
            parts += [("reconcile", n) for n in range(self.reconcilers)]
            for name, n in parts:
                self.procs.append(self.spawn(name.split(), f"{name.split()[0]}{n or ''}"))
            for n in range(self.workers):
                port = free_port()
                self.ports.append(port)
                self.procs.append(
                    self.spawn(
                        ["worker", "--concurrency", str(self.concurrency)],
                        f"worker{n}",
                        PROVISIONER_METRICS_PORT=str(port),
                    )
                )
            for port in self.ports:
                wait_live(port)
            self.db = psycopg.connect(url, autocommit=True)
            yield self
        finally:
            stop(self.procs)
            if self.db is not None:
                self.db.close()
            drop_database(database)
            delete_vhost(vhost)

    def spawn(self, args: list[str], name: str, **more: str) -> subprocess.Popen[bytes]:
        return provisioner(args, self.env | more, self.logs / f"{name}.log")

    def command(self, args: list[str]) -> str:
        """A one-shot `provisioner` command; its standard output. Fails loudly."""
        done = subprocess.run(
            [sys.executable, "-m", "worker.cli.main", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"provisioner {' '.join(args)}: exit {done.returncode}: {done.stderr}")
        return done.stdout

    def query(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        assert self.db is not None
        return self.db.execute(sql, params).fetchall()

    def progress(self, brands: list[str]) -> Progress:
        rows = self.query(
            "SELECT b.status, b.updated_at, a.failure_reason, a.last_error, b.brand_id "
            "FROM brand_workspaces b LEFT JOIN attempts a ON a.attempt_id = b.attempt_id "
            "WHERE b.brand_id = ANY(%s)",
            brands,
        )
        found = Progress(pending=len(brands) - len(rows))
        for status, updated_at, reason, error, brand in rows:
            if status == "ready":
                found.ready_at[brand] = updated_at.timestamp()
            elif status in TERMINAL:
                found.failed[brand] = f"{reason or status}: {error or ''}"
            else:
                found.pending += 1
        return found

    def started(self, brands: list[str]) -> int:
        """How many of the brands have an attempt (the `attempts` projection)."""
        rows = self.query(
            "SELECT count(DISTINCT brand_id) FROM attempts WHERE brand_id = ANY(%s)", brands
        )
        return int(rows[0][0])

    def circuit_open_since(self) -> float | None:
        """When the fleet's circuit opened (epoch seconds on the database's clock, which
        is this machine's), or None while it is closed."""
        rows = self.query("SELECT state->>'open_since' FROM provisioner_gateway_pace")
        opened = [float(since) for (since,) in rows if since is not None]
        return min(opened) if opened else None

    def metrics(self) -> dict[str, float]:
        return scrape(self.ports)

    def keep_histories(self, brands: list[str], count: int = 5, also: Sequence[str] = ()) -> None:
        """`provisioner history --json` of the brands not ready, of the last `count`
        ready and of `also`, into the logs: what explains a missed target."""
        rows = self.query(
            "SELECT brand_id, status FROM brand_workspaces WHERE brand_id = ANY(%s) "
            "ORDER BY updated_at DESC",
            brands,
        )
        seen = {brand for brand, _ in rows}
        not_ready = [b for b in brands if b not in seen] + [b for b, st in rows if st != "ready"]
        last_ready = [b for b, st in rows if st == "ready"][:count]
        with (self.logs / "histories.jsonl").open("w") as out:
            chosen = [*not_ready[: 2 * count], *last_ready]
            for brand in chosen + [b for b in also[:count] if b not in chosen]:
                try:
                    story = json.loads(self.command(["history", brand, "--json"]))
                except SystemExit as exc:  # a diagnosis must not lose the figures
                    story = {"brand_id": brand, "error": str(exc)}
                out.write(json.dumps(story) + "\n")


def workspaces_made(state: dict[str, Any], rows: list[tuple[str, str, str]]) -> int:
    """Workspaces the fake holds under our titles (one per brand when nothing was made
    twice)."""
    titles = {title for _, title, _ in rows}
    return sum(1 for ws in state["workspaces"] if ws["title"] in titles)


def publish(deployment: Deployment, brands: list[tuple[str, str, str]], path: Path) -> float:
    """Write the rollout file, then run `provisioner rollout FILE`: its seconds."""
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["brand_id", "title", "parent"])
        writer.writerows(brands)
    started = time.perf_counter()
    report = json.loads(deployment.command(["rollout", str(path), "--json"]))
    if report.get("bad"):
        raise SystemExit(f"the rollout refused lines: {report['bad']}")
    return time.perf_counter() - started


def follow(deployment: Deployment, brands: list[str], timeout_s: float, label: str) -> Progress:
    """Poll `brand_workspaces` until no brand is pending, or `timeout_s`. Read once more
    a moment later: the `attempts` projection (the failure reasons) may lag behind."""
    deadline = time.monotonic() + timeout_s
    shown = time.monotonic()
    while True:
        progress = deployment.progress(brands)
        if progress.done or time.monotonic() > deadline:
            if progress.failed:
                time.sleep(2.0)
                return deployment.progress(brands)
            return progress
        if time.monotonic() - shown > 15:
            say(f"{label}: {progress.ready} ready, {len(progress.failed)} failed, "
                f"{progress.pending} pending")  # fmt: skip
            shown = time.monotonic()
        time.sleep(0.25)


def make_brands(count: int, per_parent: int) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Brands spread over parents of `per_parent` each: (rows, parent ids)."""
    run = uuid.uuid4().hex[:6]
    parents = [f"org-{n}" for n in range(max(1, math.ceil(count / per_parent)))]
    rows = [
        (f"roll-{run}-{n}", f"Rollout {run} {n}", parents[n // per_parent]) for n in range(count)
    ]
    return rows, parents


@contextmanager
def logs_dir(given: str | None) -> Iterator[tuple[Path, Callable[[bool], None]]]:
    """Where the processes log; a temporary directory is removed unless `keep(True)`."""
    path = Path(given) if given else Path(tempfile.mkdtemp(prefix="rollout-bench-"))
    kept = [bool(given)]

    def keep(flag: bool) -> None:
        kept[0] = kept[0] or flag

    try:
        yield path, keep
    finally:
        if kept[0]:
            say(f"logs kept in {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- metered


def metered(args: argparse.Namespace) -> dict[str, Any]:
    rows, parents = make_brands(args.brands, args.brands_per_parent)
    knobs = {
        "rate_limit": args.rate_limit,
        "burst": args.burst,
        "rate_window": args.window,
        # Ready at the 2nd poll, or (--settle-s) that long after the create, by time alone.
        "settle_polls": 0 if args.settle_s else 1,
        "settle_s": args.settle_s,
    }
    fake, gateway_url = start_fake(parents, latency_ms=args.latency_ms, knobs=knobs)
    runs: dict[str, dict[str, Any]] = {}
    try:
        with logs_dir(args.logs) as (logs, keep):
            paces = {
                "configured": {
                    "PROVISIONER_GATEWAY_RATE": f"{args.configured_rate or args.rate_limit:g}",
                    "PROVISIONER_GATEWAY_BURST": "1",
                },
                "learned": {},
            }
            for name, pace in paces.items():
                if args.only not in (None, name):
                    continue
                tries = []
                for n in range(args.repeat):
                    fake_call(gateway_url, "/_fake/reset", {})
                    where = logs / name if args.repeat == 1 else logs / f"{name}-{n + 1}"
                    deployment = Deployment(gateway_url, where, args.workers, args.concurrency)
                    with deployment.running(**pace, PROVISIONER_PARENT_IDS=",".join(parents)):
                        tries.append(metered_run(deployment, rows, args, name, logs))
                runs[name] = tries[0] if len(tries) == 1 else medians(tries, name)
            keep(not all(r["passed"] for r in runs.values()))
    finally:
        fake.terminate()
        fake.wait(5)
    return {
        "brands": args.brands,
        "rate_limit": args.rate_limit,
        "burst": args.burst,
        "window_s": args.window,
        "settle_s": args.settle_s,
        "configured_rate": args.configured_rate or args.rate_limit,
        "latency_ms": args.latency_ms,
        "workers": args.workers,
        "concurrency": args.concurrency,
        **runs,
        "passed": all(r["passed"] for r in runs.values()),
    }


def medians(tries: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """Repeated runs judged by their medians (one run's spread at a learned rate is
    wider than the targets' margins): each run's figures are kept under `runs`."""
    ratio = statistics.median(t["seconds_over_floor"] for t in tries)
    share = statistics.median(t["share_429"] for t in tries)
    failed = sum(t["failed"] for t in tries)
    most_ratio, most_share = TARGETS[name]
    passed = ratio <= most_ratio and share <= most_share and failed == 0
    each = ", ".join(f"{t['seconds_over_floor']:.2f}" for t in tries)
    verdict = "pass" if passed else "FAIL"
    say(
        f"{name}: medians of {len(tries)} runs: {ratio:.2f} x the floor (runs {each}), "
        f"429s {share:.1%}, {failed} failed: {verdict}"
    )
    return {
        "repeat": len(tries),
        "seconds_over_floor": round(ratio, 3),
        "share_429": round(share, 4),
        "failed": failed,
        "targets": {"seconds_over_floor": most_ratio, "share_429": most_share},
        "passed": passed,
        "runs": tries,
    }


def metered_run(
    deployment: Deployment,
    rows: list[tuple[str, str, str]],
    args: argparse.Namespace,
    name: str,
    logs: Path,
) -> dict[str, Any]:
    brands = [brand for brand, _, _ in rows]
    started = time.time()
    publish_s = publish(deployment, rows, logs / f"{name}.csv")
    say(f"{name}: {len(rows)} brands published in {publish_s:.1f} s")
    progress = follow(deployment, brands, args.timeout, name)
    state = fake_call(deployment.gateway_url, "/_fake/state")
    samples = deployment.metrics()
    calls_total, throttled = int(state["calls_total"]), int(state["throttled"])
    calls_per_brand = (calls_total - throttled) / len(rows)
    floor_s = len(rows) * calls_per_brand / args.rate_limit
    seconds = (progress.last_ready() or time.time()) - started
    share_429 = throttled / max(calls_total, 1)
    most_ratio, most_share = TARGETS[name]
    result = {
        "seconds": round(seconds, 2),
        "publish_s": round(publish_s, 2),
        "ready": progress.ready,
        "pending": progress.pending,
        "failed": len(progress.failed),
        "failed_reasons": progress.reasons(),
        "failed_examples": dict(list(progress.failed.items())[:5]),
        "calls_total": calls_total,
        "throttled": throttled,
        "calls": state["calls"],
        "workspaces_made": workspaces_made(state, rows),
        "calls_per_brand": round(calls_per_brand, 3),
        "calls_per_brand_with_429": round(calls_total / len(rows), 3),
        "floor_s": round(floor_s, 2),
        "seconds_over_floor": round(seconds / floor_s, 3),
        "share_429": round(share_429, 4),
        "held": metric(samples, "provisioner_gateway_held_total"),
        "throttle_wait_s": round(
            metric(samples, "provisioner_gateway_throttle_wait_seconds_total"), 1
        ),
        "hops": {
            outcome: metric(samples, "provisioner_hops_total", outcome=outcome)
            for outcome in ("promoted", "scheduled", "deferred", "failed")
        },
        "targets": {"seconds_over_floor": most_ratio, "share_429": most_share},
    }
    result["passed"] = bool(
        progress.ready == len(rows) and seconds / floor_s <= most_ratio and share_429 <= most_share
    )
    if not result["passed"]:
        deployment.keep_histories(brands)
    say(f"{name}: {seconds:.1f} s, floor {floor_s:.1f} s ({seconds / floor_s:.2f}), "
        f"429s {share_429:.1%}, {progress.ready} ready, {len(progress.failed)} failed: "
        f"{'pass' if result['passed'] else 'FAIL'}")  # fmt: skip
    return result


# --------------------------------------------------------------------------- outage


class OutageCalls:
    """Calls that reached the gateway during the outage: the fake's count of its 503s,
    or (refuse: the fake cannot be asked meanwhile) the workers' requests that got no
    answer, counted from the outage's start."""

    def __init__(self, deployment: Deployment, mode: str) -> None:
        self.deployment = deployment
        self.mode = mode
        self.base = 0.0 if mode == "503" else self._errors()

    def _errors(self) -> float:
        samples = self.deployment.metrics()
        return metric(samples, "provisioner_gateway_requests_total", status_class="error")

    def now(self) -> int:
        if self.mode == "503":
            return int(fake_call(self.deployment.gateway_url, "/_fake/state")["outage_calls"])
        return int(self._errors() - self.base)


@dataclass
class Circuit:
    """What the fleet's circuit did during the outage (times in epoch seconds)."""

    opened_at: float | None = None
    before_open: int = 0  # calls that reached the gateway before it opened was seen
    during: int = 0  # calls that reached the gateway during the whole outage
    closed_at: float | None = None  # first seen closed after the outage
    failed_during: int = 0  # brands failed by the end of the outage


def watch(
    deployment: Deployment, calls: OutageCalls, brands: list[str], began: float, ends: float
) -> Circuit:
    """Until the outage ends, read the pace row for the circuit opening (five times a
    second until it has, then every second), counting the calls at that moment; then
    wait for the circuit to close (a probe answered)."""
    circuit = Circuit()
    shown = time.time()
    while time.time() < ends:
        if circuit.opened_at is None:
            circuit.opened_at = deployment.circuit_open_since()
            if circuit.opened_at is not None:
                circuit.before_open = calls.now()
                say(f"circuit open {circuit.opened_at - began:.2f} s into the outage, "
                    f"after {circuit.before_open} calls")  # fmt: skip
        if time.time() - shown > 30:
            say(f"outage: {ends - time.time():.0f} s left, {calls.now()} calls so far, "
                f"{len(deployment.progress(brands).failed)} brands failed")  # fmt: skip
            shown = time.time()
        time.sleep(0.2 if circuit.opened_at is None else 1.0)
    circuit.during = calls.now()
    circuit.failed_during = len(deployment.progress(brands).failed)
    while time.time() < ends + 4 * PROBE_S:
        if deployment.circuit_open_since() is None:
            circuit.closed_at = time.time()
            break
        time.sleep(0.2)
    return circuit


def outage(args: argparse.Namespace) -> dict[str, Any]:
    rows, parents = make_brands(args.brands, args.brands_per_parent)
    fake, gateway_url = start_fake(parents, knobs={"settle_polls": args.settle_polls})
    try:
        with logs_dir(args.logs) as (logs, keep):
            deployment = Deployment(gateway_url, logs, args.workers, args.concurrency)
            with deployment.running(PROVISIONER_PARENT_IDS=",".join(parents)):
                result = outage_run(deployment, rows, args, logs)
            keep(not result["passed"])
    finally:
        fake.terminate()
        fake.wait(5)
    return result


def outage_run(
    deployment: Deployment, rows: list[tuple[str, str, str]], args: argparse.Namespace, logs: Path
) -> dict[str, Any]:
    brands = [brand for brand, _, _ in rows]
    published_at = time.time()
    publish_s = publish(deployment, rows, logs / "brands.csv")
    while deployment.started(brands) < len(brands):
        if time.time() - published_at > args.timeout:
            raise SystemExit("the brands did not all start")
        time.sleep(0.05)
    at_start = deployment.progress(brands)
    calls = OutageCalls(deployment, args.mode)
    answer = fake_call(
        deployment.gateway_url, "/_fake/outage", {"seconds": args.outage_s, "mode": args.mode}
    )
    began = time.time()
    ends = began + float(answer["ends_in_s"])
    say(f"outage ({args.mode}, {args.outage_s:g} s) begun {began - published_at:.1f} s after "
        f"publishing (which took {publish_s:.1f} s); {at_start.ready} brands ready, "
        f"{at_start.pending} in flight")  # fmt: skip
    circuit = watch(deployment, calls, brands, began, ends)
    opened_at, before_open, during = circuit.opened_at, circuit.before_open, circuit.during
    progress = follow(deployment, brands, args.timeout, "after the outage")
    recovery_s = (progress.last_ready() or time.time()) - ends
    # A create the outage answered 503 (or cut off) is unconfirmed: the brand waits out
    # the create grace before it creates again, so the fake counts its title twice.
    state = fake_call(deployment.gateway_url, "/_fake/state")
    titles = {title: brand for brand, title, _ in rows}
    recreated = sorted(titles[t] for t, n in state["creates"].items() if n > 1 and t in titles)
    others = sorted(set(brands) - set(recreated))
    by_create = {
        "created_twice": len(recreated),
        "recovery_s_created_twice": _since(progress.last_ready(recreated), ends),
        "recovery_s_created_once": _since(progress.last_ready(others), ends),
    }
    after_open = during - before_open if opened_at is not None else None
    open_s = ends - opened_at if opened_at is not None else 0.0
    allowed = math.ceil(open_s / PROBE_S)
    samples = deployment.metrics()
    result: dict[str, Any] = {
        "brands": len(brands),
        "mode": args.mode,
        "outage_s": args.outage_s,
        "settle_polls": args.settle_polls,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "publish_s": round(publish_s, 2),
        "outage_began_after_s": round(began - published_at, 2),
        "ready_at_outage_start": at_start.ready,
        "outage_calls": during,
        "circuit_opened_after_s": None if opened_at is None else round(opened_at - began, 2),
        "calls_before_open": before_open,
        "calls_after_open": after_open,
        "probe_s": PROBE_S,
        "probe_intervals": round(open_s / PROBE_S, 2),
        "calls_after_open_per_interval": (
            None if after_open is None or not open_s else round(after_open / (open_s / PROBE_S), 3)
        ),
        "allowed_after_open": allowed,
        "circuit_closed_after_end_s": _since(circuit.closed_at, ends),
        "recovery_s": round(recovery_s, 2),
        **by_create,
        "workspaces_made": workspaces_made(state, rows),
        "ready": progress.ready,
        "pending": progress.pending,
        "failed": len(progress.failed),
        "failed_during_outage": circuit.failed_during,
        "failed_reasons": progress.reasons(),
        "failed_examples": dict(list(progress.failed.items())[:5]),
        "held": metric(samples, "provisioner_gateway_held_total"),
        "requests": {
            cls: metric(samples, "provisioner_gateway_requests_total", status_class=cls)
            for cls in ("2xx", "4xx", "5xx", "error")
        },
        "hops": {
            outcome: metric(samples, "provisioner_hops_total", outcome=outcome)
            for outcome in ("promoted", "scheduled", "deferred", "failed")
        },
        "targets": {"recovery_s": RECOVERY_TARGET_S, "calls_after_open": allowed},
    }
    result["passed"] = bool(
        after_open is not None
        and after_open <= allowed
        and progress.ready == len(brands)
        and recovery_s <= RECOVERY_TARGET_S
    )
    if not result["passed"] or args.logs:
        deployment.keep_histories(brands, also=recreated)
    say(f"outage: {during} calls ({before_open} before the circuit opened, {after_open} after, "
        f"{allowed} allowed); the last brand ready {recovery_s:.1f} s after the gateway returned; "
        f"{len(progress.failed)} failed: {'pass' if result['passed'] else 'FAIL'}")  # fmt: skip
    return result


def _since(stamp: float | None, start: float) -> float | None:
    return None if stamp is None else round(stamp - start, 2)


# --------------------------------------------------------------------------- crowded


CROWDED_TARGET = 1.5  # seconds into the crowded parent / seconds into the empty one, at most


def crowded(args: argparse.Namespace) -> dict[str, Any]:
    """The same rollout into one empty parent, then into one holding `--others` children
    of another title (seeded in one call), each on its own database, the fake reset
    in between."""
    rows, parents = make_brands(args.brands, args.brands)  # every brand in one parent
    fake, gateway_url = start_fake(parents, knobs={"settle_polls": 1})
    runs: dict[str, dict[str, Any]] = {}
    try:
        with logs_dir(args.logs) as (logs, keep):
            for name, others in (("empty", 0), ("crowded", args.others)):
                fake_call(gateway_url, "/_fake/reset", {})
                if others:
                    seed = {"title": "Another brand", "parent": parents[0], "count": others}
                    fake_call(gateway_url, "/_fake/workspaces", seed)
                deployment = Deployment(gateway_url, logs / name, args.workers, args.concurrency)
                with deployment.running(PROVISIONER_PARENT_IDS=",".join(parents)):
                    runs[name] = crowded_run(deployment, rows, args, name, logs, fake.pid)
            ratio = runs["crowded"]["seconds"] / max(runs["empty"]["seconds"], 1e-9)
            passed = ratio <= CROWDED_TARGET and all(
                r["ready"] == args.brands for r in runs.values()
            )
            keep(not passed)
    finally:
        fake.terminate()
        fake.wait(5)
    say(f"crowded / empty: {ratio:.2f} (at most {CROWDED_TARGET}): {'pass' if passed else 'FAIL'}")
    return {
        "brands": args.brands,
        "others": args.others,
        "workers": args.workers,
        "concurrency": args.concurrency,
        **runs,
        "seconds_ratio": round(ratio, 3),
        "target_ratio": CROWDED_TARGET,
        "passed": passed,
    }


def crowded_run(
    deployment: Deployment,
    rows: list[tuple[str, str, str]],
    args: argparse.Namespace,
    name: str,
    logs: Path,
    fake_pid: int,
) -> dict[str, Any]:
    brands = [brand for brand, _, _ in rows]
    others = args.others if name == "crowded" else 0
    workers = [str(proc.pid) for proc in deployment.procs[-args.workers :]]
    fake_cpu, workers_cpu = proc_cpu_s(fake_pid), sum(proc_cpu_s(pid) for pid in workers)
    started = time.time()
    publish_s = publish(deployment, rows, logs / f"{name}.csv")
    progress = follow(deployment, brands, args.timeout, name)
    seconds = (progress.last_ready() or time.time()) - started
    fake_cpu = proc_cpu_s(fake_pid) - fake_cpu
    workers_cpu = sum(proc_cpu_s(pid) for pid in workers) - workers_cpu
    calls = fake_call(deployment.gateway_url, "/_fake/state")["calls"]
    samples = deployment.metrics()
    family_bytes = metric(samples, "provisioner_gateway_bytes_total", operation="family")
    all_bytes = metric(samples, "provisioner_gateway_bytes_total")
    asks = {
        served: metric(samples, "provisioner_gateway_family_asks_total", served=served)
        for served in ("read", "joined")
    }
    ready = max(progress.ready, 1)
    result = {
        "others": others,
        "seconds": round(seconds, 2),
        "publish_s": round(publish_s, 2),
        "ready": progress.ready,
        "failed": len(progress.failed),
        "failed_reasons": progress.reasons(),
        "family_calls_per_brand": round(calls.get("family", 0) / ready, 2),
        "calls_per_brand": round(sum(calls.values()) / ready, 2),
        "family_asks": asks,
        "fake_cpu_s": round(fake_cpu, 2),
        "workers_cpu_s": round(workers_cpu, 2),
        "gateway_bytes_per_brand": round(all_bytes / ready),
        "family_bytes_per_brand": round(family_bytes / ready),
        "hops": {
            outcome: metric(samples, "provisioner_hops_total", outcome=outcome)
            for outcome in ("promoted", "scheduled", "deferred", "failed")
        },
    }
    say(f"{name} ({others:,} other children): {seconds:.1f} s, {progress.ready} ready, "
        f"{len(progress.failed)} failed, {result['family_calls_per_brand']} family reads and "
        f"{result['gateway_bytes_per_brand']:,} gateway bytes per brand")  # fmt: skip
    return result


# --------------------------------------------------------------------------- main


def show(result: dict[str, Any], indent: str = "") -> None:
    for key, value in result.items():
        if isinstance(value, dict) and key in ("configured", "learned", "empty", "crowded"):
            print(f"{indent}{key}:")
            show(value, indent + "  ")
        elif key == "runs" and isinstance(value, list):  # --repeat: each run in turn
            for n, one in enumerate(value, 1):
                print(f"{indent}run {n}:")
                show(one, indent + "  ")
        else:
            print(f"{indent}{key:>30}: {value}")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="bench", required=True)
    for name, brands in (("metered", 300), ("outage", 200), ("crowded", 300)):
        one = sub.add_parser(name)
        one.add_argument("--brands", type=int, default=brands)
        one.add_argument("--workers", type=int, default=2)
        one.add_argument("--concurrency", type=int, default=16, help="hop threads per worker")
        one.add_argument("--brands-per-parent", type=int, default=100)
        one.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for brands")
        one.add_argument("--logs", metavar="DIR", help="keep the processes' logs here")
        one.add_argument("--json", action="store_true")
        if name == "crowded":
            one.add_argument(
                "--others", type=int, default=50_000, help="the parent's other children"
            )
        elif name == "metered":
            one.add_argument("--rate-limit", type=float, default=20.0, help="the fake's calls/s")
            one.add_argument("--burst", type=int, default=5, help="the fake's bucket")
            one.add_argument(
                "--settle-s",
                type=float,
                default=0.0,
                help="a workspace ready this long after its create, however often polled"
                " (default: at its 2nd poll)",
            )
            one.add_argument(
                "--window",
                type=float,
                default=0.0,
                help="seconds: the fake's limit a quota of rate x window calls a window "
                "(a gateway's '600 a minute'), not a bucket",
            )
            one.add_argument(
                "--latency-ms", type=float, default=0.0, help="the fake's time to answer a call"
            )
            one.add_argument(
                "--configured-rate",
                type=float,
                help="PROVISIONER_GATEWAY_RATE of the configured run (default: the fake's rate)",
            )
            one.add_argument(
                "--only",
                choices=("configured", "learned"),
                help="run the fleet's rate this way only (a learned rate's tuning)",
            )
            one.add_argument(
                "--repeat",
                type=positive_int,
                default=1,
                help="run each pace N times and judge it by the medians",
            )
        else:
            one.add_argument("--outage-s", type=float, default=600.0)
            one.add_argument("--mode", choices=("503", "refuse"), default="503")
            one.add_argument(
                "--settle-polls", type=int, default=2, help="not-ready polls before ready"
            )
    args = parser.parse_args()
    run = {"metered": metered, "outage": outage, "crowded": crowded}[args.bench]
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        show(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
