"""A scaled-out deployment under fire: 300 concurrent `provisioner provision --wait`
against three workers, two relays and two reconcilers, a gateway that loses 2 % of
creates after making them, with and without 3 % stray 429s, in one run.

    .venv/bin/python bench/scaleout.py [--brands 300] [--share 0.03] [--lost 0.02] [--json]

The deployment is `bench/rollout.py`'s `Deployment`: `--workers` (3) `provisioner
worker --concurrency` (8), `--relays` (2) `provisioner relay`, `provisioner
projections run` and `--reconcilers` (2) `provisioner reconcile`, as processes, on a
fresh database and virtual host, every setting at its production default. A
workspace is ready at its second poll; the fake answers `--lost` of creates by
dropping the connection after making the workspace (the hop must find it in the
family, never create it again). Each brand is requested by its own process,
`provisioner provision BRAND --title T --parent P --wait`, all started at once, as
300 operators or a deploy script would; each polls the database for its attempt
until it ends (exit 0 only when promoted).

Two runs, the fake reset and a fresh database between them: without the 429s (the
baseline) and with `--share` of GETs answered 429 at random (`Retry-After: 1`).
Measured, each: seconds from the first process started to the last one exited;
processes that exited 0 (promoted) and the brands `brand_workspaces` reads ready;
workspaces the fake holds under our titles (one a brand: nothing made twice); the
calls answered 429; whether the fleet's pace ever held; the highest hop an attempt
reached. Target: every brand promoted in both runs, and seconds with the 429s at
most 1.2 x without them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT, fake_call
from rollout import Deployment, say, workspaces_made
from stray import without_and_with

TARGET = 1.2  # seconds with the 429s / seconds without, at most


def requested(
    deployment: Deployment, rows: list[tuple[str, str, str]], logs: Path, timeout_s: float
) -> dict[str, Any]:
    """Every brand's `provision --wait` at once; when each exited and how."""
    env = deployment.env | {"PYTHONPATH": str(ROOT)}
    procs: list[tuple[str, subprocess.Popen[bytes], Any]] = []
    started = time.time()
    for brand, title, parent in rows:
        out = (logs / f"provision-{brand}.log").open("wb")
        args = [sys.executable, "-m", "worker.cli.main", "provision", brand, "--title", title]
        args += ["--parent", parent, "--wait", "--timeout", f"{timeout_s:g}"]
        procs.append(
            (brand, subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=out), out)
        )
    spawned_s = time.time() - started
    exits: dict[str, int] = {}
    last_exit = started
    while len(exits) < len(procs):
        for brand, proc, out in procs:
            if brand not in exits and proc.poll() is not None:
                exits[brand] = proc.returncode
                last_exit = time.time()
                out.close()
        time.sleep(0.1)
    codes: dict[str, int] = {}
    for code in exits.values():
        codes[str(code)] = codes.get(str(code), 0) + 1
    return {
        "spawned_s": round(spawned_s, 2),
        "seconds": round(last_exit - started, 2),
        "exit_codes": codes,
        "promoted": codes.get("0", 0),
        "not_promoted": sorted(b for b, code in exits.items() if code != 0)[:10],
    }


def one(
    gateway_url: str, rows: list[tuple[str, str, str]], parents: list[str],
    args: Any, name: str, logs: Path, share: float,
) -> dict[str, Any]:  # fmt: skip
    fake_call(gateway_url, "/_fake/reset", {})
    knobs = {"throttle_rate": share, "settle_polls": 1}
    fake_call(gateway_url, "/_fake/config", knobs | {"create_timeout_after_create_rate": args.lost})
    deployment = Deployment(
        gateway_url, logs / name, args.workers, args.concurrency,
        relays=args.relays, reconcilers=args.reconcilers,
    )  # fmt: skip
    (logs / name).mkdir(parents=True, exist_ok=True)
    brands = [brand for brand, _, _ in rows]
    with deployment.running(PROVISIONER_PARENT_IDS=",".join(parents)):
        ran = requested(deployment, rows, logs / name, args.timeout)
        progress = deployment.progress(brands)
        state = fake_call(gateway_url, "/_fake/state")
        pace = deployment.query("SELECT state FROM provisioner_gateway_pace")
        hops = deployment.query(
            "SELECT coalesce(max(hops_used), 0) FROM attempts WHERE brand_id = ANY(%s)", brands
        )
        if ran["promoted"] < len(rows):
            deployment.keep_histories(brands)
    held = pace[0][0] if pace else {}
    faults = state.get("faults", {})
    result = {
        **ran,
        "ready": progress.ready,
        "failed": len(progress.failed),
        "failed_reasons": progress.reasons(),
        "workspaces_made": workspaces_made(state, rows),
        "lost_creates": int(faults.get("create_timeout_after_create", 0)),
        "calls_total": int(state["calls_total"]),
        "answered_429": int(faults.get("throttled", 0)),
        "fleet_held": bool(held.get("paused_until")),
        "rate_learned": held.get("learned") is not None,
        "highest_hop": int(hops[0][0]),
    }
    say(f"{name}: {ran['promoted']}/{len(rows)} promoted in {ran['seconds']:.1f} s "
        f"(spawned in {ran['spawned_s']:.1f} s), {result['workspaces_made']} workspaces, "
        f"{result['lost_creates']} lost creates, {result['answered_429']} answered 429, "
        f"fleet held: {result['fleet_held']}, highest hop {result['highest_hop']}")  # fmt: skip
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brands", type=int, default=300)
    parser.add_argument("--share", type=float, default=0.03, help="share of GETs answered 429")
    parser.add_argument("--lost", type=float, default=0.02, help="share of creates lost after made")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--relays", type=int, default=2)
    parser.add_argument("--reconcilers", type=int, default=2)
    parser.add_argument("--brands-per-parent", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=900.0, help="each --wait's timeout")
    parser.add_argument("--logs", metavar="DIR")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    def once(r: dict[str, Any]) -> bool:  # every brand promoted, none made twice
        return bool(r["promoted"] == args.brands and r["workspaces_made"] == args.brands)

    clean, stray, ratio, passed = without_and_with(
        args, one, lambda clean, stray, ratio: once(clean) and once(stray) and ratio <= TARGET
    )
    every = once(clean) and once(stray)
    result = {
        "brands": args.brands, "share": args.share, "lost": args.lost,
        "layout": f"{args.workers} x {args.concurrency}, {args.relays} relays, "
                  f"{args.reconcilers} reconcilers",
        "without": clean, "with": stray, "ratio": round(ratio, 3), "target": TARGET,
        "passed": passed, "load": os.getloadavg()[0],
    }  # fmt: skip
    if args.json:
        print(json.dumps(result))  # one line: bench/report.py reads the last JSON line
    else:
        say(f"with {args.share:.0%} stray 429s / without: {ratio:.2f} (target <= {TARGET}); "
            f"every brand promoted once: {every}; {'pass' if passed else 'FAIL'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
