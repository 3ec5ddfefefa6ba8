"""Measure the fake gateway alone: status calls from concurrent keep-alive httpx clients.

Starts the fake in a subprocess (bench/common.py), seeds one workspace, then runs THREADS
threads, each with its own ``httpx.Client`` (or, with ``--client raw``, a
minimal keep-alive socket client), doing CALLS status GETs each.
Prints p50/p99/max latency in ms, calls/s, and (on Linux) the fake's CPU time
per call, which separates the server's cost from the client's: with several
client threads in one Python process the client's own GIL shows up in the
latency figures.

    PYTHONPATH=. python bench/fake_gateway_load.py [--threads 8] [--calls 2000] [--client raw]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time

import httpx
from common import percentile, proc_cpu_s, start_fake

AUTH = {"Authorization": "Bearer bench"}


def httpx_worker(
    url: str, path: str, calls: int, start: threading.Barrier, out: list[float]
) -> None:
    with httpx.Client(base_url=url, headers=AUTH, timeout=5.0) as client:
        for _ in range(20):  # warm the connection up
            client.get(path).raise_for_status()
        start.wait()
        for _ in range(calls):
            began = time.perf_counter()
            client.get(path).raise_for_status()
            out.append(time.perf_counter() - began)


def raw_worker(url: str, path: str, calls: int, start: threading.Barrier, out: list[float]) -> None:
    """A minimal keep-alive HTTP/1.1 client: measures the fake, not the client library."""
    host, port = url.removeprefix("http://").split(":")
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer bench\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port))) as sock, sock.makefile("rb") as reader:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def one_call() -> None:
            sock.sendall(request)
            status = reader.readline()
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            reader.read(length)
            if b" 200 " not in status:
                raise RuntimeError(f"unexpected answer {status!r}")

        for _ in range(20):
            one_call()
        start.wait()
        for _ in range(calls):
            began = time.perf_counter()
            one_call()
            out.append(time.perf_counter() - began)


WORKERS = {"httpx": httpx_worker, "raw": raw_worker}


def run(threads: int, calls: int, client: str) -> None:
    proc, url = start_fake()
    try:
        seeded = httpx.post(
            f"{url}/_fake/workspaces",
            json={"title": "bench", "parent": "org-parent", "status": "created"},
        ).json()
        path = f"/v1/workspaces/{seeded['id']}/status"
        results: list[list[float]] = [[] for _ in range(threads)]
        barrier = threading.Barrier(threads + 1)
        pool = [
            threading.Thread(target=WORKERS[client], args=(url, path, calls, barrier, results[i]))
            for i in range(threads)
        ]
        for thread in pool:
            thread.start()
        barrier.wait()
        cpu_before, began = proc_cpu_s(proc.pid), time.perf_counter()
        client_cpu = time.process_time()
        for thread in pool:
            thread.join()
        elapsed, cpu_after = time.perf_counter() - began, proc_cpu_s(proc.pid)
        client_cpu = time.process_time() - client_cpu
        latencies = sorted(x for r in results for x in r)
        print(f"{threads} threads x {calls} status GETs, keep-alive {client} clients")
        report(latencies, elapsed, cpu_before, cpu_after)
        print(f"client CPU per call: {1000 * client_cpu / len(latencies):.3f} ms (all threads)")
    finally:
        proc.terminate()
        code = proc.wait(timeout=10)
        print(f"fake exited with {code}")


def report(
    latencies: list[float],
    elapsed: float,
    cpu_before: float,
    cpu_after: float,
) -> None:
    total = len(latencies)
    print(
        f"latency ms: p50 {1000 * percentile(latencies, 0.50):.3f}"
        f"  p99 {1000 * percentile(latencies, 0.99):.3f}"
        f"  max {1000 * latencies[-1]:.3f}  mean {1000 * statistics.fmean(latencies):.3f}"
    )
    print(f"throughput: {total / elapsed:,.0f} calls/s over {elapsed:.2f} s")
    if cpu_after > 0:  # 0 where /proc is not there
        print(f"fake CPU per call: {1000 * (cpu_after - cpu_before) / total:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2000, help="status GETs per thread")
    parser.add_argument(
        "--client",
        choices=sorted(WORKERS),
        default="httpx",
        help="httpx (as the adapter) or raw (a minimal client, to see the fake alone)",
    )
    args = parser.parse_args()
    run(args.threads, args.calls, args.client)


if __name__ == "__main__":
    main()
