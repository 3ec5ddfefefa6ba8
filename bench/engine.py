"""Engine benchmark: N attempts in-process against the fake gateway on PostgreSQL.

    .venv/bin/python bench/engine.py [--attempts 2000] [--concurrency 8] [--json]

The fake gateway runs in its own process (zero latency, ready at first poll),
so it does not compete with the engine for the interpreter lock. Printed:
attempts/s, event-store transactions per attempt, the engine's saves/s, and
the bare `Application.save` rate of a trivial aggregate measured in the same
run on the same table (one writer, and `concurrency` writers), with the ratio
of engine saves/s to the better of the two bare rates.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eventsourcing.domain import Aggregate

from domain.outcomes import Outcome
from infrastructure.eventstore import ProvisionerApplication, init_database, open_event_store
from infrastructure.gateway import HttpGateway
from infrastructure.service import ProvisioningService
from worker.inprocess import InProcessEngine

DEFAULT_URL = "postgresql://root@127.0.0.1:5432/test"
PARENT = "org-parent"


class Trivial(Aggregate):
    """The smallest aggregate: one Created event per save."""


def start_fake() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "infrastructure.fake_gateway", "--port", "0",
            "--parent", PARENT, "--seed", str(uuid.uuid4().int % 2**31),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    url = line.strip().rsplit(" ", 1)[-1]
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit(f"fake gateway did not start: {line!r}")
    return proc, url


def bare_save_rate(app: ProvisionerApplication, saves: int, writers: int) -> float:
    per_writer = max(1, saves // writers)

    def write(_: int) -> None:
        for _ in range(per_writer):
            app.save(Trivial())

    started = time.perf_counter()
    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(write, range(writers)))
    return per_writer * writers / (time.perf_counter() - started)


def run_engine(service: ProvisioningService, attempts: int, concurrency: int) -> dict[str, float]:
    run = uuid.uuid4().hex[:8]
    brands = [(f"bench-{run}-{n}", f"Bench {run} {n}") for n in range(attempts)]
    saves_before = service.app.saves
    started = time.perf_counter()
    engine = InProcessEngine(service, concurrency=concurrency)

    def request(brand: tuple[str, str]) -> None:
        engine.submit(service.request_provisioning(brand[0], brand[1], PARENT))

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(request, brands))
    report = engine.run()
    elapsed = time.perf_counter() - started
    saves = service.app.saves - saves_before
    promoted = sum(1 for o in report.finals.values() if o.outcome is Outcome.PROMOTED)
    if promoted != attempts:
        raise SystemExit(f"only {promoted} of {attempts} attempts were promoted")
    return {
        "seconds": elapsed,
        "attempts_per_s": attempts / elapsed,
        "transactions_per_attempt": saves / attempts,
        "engine_saves_per_s": saves / elapsed,
        "hops": report.hops,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--bare-saves", type=int, default=4000)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    url = os.environ.get("PROVISIONER_DATABASE_URL", DEFAULT_URL)
    init_database(url)
    app = open_event_store(url, pool_size=args.concurrency + 2)
    proc, gateway_url = start_fake()
    try:
        gateway = HttpGateway(gateway_url, "bench-token", max_connections=args.concurrency * 2)
        service = ProvisioningService(app, gateway)
        run_engine(service, min(200, args.attempts), args.concurrency)  # warm-up
        bare_one = bare_save_rate(app, args.bare_saves // 2, 1)
        bare_many = bare_save_rate(app, args.bare_saves, args.concurrency)
        figures = run_engine(service, args.attempts, args.concurrency)
    finally:
        proc.terminate()
        proc.wait(5)
        app.close()
    bare = max(bare_one, bare_many)
    result = {
        "attempts": args.attempts,
        "concurrency": args.concurrency,
        "attempts_per_s": round(figures["attempts_per_s"], 1),
        "transactions_per_attempt": round(figures["transactions_per_attempt"], 3),
        "engine_saves_per_s": round(figures["engine_saves_per_s"], 1),
        "bare_saves_per_s": round(bare, 1),
        "bare_saves_per_s_one_writer": round(bare_one, 1),
        "bare_saves_per_s_concurrent": round(bare_many, 1),
        "ratio": round(figures["engine_saves_per_s"] / bare, 3),
        "seconds": round(figures["seconds"], 2),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>30}: {value}")
        print(
            f"targets: transactions/attempt <= 4 "
            f"({'met' if result['transactions_per_attempt'] <= 4 else 'MISSED'}), "
            f"ratio >= 0.8 ({'met' if result['ratio'] >= 0.8 else 'MISSED'})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
