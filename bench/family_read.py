"""What one hop's family read costs as the family grows (decision 032).

Starts the fake gateway in a subprocess (bench/common.py); for each family size
(0, 10,000 and 50,000 other children by default) resets it, seeds that many children
of another title in one call (`POST /_fake/workspaces {"count": N}`) and one of the
hop's title, then reads the family READS times through `HttpGateway` over loopback,
as a hop does (`family(parent, title)`), after a few warm-up reads. Printed per size:
the listing's bytes and share of its bound, the read's wall time (median and p90,
the fake's own work included), this process's CPU per read (the worker's cost:
receiving and parsing), the fake's CPU per read, each as a ratio to the 0-member
baseline measured in the same run, and the worker's peak memory during one read
(tracemalloc) beside that of the way before (the body whole, then `json.loads`).

    .venv/bin/python bench/family_read.py [--members 0 10000 50000] [--reads 40] [--json]

`--json` prints one object on one line: {"reads", "load_average", "sizes": [a row per size]}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx
from common import fake_call, percentile, proc_cpu_s, start_fake

from infrastructure.gateway.adapter import HttpGateway
from infrastructure.gateway.family import FAMILY_ANSWER_MAX

PARENT = "org-parent"
TITLE = "Brand under test"
WARM_UP = 5


def measure(url: str, pid: int, members: int, reads: int) -> dict[str, float]:
    fake_call(url, "/_fake/reset", {})
    if members:
        body = {"title": "Another brand", "parent": PARENT, "count": members}
        fake_call(url, "/_fake/workspaces", body)
    fake_call(url, "/_fake/workspaces", {"title": TITLE, "parent": PARENT, "status": "created"})
    shares: list[float] = []
    with HttpGateway(url, "bench-token", retries=0, on_family_share=shares.append) as gateway:
        for _ in range(WARM_UP):
            assert len(gateway.family(PARENT, TITLE)) == 1
        walls: list[float] = []
        fake_before, cpu_before = proc_cpu_s(pid), time.process_time()
        for _ in range(reads):
            began = time.perf_counter()
            gateway.family(PARENT, TITLE)
            walls.append(time.perf_counter() - began)
        cpu, fake_cpu = time.process_time() - cpu_before, proc_cpu_s(pid) - fake_before
        tracemalloc.start()
        gateway.family(PARENT, TITLE)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return {
        "members": members,
        "bytes": round(shares[-1] * FAMILY_ANSWER_MAX),
        "share": shares[-1],
        "wall_p50_ms": 1000 * statistics.median(walls),
        "wall_p90_ms": 1000 * percentile(walls, 0.9),
        "client_cpu_ms": 1000 * cpu / reads,
        "fake_cpu_ms": 1000 * fake_cpu / reads,
        "peak_kib": peak / 1024,
        "whole_peak_kib": whole_peak(url) / 1024,
    }


def whole_peak(url: str) -> int:
    """Peak memory of the way before decision 032 (the body whole, then `json.loads`)."""
    auth = {"Authorization": "Bearer bench-token"}
    body = httpx.get(f"{url}/v1/workspaces/{PARENT}/family", headers=auth).content
    tracemalloc.start()
    kept = [m for m in json.loads(bytes(body)) if m["title"] == TITLE]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(kept) == 1
    return peak + len(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[0, 10_000, 50_000])
    parser.add_argument("--reads", type=int, default=40, help="timed reads per size")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    args = parser.parse_args()
    sizes = sorted({0, *args.members})  # the baseline is always measured
    load_before = os.getloadavg()[0]
    proc, url = start_fake()
    try:
        rows = [measure(url, proc.pid, n, args.reads) for n in sizes]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    base = rows[0]
    for row in rows:
        for key in ("wall_p50_ms", "client_cpu_ms", "fake_cpu_ms"):
            row[key.removesuffix("_ms") + "_x"] = row[key] / base[key] if base[key] else 0.0
    load_after = os.getloadavg()[0]
    if args.json:
        load_average = [round(load_before, 2), round(load_after, 2)]
        print(json.dumps({"reads": args.reads, "load_average": load_average, "sizes": rows}))
        return
    load = f"load average {load_before:.2f} before, {load_after:.2f} after"
    print(f"family reads through HttpGateway over loopback, {args.reads} a size; {load}")
    print(
        "members |     bytes | share of bound | wall p50 (x) | wall p90 | "
        "worker CPU/read (x) | fake CPU/read (x) | worker peak memory (body whole)"
    )
    for r in rows:
        print(
            f"{r['members']:7,} | {r['bytes']:9,} | {100 * r['share']:13.2f}% | "
            f"{r['wall_p50_ms']:6.1f} ms ({r['wall_p50_x']:5.1f}) | {r['wall_p90_ms']:5.1f} ms | "
            f"{r['client_cpu_ms']:8.2f} ms ({r['client_cpu_x']:5.1f}) | "
            f"{r['fake_cpu_ms']:6.1f} ms ({r['fake_cpu_x']:5.1f}) | "
            f"{r['peak_kib']:7,.0f} KiB ({r['whole_peak_kib']:,.0f} KiB)"
        )


if __name__ == "__main__":
    main()
