"""`python -m tests.reliability` (`make reliability`): the service as real processes,
under fire, then every promise checked (docs/operations.md, "Reliability run").

Prints the seed first, a short summary, the brands in violation with their
histories, and last one JSON line; exits 1 on any violation."""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.reliability.processes import Isolation
from tests.reliability.run import SETTLE_BUDGET_S, Outcome, Run

SHOWN_BRANDS = 10


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability", description=__doc__)
    parser.add_argument("--brands", type=int, default=300)
    parser.add_argument("--seed", type=int, default=None, help="default: random, printed first")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--database-url",
        default="postgresql://root@127.0.0.1:5432/test",
        help="a superuser's URL on the PostgreSQL server the run makes its database in",
    )
    parser.add_argument(
        "--broker-url",
        default="amqp://guest:guest@127.0.0.1:5672/",
        help="the RabbitMQ server the run makes its vhost on (with rabbitmqctl)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the database, vhost and run directory"
    )
    parser.add_argument(
        "--outage-s",
        type=float,
        default=None,
        help="every outage lasts this long (default: drawn, 1.3 to 1.8 times the settle "
        f"budget of {SETTLE_BUDGET_S:g} s); must be longer than that budget",
    )
    args = parser.parse_args(argv)
    if args.brands < 1 or args.workers < 1:
        parser.error("--brands and --workers must be at least 1")
    if args.outage_s is not None and not args.outage_s > SETTLE_BUDGET_S:
        parser.error(f"--outage-s must be longer than the settle budget ({SETTLE_BUDGET_S:g} s)")
    return args


def report(outcome: Outcome) -> None:
    s = outcome.summary
    print(
        f"{s['brands']} brands, seed {s['seed']}: attempts {s['attempts']}, "
        f"failure reasons {s['failure_reasons']}"
    )
    print(
        f"faults {s['faults']}; {s['kills']} worker kills, {s['backend_terminations']} "
        f"backend terminations, {s['connection_closes']} connection closes; "
        f"chaos {s['chaos_s']} s, drain {s['drain_s']} s"
    )
    g = s["gateway"]
    print(
        f"gateway: {g['calls_total']} calls (busiest 2 s: {g['peak_calls_per_s']} calls/s), "
        f"{g['rate_limited']} answered 429 by its rate limit of {g['rate_limit']:g} calls/s "
        f"(pace {g['pace']}), {g['outage_calls']} answered 503 by outages, "
        f"{g['hops_deferred']} hops deferred; outages {s['outages']}"
    )
    for note in s["notes"]:
        print(f"note: {note}")
    if not outcome.violations:
        print("every promise held")
    for violation in outcome.violations[:50]:
        print(f"VIOLATION {violation.kind} {violation.brand_id or '-'}: {violation.detail}")
    for brand, history in outcome.histories.items():
        print(f"--- history of {brand}:\n{history}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    print(f"seed {seed}", flush=True)
    run_dir = Path(tempfile.mkdtemp(prefix="reliability-"))
    iso = Isolation(args.database_url, args.broker_url)
    outcome: Outcome | None = None
    try:
        run = Run(args.brands, seed, args.workers, iso, run_dir, outage_s=args.outage_s)
        print(run.describe(), flush=True)
        iso.create()
        outcome = run.execute()
        named = [v.brand_id for v in outcome.violations if v.brand_id]
        for brand in list(dict.fromkeys(named))[:SHOWN_BRANDS]:
            outcome.histories[brand] = run.history(brand)
    finally:
        failed = outcome is None or bool(outcome.violations)
        if not args.keep:
            iso.drop()
        if args.keep or failed:
            print(f"logs of every process: {run_dir}", file=sys.stderr)
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    report(outcome)
    print(json.dumps(outcome.summary, sort_keys=True), flush=True)
    return 1 if outcome.violations else 0


if __name__ == "__main__":
    sys.exit(main())
