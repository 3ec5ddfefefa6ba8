"""What the benchmarks share: starting the fake gateway, reading CPU time, percentiles,
running the service's commands as processes and reading their metrics.

Imported by the scripts in bench/ (which put the project root on sys.path first).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
LOCAL_PG = "postgresql://root@127.0.0.1:5432"
LOCAL_AMQP = "amqp://guest:guest@127.0.0.1:5672"


def fresh_database() -> tuple[str, str]:
    """A new database on the local server: (URL, name). The benchmarks write only there."""
    name = f"provisioner_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{LOCAL_PG}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{LOCAL_PG}/{name}", name


def drop_database(name: str) -> None:
    with psycopg.connect(f"{LOCAL_PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fresh_vhost() -> tuple[str, str | None]:
    """A new virtual host on the local RabbitMQ for guest: (URL, name), made with
    `rabbitmqctl`, so that the benchmark never purges queues another user shares.
    Without `rabbitmqctl` (not root, not installed): the default vhost, name None."""
    exe = shutil.which("rabbitmqctl")
    if exe is not None:
        name = f"provisioner-bench-{uuid.uuid4().hex[:8]}"
        made = subprocess.run([exe, "add_vhost", name], capture_output=True, check=False)
        if made.returncode == 0:
            subprocess.run(
                [exe, "set_permissions", "-p", name, "guest", ".*", ".*", ".*"],
                capture_output=True,
                check=True,
            )
            return f"{LOCAL_AMQP}/{quote(name, safe='')}", name
    return f"{LOCAL_AMQP}//", None


def delete_vhost(name: str | None) -> None:
    exe = shutil.which("rabbitmqctl")
    if name is not None and exe is not None:
        subprocess.run([exe, "delete_vhost", name], capture_output=True, check=False)


def start_fake(
    parents: Sequence[str] = (),
    *,
    latency_ms: float = 0.0,
    seed: int | None = None,
    knobs: Mapping[str, float] | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """`provisioner fake-gateway` in a subprocess on a free port: (process, base URL).

    A random seed unless one is given, so that runs do not replay one draw.
    `knobs`: more of its flags by knob name, e.g. {"rate_limit": 20, "settle_polls": 1}.
    """
    args = [sys.executable, "-m", "infrastructure.fake_gateway", "--port", "0"]
    for parent in parents:
        args += ["--parent", parent]
    args += ["--latency-ms", str(latency_ms)]
    for name, value in (knobs or {}).items():
        args += ["--" + name.replace("_", "-"), str(value)]
    args += ["--seed", str(uuid.uuid4().int % 2**31 if seed is None else seed)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"listening on (http://\S+)", line)
    if match is None:
        proc.kill()
        raise SystemExit(f"the fake gateway did not start: {line!r}")
    return proc, match.group(1)


def proc_cpu_s(pid: int | str) -> float:
    """CPU seconds (user + system, all threads) of one live process; 0 when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_by_name(*names: str) -> dict[str, float]:
    """CPU seconds of every live process whose comm is one of `names`, by pid."""
    found: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() in names:
                    found[entry.name] = proc_cpu_s(entry.name)
            except OSError:
                continue
    return found


def postgres_cpu(database: str | None = None) -> dict[str, float]:
    """CPU seconds of PostgreSQL's processes by pid: with `database`, only the server's
    own processes and the backends serving that database (the machine may be shared)."""
    found: dict[str, float] = {}
    for pid, cpu in cpu_by_name("postgres").items():
        if database is not None:
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            backend = "127.0.0.1(" in title or "[local]" in title or "autovacuum worker" in title
            if backend and f" {database} " not in title:
                continue
        found[pid] = cpu
    return found


def cpu_since(before: dict[str, float], now: dict[str, float]) -> float:
    """CPU used between two samples by pid (a process gone meanwhile counts 0)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in now.items())


def machine_busy_s() -> float:
    """CPU seconds the machine spent busy, all cores (idle and iowait excluded)."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except OSError:
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK


# --------------------------------------------------------------------------- the pipeline's flags

# The flags of the pipeline's layout and size, shared by bench/pipeline.py and bench/peer.py
# (which runs the pipeline as its "ours" side): each script adds its own --latency-ms.
PIPELINE_FLAGS = ("brands", "concurrency", "workers", "brands_per_parent", "timeout")


def add_pipeline_args(parser: argparse.ArgumentParser) -> None:
    """--brands, --concurrency, --workers, --brands-per-parent, --timeout and --json."""
    parser.add_argument("--brands", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16, help="hop threads per worker")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (one a core)")
    parser.add_argument("--brands-per-parent", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for brands")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def pipeline_args(
    args: argparse.Namespace, latency_ms: float, profile: str | None = None
) -> argparse.Namespace:
    """The arguments of one bench/pipeline.py run, taken from `args` (parsed with
    `add_pipeline_args`) at one latency."""
    given = {name: getattr(args, name) for name in PIPELINE_FLAGS}
    return argparse.Namespace(**given, latency_ms=latency_ms, profile=profile)


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of the samples, nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --------------------------------------------------------------------------- service processes


def fake_call(base_url: str, path: str, body: object = None) -> dict[str, Any]:
    """One admin call to the fake (`/_fake/...`): GET, or POST with a JSON body."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base_url + path, data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        result: dict[str, Any] = json.loads(answer.read() or b"{}")
        return result


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (another process may take it later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def service_env(**settings: str) -> dict[str, str]:
    """The environment for `provisioner` subprocesses: this one without any
    PROVISIONER_* variable (every setting at its default), plus `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(settings)
    return env


def provisioner(args: Sequence[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`provisioner ARGS...` in a subprocess, its stdout and stderr appended to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "worker.cli.main", *args],
            cwd=ROOT,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 30.0) -> None:
    """SIGTERM each process, wait for all, and kill any still running after `timeout_s`."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def wait_live(port: int, timeout_s: float = 60.0) -> None:
    """Until the process serving metrics on `port` answers `/healthz` 200."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"the process on metrics port {port} did not come up")
        time.sleep(0.2)


def scrape(ports: Sequence[int]) -> dict[str, float]:
    """Every sample of the processes' `/metrics`, summed over the processes, by its
    series (`name{labels}` as exposed)."""
    total: dict[str, float] = {}
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    series, value = line.rsplit(" ", 1)
                    total[series] = total.get(series, 0.0) + float(value)
    return total


def metric(samples: Mapping[str, float], name: str, **labels: str) -> float:
    """The sum of a metric's series that carry every label given."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        value
        for series, value in samples.items()
        if series.split("{", 1)[0] == name and all(w in series for w in wanted)
    )
