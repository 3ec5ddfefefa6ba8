"""Stray 429s: a rollout against a gateway that answers a share of calls 429 at random,
whatever our rate (a shared tenant's throttling), side by side with the same rollout
without them, in one run.

    .venv/bin/python bench/stray.py [--brands 300] [--share 0.03] [--json]

The deployment is `bench/rollout.py`'s (two `provisioner worker --concurrency 16`,
the relay, the projections and the reconciler, as processes, on a fresh database
and virtual host), no rate configured, a workspace ready at its second poll. The
fake answers each GET 429 (`Retry-After: 1`) with probability `--share`. Measured:
seconds to the last brand ready with and without the 429s, their ratio against the
target (at most 1.3: a stray 429 costs its own retry, not the fleet's time), the
calls answered 429, whether the fleet's pace ever held or learned a rate, and the
brands that failed (none may).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import fake_call, metric, start_fake
from rollout import Deployment, follow, logs_dir, make_brands, publish, say

TARGET = 1.3  # seconds with the 429s / seconds without, at most


def one(
    gateway_url: str, rows: list[tuple[str, str, str]], parents: list[str], args: Any,
    name: str, logs: Path, share: float,
) -> dict[str, Any]:  # fmt: skip
    fake_call(gateway_url, "/_fake/reset", {})
    fake_call(gateway_url, "/_fake/config", {"throttle_rate": share, "settle_polls": 1})
    deployment = Deployment(gateway_url, logs / name, args.workers, args.concurrency)
    brands = [brand for brand, _, _ in rows]
    with deployment.running(PROVISIONER_PARENT_IDS=",".join(parents)):
        started = time.time()
        publish(deployment, rows, logs / f"{name}.csv")
        progress = follow(deployment, brands, args.timeout, name)
        seconds = (progress.last_ready() or time.time()) - started
        state = fake_call(gateway_url, "/_fake/state")
        samples = deployment.metrics()
        held = deployment.query("SELECT state FROM provisioner_gateway_pace")
    pace = held[0][0] if held else {}
    throttled = int(state.get("faults", {}).get("throttled", 0))
    result = {
        "seconds": round(seconds, 2),
        "ready": progress.ready,
        "failed": len(progress.failed),
        "failed_reasons": progress.reasons(),
        "calls_total": int(state["calls_total"]),
        "answered_429": throttled,
        "share_429": round(throttled / max(int(state["calls_total"]), 1), 4),
        "fleet_held": bool(pace.get("paused_until")),
        "rate_learned": pace.get("learned") is not None,
        "hops_deferred": metric(samples, "provisioner_hops_total", outcome="deferred"),
    }
    say(f"{name}: {seconds:.1f} s, {progress.ready} ready, {len(progress.failed)} failed, "
        f"{throttled} calls answered 429, fleet held: {result['fleet_held']}")  # fmt: skip
    return result


Run = Callable[[str, list[tuple[str, str, str]], list[str], Any, str, Path, float], dict[str, Any]]


def without_and_with(
    args: Any, one: Run, passed: Callable[[dict[str, Any], dict[str, Any], float], bool]
) -> tuple[dict[str, Any], dict[str, Any], float, bool]:
    """`one` run without stray 429s, then with `args.share` of them, against one fake:
    (without, with, their ratio of seconds, `passed` of them). The logs are kept when
    it did not pass."""
    rows, parents = make_brands(args.brands, args.brands_per_parent)
    fake, gateway_url = start_fake(parents, knobs={"settle_polls": 1})
    try:
        with logs_dir(args.logs) as (logs, keep):
            clean = one(gateway_url, rows, parents, args, "without", logs, 0.0)
            stray = one(gateway_url, rows, parents, args, "with", logs, args.share)
            ratio = stray["seconds"] / max(clean["seconds"], 1e-9)
            verdict = passed(clean, stray, ratio)
            keep(not verdict)
    finally:
        fake.terminate()
        fake.wait(5)
    return clean, stray, ratio, verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brands", type=int, default=300)
    parser.add_argument("--share", type=float, default=0.03, help="share of GETs answered 429")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--brands-per-parent", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--logs", metavar="DIR")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    clean, stray, ratio, passed = without_and_with(
        args,
        one,
        lambda clean, stray, ratio: ratio <= TARGET and not clean["failed"] + stray["failed"],
    )
    result = {"brands": args.brands, "share": args.share, "without": clean, "with": stray,
              "ratio": round(ratio, 3), "target": TARGET, "passed": passed}  # fmt: skip
    if args.json:
        print(json.dumps(result))  # one line: bench/report.py reads the last JSON line
    else:
        say(f"with {args.share:.0%} stray 429s / without: {ratio:.2f} (target <= {TARGET}); "
            f"{'pass' if passed else 'FAIL'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
