"""One thread, no broker: request, then every hop until promoted, for N attempts.

    .venv/bin/python bench/hop_loop.py [--attempts 500] [--warmup 100] [--bare]

The service is composed as `provisioner worker` composes it (the gateway's
per-request metrics hook, the hop counter), on a fresh database, against the
fake gateway in its own process (zero latency, ready at the first poll).
Prints one JSON object: client CPU ms per attempt (this process), wall ms per
attempt. `--bare` leaves the metrics out, to see what they cost.

For a figure that a shared machine does not move, count instructions instead
of CPU time, and take the difference of two sizes so that the start-up
cancels out:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python bench/hop_loop.py --attempts 50 --warmup 20
    (the same with --attempts 250; instructions per attempt = difference / 200)

The script runs on older commits too (their adapter has no metrics hook), so
two commits can be compared with the same command.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import drop_database, fresh_database, start_fake

from domain.outcomes import Outcome
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.store.eventstore import init_database, open_event_store
from worker.health import metrics


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--bare", action="store_true", help="without the metrics hooks")
    args = parser.parse_args()
    url = os.environ.get("PROVISIONER_DATABASE_URL")
    created = None
    if not url:
        url, created = fresh_database()
    fake = None
    try:
        init_database(url)
        parents = [f"org-{n}" for n in range(max(1, (args.attempts + args.warmup) // 100))]
        fake, gateway_url = start_fake(parents)
        hooks: dict[str, Any] = {}
        hooked = not args.bare and "observe" in inspect.signature(HttpGateway).parameters
        if hooked:
            hooks["observe"] = metrics.observe_gateway
        count_hop = getattr(metrics, "count_hop", None) if not args.bare else None
        gateway = HttpGateway(gateway_url, "bench-token", **hooks)
        service = ProvisioningService(open_event_store(url, pool_size=2), gateway)

        def attempt(name: str, n: int) -> Outcome:
            brand = (f"loop-{name}-{n}", f"Loop {name} {n}", parents[n % len(parents)])
            attempt_id, hop = service.request_provisioning(*brand), 0
            while True:
                outcome = service.run_hop(attempt_id, hop)
                if count_hop is not None:
                    count_hop(outcome.outcome.value)
                if outcome.next_hop is None:
                    return outcome.outcome
                hop = outcome.next_hop

        run = os.urandom(3).hex()
        for n in range(args.warmup):
            attempt(f"{run}-warm", n)
        cpu, wall = time.process_time(), time.perf_counter()
        promoted = sum(attempt(run, n) is Outcome.PROMOTED for n in range(args.attempts))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        gateway.close()
        service.app.close()
    finally:
        if fake is not None:
            fake.terminate()
            fake.wait(5)
        if created:
            drop_database(created)
    print(
        json.dumps(
            {
                "attempts": args.attempts,
                "promoted": promoted,
                "metrics_hooks": hooked,
                "cpu_ms_per_attempt": round(1000 * cpu / args.attempts, 3),
                "wall_ms_per_attempt": round(1000 * wall / args.attempts, 3),
            }
        )
    )
    return 0 if promoted == args.attempts else 1


if __name__ == "__main__":
    raise SystemExit(main())
