"""`make bench`: run every benchmark with its baseline, then write the current figures.

    .venv/bin/python bench/report.py [--quick] [--repeat N] [--no-write] [--only NAME,...]

Runs, one after another, each as a subprocess with `--json`:

- `engine`: bench/engine.py --skeleton (the engine, its bare-I/O skeleton and
  the bare save rate, in one run);
- `pipeline-0ms` and `pipeline-100ms`: bench/pipeline.py at zero latency and at
  100 ms per gateway call (each with the raw publish and bare save rates);
- `readmodels`: bench/readmodels.py (the rebuild with the raw notification-log
  scan, and the read commands' latencies);
- `rollout-metered`: bench/rollout.py metered (300 brands against a gateway
  metered at 20 calls/s, the fleet's rate configured, then learned);
- `rollout-outage`: bench/rollout.py outage (a 10-minute outage with 200
  brands in flight; 30 s under `--quick`), run once whatever `--repeat`;
- `peer`: bench/peer.py (ours beside a Celery + row compare-and-set peer, 1,000
  brands at 0 and 100 ms per call, a workspace ready at its second poll);
- `peer-same-schedule`: bench/peer.py --peer-poll-s 5 (the same, the peer
  re-polling after 5 s, doubling, as ours does; judged by the targets proposed in
  docs/benchmarks.md's peer section);
- `stray`: bench/stray.py (a 300-brand rollout with 3 % of calls answered 429 at
  random, beside the same rollout without them);
- `rollout-crowded`: bench/rollout.py crowded (300 brands into one parent holding
  50,000 other children, beside the same into an empty parent);
- `family-read`: bench/family_read.py (one hop's family read at 0, 10,000 and
  50,000 other children, each beside the 0-member read);
- `scaleout`: bench/scaleout.py (300 concurrent `provisioner provision --wait`
  against 3 workers x 8, 2 relays and 2 reconcilers, 2 % of creates lost, without
  and then with 3 % stray 429s; 40 brands under `--quick`), run once whatever
  `--repeat`.

The metered rollout's targets are bench/rollout.py's `TARGETS` and the scale-out's
bench/scaleout.py's `TARGET`, read from their source: one number, judged the same
by the benchmark and here.

Around each run it samples the load average, the machine's busy CPU, the CPU
of the run's own process tree, of the PostgreSQL server and of RabbitMQ
(Linux /proc), so that a figure can be judged by the other load it ran
beside. Then it rewrites the region of docs/benchmarks.md between
`<!-- bench:figures:begin -->` and `<!-- bench:figures:end -->`: date,
machine, commit, commands, figures, ratios and targets, other load. Nothing
outside the markers changes. It refuses to write (and exits 1) when a
benchmark failed or the markers are not there once each, in order.

`--quick` runs small sizes, once each unless `--repeat` says otherwise (a smoke
check; the targets are not judged and the region says it is a placeholder);
`--no-write` and `--only` print the region without writing it.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- bench:figures:begin -->"
END = "<!-- bench:figures:end -->"
CLK_TCK = os.sysconf("SC_CLK_TCK")
TIMEOUT_S = 1800.0


class RegionError(Exception):
    """The document has no single, ordered pair of markers: nothing is written."""


class BenchFailed(Exception):
    """A benchmark did not complete: its figures are not written."""


# --------------------------------------------------------------------------- the benchmarks


@dataclass(frozen=True)
class Bench:
    name: str
    title: str
    script: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    max_runs: int | None = None  # at most this many runs, whatever --repeat (a long one)

    def runs(self, repeat: int) -> int:
        return repeat if self.max_runs is None else min(repeat, self.max_runs)

    def argv(self, quick: bool) -> list[str]:
        return [self.script, *(self.quick if quick else self.full)]


# Our first wait before a workspace's next poll (PROVISIONER_BACKOFF_BASE_S's default, doubling
# after): `peer-same-schedule` has the peer re-poll after as long (bench/peer.py --peer-poll-s).
OUR_POLL_S = 5.0

BENCHES = (
    Bench(
        "engine",
        "engine and its skeleton, 2 x 8",
        "bench/engine.py",
        ("--skeleton", "--json"),
        ("--skeleton", "--json", "--attempts", "200", "--warmup", "50", "--bare-saves", "400"),
    ),
    Bench(
        "pipeline-0ms",
        "pipeline, zero latency, 2 x 16",
        "bench/pipeline.py",
        ("--brands", "1000", "--json"),
        ("--brands", "200", "--json"),
    ),
    Bench(
        "pipeline-100ms",
        "pipeline, 100 ms per call, 2 x 16",
        "bench/pipeline.py",
        ("--brands", "1000", "--latency-ms", "100", "--json"),
        ("--brands", "200", "--latency-ms", "100", "--json"),
    ),
    Bench(
        "readmodels",
        "read models",
        "bench/readmodels.py",
        ("--json",),
        ("--events", "20000", "--samples", "50", "--json"),
    ),
    Bench(
        "rollout-metered",
        "rollout at a metered gateway, 2 x 16",
        "bench/rollout.py",
        ("metered", "--json"),
        ("metered", "--brands", "40", "--json"),
    ),
    Bench(
        "rollout-outage",
        "gateway outage longer than the settle budget, 2 x 16",
        "bench/rollout.py",
        ("outage", "--json"),
        ("outage", "--brands", "40", "--outage-s", "30", "--json"),
        max_runs=1,
    ),
    Bench(
        "peer",
        "ours beside a Celery + row compare-and-set peer, 2 x 16 a side",
        "bench/peer.py",
        ("--brands", "1000", "--json"),
        ("--brands", "100", "--json"),
    ),
    Bench(
        "peer-same-schedule",
        f"ours beside the same peer re-polling after {OUR_POLL_S:g} s as ours, 2 x 16 a side",
        "bench/peer.py",
        ("--brands", "1000", "--peer-poll-s", f"{OUR_POLL_S:g}", "--json"),
        ("--brands", "100", "--peer-poll-s", f"{OUR_POLL_S:g}", "--json"),
    ),
    Bench(
        "stray",
        "rollout with 3 % stray 429s beside one without, 2 x 16",
        "bench/stray.py",
        ("--json",),
        ("--brands", "40", "--json"),
    ),
    Bench(
        "rollout-crowded",
        "rollout into a crowded parent beside an empty one, 2 x 16",
        "bench/rollout.py",
        ("crowded", "--json"),
        ("crowded", "--brands", "40", "--others", "5000", "--json"),
    ),
    Bench(
        "family-read",
        "one hop's family read by the family's size",
        "bench/family_read.py",
        ("--reads", "60", "--json"),
        ("--members", "0", "10000", "--reads", "10", "--json"),
    ),
    Bench(
        "scaleout",
        "300 concurrent provision --wait, 3 x 8, 2 relays, 2 reconcilers, with and without "
        "3 % stray 429s",
        "bench/scaleout.py",
        ("--json",),
        ("--brands", "40", "--json"),
        max_runs=1,  # about 7 minutes
    ),
)


@dataclass
class Run:
    """One benchmark run: its command, its JSON result (None if it failed) and the load."""

    bench: str
    command: list[str]
    result: dict[str, Any] | None
    error: str = ""
    seconds: float = 0.0
    load: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.result is not None and not self.error


# --------------------------------------------------------------------------- targets


def script_constant(script: str, name: str) -> Any:
    """The literal a benchmark script assigns to `name` at its top level, read from its
    source: importing the script would start its imports (psycopg, its helpers on
    sys.path), and a copy here could drift from the number the script judges by."""
    tree = ast.parse((ROOT / script).read_text(), filename=script)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise LookupError(f"{script} assigns no {name} at its top level")


# run -> (seconds / floor at most, share of calls answered 429 at most)
METERED_TARGETS: dict[str, tuple[float, float]] = {
    run: (float(ratio), float(share))
    for run, (ratio, share) in script_constant("bench/rollout.py", "TARGETS").items()
}
SCALEOUT_TARGET = float(script_constant("bench/scaleout.py", "TARGET"))  # with / without
# The proposed targets against the peer re-polling on our schedule (docs/benchmarks.md, peer):
# latency ms -> (op, ours / peer's provisions/s at 0 ms, our seconds / peer's at 100 ms)
PEER_SAME_SCHEDULE_TARGETS: dict[float, tuple[str, float]] = {
    0.0: (">=", 0.65),
    100.0: ("<=", 1.33),
}


@dataclass(frozen=True)
class Figure:
    """A figure read from one benchmark's result, with its target if it has one."""

    label: str
    bench: str
    value: Callable[[dict[str, Any]], float]
    unit: str
    fmt: str
    target: tuple[str, float] | None = None  # (">=" or "<=", threshold)
    note: str = ""

    def show(self, result: dict[str, Any]) -> str:
        return format(self.value(result), self.fmt)

    def passes(self, result: dict[str, Any]) -> bool | None:
        if self.target is None:
            return None
        op, threshold = self.target
        value = self.value(result)
        return value >= threshold if op == ">=" else value <= threshold

    def target_text(self) -> str:
        if self.target is None:
            return self.note or "none"
        op, threshold = self.target
        return f"{'≥' if op == '>=' else '≤'} {threshold:,g}{self.unit}"


def _engine_to_skeleton(r: dict[str, Any]) -> float:
    return float(r["attempts_per_s"]) / float(r["skeleton"]["attempts_per_s"])


def _pipeline_workers_cpu(r: dict[str, Any]) -> float:
    cpu = r["cpu_ms_per_provision"]
    return float(sum(v for k, v in cpu.items() if k.startswith("worker")))


def _not_ready(r: dict[str, Any]) -> float:
    return float(r["brands"] - r["ready"])


def _metered_not_ready(r: dict[str, Any]) -> float:
    return sum(_not_ready({"brands": r["brands"], **r[run]}) for run in ("configured", "learned"))


def _calls_over_probes(r: dict[str, Any]) -> float:
    """Calls that reached the gateway after the circuit opened, over one per probe
    interval (rounded up) of the outage left then; no open circuit reads infinite."""
    if r["calls_after_open"] is None:
        return float("inf")
    return float(r["calls_after_open"]) / max(int(r["allowed_after_open"]), 1)


def _peer_ratio(latency_ms: float) -> Callable[[dict[str, Any]], float]:
    """bench/peer.py's ratio at this latency (ours over the peer's, same run)."""

    def value(r: dict[str, Any]) -> float:
        found = [x["value"] for x in r["ratios"] if float(x["latency_ms"]) == latency_ms]
        return float(found[0]) if found else float("nan")

    return value


def _stray_not_ready(r: dict[str, Any]) -> float:
    runs = ("without", "with")
    return sum(float(r["brands"] - r[run]["ready"]) for run in runs)


def _crowded_not_ready(r: dict[str, Any]) -> float:
    return sum(float(r["brands"] - r[run]["ready"]) for run in ("empty", "crowded"))


def _percent(share: float) -> float:
    """A share as a percentage, rounded: a share at its target reads as the target, as the
    benchmark judges it (100 * 0.05 is 5.000000000000001)."""
    return round(100 * share, 9)


def _scaleout_missed(r: dict[str, Any]) -> float:
    """Over both runs: brands not promoted, and workspaces made beyond one a brand."""
    brands = int(r["brands"])
    return float(
        sum(
            brands - int(r[run]["promoted"]) + max(0, int(r[run]["workspaces_made"]) - brands)
            for run in ("without", "with")
        )
    )


def _largest_family(r: dict[str, Any]) -> dict[str, Any]:
    largest: dict[str, Any] = max(r["sizes"], key=lambda row: row["members"])
    return largest


FIGURES = (
    Figure(
        "pipeline, zero latency: provisions/s",
        "pipeline-0ms",
        lambda r: float(r["provisions_per_s"]),
        "",
        ",.1f",
        (">=", 150),
    ),
    Figure(
        "pipeline, 100 ms per call: seconds for all brands",
        "pipeline-100ms",
        lambda r: float(r["seconds"]),
        " s",
        ".2f",
        ("<=", 11),
    ),
    Figure(
        "pipeline, largest worker RSS (MB)",
        "pipeline-0ms",
        lambda r: float(r["worker_rss_mb"]),
        " MB",
        ".0f",
        ("<=", 150),
    ),
    Figure(
        "pipeline, zero latency: workers' CPU ms per provision",
        "pipeline-0ms",
        _pipeline_workers_cpu,
        " ms",
        ".2f",
    ),
    Figure(
        "engine / skeleton, attempts/s (same run)",
        "engine",
        _engine_to_skeleton,
        "",
        ".2f",
        (">=", 0.8),
    ),
    Figure(
        "engine, transactions per attempt",
        "engine",
        lambda r: float(r["transactions_per_attempt"]),
        "",
        ".2f",
        ("<=", 4),
    ),
    Figure(
        "engine / best bare save rate (same run)",
        "engine",
        lambda r: float(r["ratio"]),
        "",
        ".2f",
        None,
        "none (the strict reading: see Engine)",
    ),
    Figure(
        "read models, rebuild of both projections: events/s",
        "readmodels",
        lambda r: float(r["rebuild_events_per_s"]),
        "",
        ",.0f",
        (">=", 20000),
    ),
    Figure(
        "read models, rebuild / raw notification-log scan (same run)",
        "readmodels",
        lambda r: float(r["rebuild_vs_scan"]),
        "",
        ".2f",
    ),
    Figure(
        "`history BRAND` p99 (ms)",
        "readmodels",
        lambda r: float(r["history_p99_ms"]),
        " ms",
        ".2f",
        ("<=", 20),
    ),
    Figure(
        "`attempts --stuck`, worst of 20 (ms)",
        "readmodels",
        lambda r: float(r["stuck_ms"]),
        " ms",
        ".1f",
        ("<=", 100),
    ),
    Figure(
        "rollout, rate configured: seconds / floor",
        "rollout-metered",
        lambda r: float(r["configured"]["seconds_over_floor"]),
        "",
        ".2f",
        ("<=", METERED_TARGETS["configured"][0]),
    ),
    Figure(
        "rollout, rate configured: calls answered 429 (%)",
        "rollout-metered",
        lambda r: _percent(float(r["configured"]["share_429"])),
        " %",
        ".2f",  # at a target of none, one 429 in a few thousand calls still shows
        ("<=", _percent(METERED_TARGETS["configured"][1])),
    ),
    Figure(
        "rollout, rate learned: seconds / floor",
        "rollout-metered",
        lambda r: float(r["learned"]["seconds_over_floor"]),
        "",
        ".2f",
        ("<=", METERED_TARGETS["learned"][0]),
    ),
    Figure(
        "rollout, rate learned: calls answered 429 (%)",
        "rollout-metered",
        lambda r: _percent(float(r["learned"]["share_429"])),
        " %",
        ".1f",
        ("<=", _percent(METERED_TARGETS["learned"][1])),
    ),
    Figure(
        "rollout, brands not ready (both runs)",
        "rollout-metered",
        _metered_not_ready,
        "",
        ".0f",
        ("<=", 0),
    ),
    Figure(
        "outage, calls after the circuit opened / one per probe interval",
        "rollout-outage",
        _calls_over_probes,
        "",
        ".2f",
        ("<=", 1),
    ),
    Figure(
        "outage, seconds from the gateway's return to the last brand ready",
        "rollout-outage",
        lambda r: float(r["recovery_s"]),
        " s",
        ".1f",
        ("<=", 60),
    ),
    Figure(
        "outage, brands not ready",
        "rollout-outage",
        _not_ready,
        "",
        ".0f",
        ("<=", 0),
    ),
    Figure(
        "peer, zero latency: ours / peer's provisions/s (same run)",
        "peer",
        _peer_ratio(0.0),
        "",
        ".2f",
        (">=", 1.0),
    ),
    Figure(
        "peer, 100 ms per call: our seconds / peer's (same run)",
        "peer",
        _peer_ratio(100.0),
        "",
        ".2f",
        ("<=", 1.0),
    ),
    Figure(
        f"peer on our schedule (re-polls after {OUR_POLL_S:g} s), zero latency: "
        "ours / peer's provisions/s (same run)",
        "peer-same-schedule",
        _peer_ratio(0.0),
        "",
        ".2f",
        PEER_SAME_SCHEDULE_TARGETS[0.0],
    ),
    Figure(
        f"peer on our schedule (re-polls after {OUR_POLL_S:g} s), 100 ms per call: "
        "our seconds / peer's (same run)",
        "peer-same-schedule",
        _peer_ratio(100.0),
        "",
        ".2f",
        PEER_SAME_SCHEDULE_TARGETS[100.0],
    ),
    Figure(
        "stray 429s: seconds with them / without (same run)",
        "stray",
        lambda r: float(r["ratio"]),
        "",
        ".2f",
        ("<=", 1.3),
    ),
    Figure(
        "stray 429s, brands not ready (both runs)",
        "stray",
        _stray_not_ready,
        "",
        ".0f",
        ("<=", 0),
    ),
    Figure(
        "crowded parent: seconds / empty parent's (same run)",
        "rollout-crowded",
        lambda r: float(r["seconds_ratio"]),
        "",
        ".2f",
        ("<=", 1.5),
    ),
    Figure(
        "crowded parent: gateway bytes per brand",
        "rollout-crowded",
        lambda r: float(r["crowded"]["gateway_bytes_per_brand"]),
        "",
        ",.0f",
    ),
    Figure(
        "crowded parent, brands not ready (both runs)",
        "rollout-crowded",
        _crowded_not_ready,
        "",
        ".0f",
        ("<=", 0),
    ),
    Figure(
        "family read, largest family: worker CPU per read / 0-member read's",
        "family-read",
        lambda r: float(_largest_family(r)["client_cpu_x"]),
        "",
        ",.1f",
    ),
    Figure(
        "scale-out: seconds with 3 % stray 429s / without (same run)",
        "scaleout",
        lambda r: float(r["ratio"]),
        "",
        ".2f",
        ("<=", SCALEOUT_TARGET),
    ),
    Figure(
        "scale-out: brands not promoted, or made twice (both runs)",
        "scaleout",
        _scaleout_missed,
        "",
        ".0f",
        ("<=", 0),
    ),
)


# --------------------------------------------------------------------------- the region


def replace_region(text: str, region: str) -> str:
    """`text` with what lies between the markers replaced by `region` (markers kept)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise RegionError(
            f"the markers {BEGIN} and {END} must appear once each; found "
            f"{text.count(BEGIN)} and {text.count(END)}"
        )
    head, rest = text.split(BEGIN)
    if END not in rest:
        raise RegionError(f"the marker {END} comes before {BEGIN}")
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{region.strip()}\n{END}{tail}"


def write_figures(path: Path, runs: Sequence[Run], region: str) -> None:
    """Rewrite the region of `path`, only if every run succeeded and the markers hold."""
    failed = [run for run in runs if not run.ok]
    if not runs or failed:
        names = ", ".join(f"{run.bench} ({run.error or 'no result'})" for run in failed)
        raise BenchFailed(f"failed: {names}" if failed else "nothing was run")
    text = path.read_text()
    updated = replace_region(text, region)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(updated)
    temporary.replace(path)


def _n(value: float, fmt: str = ",.1f") -> str:
    return format(value, fmt)


def _verdicts(results: Sequence[dict[str, Any]], figure: Figure, judged: bool) -> str:
    if figure.target is None:
        return ""
    if not judged:
        return "not judged (quick)"
    passed = [figure.passes(r) for r in results]
    if all(passed):
        return "pass"
    return f"**FAIL** ({passed.count(False)} of {len(passed)})"


def render(machine: dict[str, str], runs: Sequence[Run], *, quick: bool) -> str:
    """The figures region (Markdown) for these runs."""
    by_bench: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run.result is not None:
            by_bench.setdefault(run.bench, []).append(run.result)
    lines = [
        "<!-- Written by `make bench` (bench/report.py): edit outside the markers only. -->",
        "",
    ]
    if quick:
        lines += [
            "**QUICK RUN: smoke-check sizes, a placeholder, not figures to compare.** The",
            "targets are set for the full sizes and are not judged here.",
            "",
        ]
    repeats = max((len(v) for v in by_bench.values()), default=0)
    lines += [
        f"Taken {machine['date']} at commit {machine['commit']}, "
        f"{'quick' if quick else 'full'} sizes, {repeats} run(s) of each"
        f"{_fewer(runs, repeats)}.",
        "",
        f"Machine: {machine['cores']} cores ({machine['cpu']}), {machine['ram']} RAM; "
        f"{machine['python']}; PostgreSQL {machine['postgresql']}; "
        f"RabbitMQ {machine['rabbitmq']}; {machine['libraries']}.",
        "",
        "| figure | measured | target | verdict |",
        "|---|---|---|---|",
    ]
    for figure in FIGURES:
        results = by_bench.get(figure.bench, [])
        if not results:
            continue
        shown = ", ".join(figure.show(r) for r in results)
        verdict = _verdicts(results, figure, judged=not quick)
        lines.append(f"| {figure.label} | {shown} | {figure.target_text()} | {verdict} |")
    lines += _engine_table(by_bench.get("engine", []))
    lines += _pipeline_table(
        [(r, b) for b in ("pipeline-0ms", "pipeline-100ms") for r in by_bench.get(b, [])]
    )
    lines += _readmodels_table(by_bench.get("readmodels", []))
    lines += _rollout_table(by_bench.get("rollout-metered", []))
    lines += _outage_table(by_bench.get("rollout-outage", []))
    lines += _peer_table(by_bench.get("peer", []))
    lines += _peer_same_schedule_table(by_bench.get("peer-same-schedule", []))
    lines += _stray_table(by_bench.get("stray", []))
    lines += _crowded_table(by_bench.get("rollout-crowded", []))
    lines += _family_table(by_bench.get("family-read", []))
    lines += _scaleout_table(by_bench.get("scaleout", []))
    lines += _load_table(runs)
    return "\n".join(lines) + "\n"


def _fewer(runs: Sequence[Run], repeats: int) -> str:
    """ ", the outage once": the benchmarks run fewer times than the others."""
    counts = {run.bench: 0 for run in runs}
    for run in runs:
        counts[run.bench] += 1
    fewer = [f"{name} {_times(n)}" for name, n in counts.items() if n < repeats]
    return f" ({', '.join(fewer)})" if fewer else ""


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def _engine_table(results: Sequence[dict[str, Any]]) -> list[str]:
    if not results:
        return []
    lines = [
        "",
        "Engine (`bench/engine.py`), attempts/s and CPU ms per attempt (client, fake, "
        "PostgreSQL); bare saves/s by one writer and by the same layout:",
        "",
        "| phase | attempts/s | saves/s | CPU ms per attempt | machine busy |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        cpu, busy = r["cpu_ms_per_attempt"], r["machine_cpu_busy"]
        lines.append(
            f"| engine, {r['attempts']:,} attempts | {_n(r['attempts_per_s'])} | "
            f"{_n(r['engine_saves_per_s'])} | {cpu['engine']:.2f}, {cpu['fake']:.2f}, "
            f"{cpu['postgres']:.2f} | {busy['engine']:.2f} |"
        )
        sk = r.get("skeleton")
        if sk:
            c = sk["cpu_ms_per_attempt"]
            lines.append(
                f"| skeleton (bare I/O) | {_n(sk['attempts_per_s'])} | {_n(sk['saves_per_s'])} "
                f"| {c['client']:.2f}, {c['fake']:.2f}, {c['postgres']:.2f} "
                f"| {sk['machine_cpu_busy']:.2f} |"
            )
        lines.append(
            f"| bare saves | | {_n(r['bare_saves_per_s_one_writer'])} one writer, "
            f"{_n(r['bare_saves_per_s_same_layout'])} same layout | "
            f"{r['cpu_ms_per_bare_save']['client']:.2f}, -, "
            f"{r['cpu_ms_per_bare_save']['postgres']:.2f} (per save) | "
            f"{busy['bare_same_layout']:.2f} |"
        )
    return lines


def _pipeline_table(results: Sequence[tuple[dict[str, Any], str]]) -> list[str]:
    if not results:
        return []
    lines = [
        "",
        "Pipeline (`bench/pipeline.py`), with the raw publish and bare save rates of the "
        "same run; CPU ms per provision of the workers (together), relay, fake, the "
        "benchmark's requests, PostgreSQL (this database) and RabbitMQ:",
        "",
        "| latency | brands | seconds | provisions/s | hop p50 / p99 / mean ms | slot busy "
        "| worker RSS MB | raw publish/s | bare saves/s | CPU ms per provision | other |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, _ in results:
        cpu = r["cpu_ms_per_provision"]
        parts = [
            _pipeline_workers_cpu(r),
            *(float(cpu.get(k, 0.0)) for k in ("relay", "fake", "bench", "postgres", "rabbitmq")),
        ]
        cpu_text = ", ".join(f"{p:.2f}" for p in parts) + f" = {sum(parts):.1f}"
        lines.append(
            f"| {r['latency_ms']:g} ms | {r['brands']:,} | {r['seconds']:.2f} | "
            f"{_n(r['provisions_per_s'])} | {r['hop_p50_ms']:.0f} / {r['hop_p99_ms']:.0f} / "
            f"{r['hop_mean_ms']:.0f} | {r['slot_busy']:.2f} | {r['worker_rss_mb']:.0f} | "
            f"{_n(r['raw_publish_per_s'], ',.0f')} | {_n(r['bare_saves_per_s'], ',.0f')} | "
            f"{cpu_text} | {r['other_share']:.2f} |"
        )
    return lines


def _readmodels_table(results: Sequence[dict[str, Any]]) -> list[str]:
    if not results:
        return []
    lines = [
        "",
        "Read models (`bench/readmodels.py`), events/s and ms:",
        "",
        "| events | seeding | raw scan / decoded scan | rebuild (brand_workspaces, attempts) "
        "| history p50 / p99 | attempt p50 / p99 | stuck median / worst |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        parts = ", ".join(f"{v['events']:,} in {v['seconds']:.1f} s" for v in r["rebuild"].values())
        lines.append(
            f"| {r['events']:,} | {r['seed_events_per_s']:,} | {r['scan_events_per_s']:,} / "
            f"{r['scan_decoded_events_per_s']:,} | {r['rebuild_events_per_s']:,} ({parts}) | "
            f"{r['history_p50_ms']:.2f} / {r['history_p99_ms']:.2f} | "
            f"{r['attempt_p50_ms']:.2f} / {r['attempt_p99_ms']:.2f} | "
            f"{r['stuck_median_ms']:.1f} / {r['stuck_ms']:.1f} |"
        )
    return lines


def _failures(r: dict[str, Any]) -> str:
    reasons = ", ".join(f"{n} {why}" for why, n in sorted(r["failed_reasons"].items()))
    left = r["brands"] - r["ready"] - r["failed"]
    text = f"{r['failed']}" + (f" ({reasons})" if reasons else "")
    return text + (f", {left} still pending" if left else "")


def _rollout_table(results: Sequence[dict[str, Any]]) -> list[str]:
    if not results:
        return []
    lines = [
        "",
        "Rollout at a metered gateway (`bench/rollout.py metered`): seconds from publishing to "
        "the last brand ready; calls per brand answered (with the 429s); floor = brands x calls "
        "per brand / rate; calls the fleet's pace held back (hop deferred) and deferred hops:",
        "",
        "| brands | gateway | fleet's rate | seconds | calls per brand | floor s "
        "| seconds / floor | 429s | held, deferred hops | failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for run in ("configured", "learned"):
            x = {"brands": r["brands"], **r[run]}
            pace = f"{r['rate_limit']:g}/s, burst 1" if run == "configured" else "learned"
            lines.append(
                f"| {r['brands']:,} | {r['rate_limit']:g}/s, burst {r['burst']} | {pace} | "
                f"{x['seconds']:.1f} | {x['calls_per_brand']:.2f} "
                f"({x['calls_per_brand_with_429']:.2f}) | {x['floor_s']:.1f} | "
                f"{x['seconds_over_floor']:.2f} | {100 * x['share_429']:.1f} % "
                f"| {x['held']:,.0f}, {x['hops']['deferred']:,.0f} | {_failures(x)} |"
            )
    return lines


def _outage_table(results: Sequence[dict[str, Any]]) -> list[str]:
    if not results:
        return []
    lines = [
        "",
        "Gateway outage (`bench/rollout.py outage`): calls that reached the gateway during it, "
        "before and after the circuit opened (allowed after: one per probe interval); seconds "
        "from the gateway's return to the last brand ready, for every brand, for the brands "
        "whose create the outage left unconfirmed (created twice) and for the others:",
        "",
        "| brands | outage | calls | before open / after (allowed) | circuit opened, closed "
        "| ready after: all / created twice (n) / once | failed |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        twice, once = r["recovery_s_created_twice"], r["recovery_s_created_once"]
        lines.append(
            f"| {r['brands']:,} | {r['outage_s']:g} s, {r['mode']} | {r['outage_calls']} | "
            f"{r['calls_before_open']} / {r['calls_after_open']} ({r['allowed_after_open']}) | "
            f"{r['circuit_opened_after_s']} s in, {r['circuit_closed_after_end_s']} s after | "
            f"{r['recovery_s']:.1f} / {'-' if twice is None else f'{twice:.1f}'} "
            f"({r['created_twice']}) / {'-' if once is None else f'{once:.1f}'} | {_failures(r)} |"
        )
    return lines


PEER_HEADING = (
    "Against a conventional peer (`bench/peer.py`): each side's seconds to the last brand "
    "bound, provisions/s, gateway calls a brand, CPU ms per provision of the workers and "
    "of all processes; then ours over the peer's:"
)


def _peer_table(
    results: Sequence[dict[str, Any]],
    heading: str = PEER_HEADING,
    targets: dict[float, str] | None = None,
) -> list[str]:
    """bench/peer.py's runs and ratios; `targets` (by latency) replaces the target that
    bench/peer.py printed beside a ratio."""
    if not results:
        return []
    targets = targets or {}
    lines = [
        "",
        heading,
        "",
        "| latency | side | brands | seconds | provisions/s | calls a brand "
        "| CPU ms: workers, all | other |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for x in r["runs"]:
            cpu = x.get("cpu_ms_per_provision", {})
            workers = sum(v for k, v in cpu.items() if k.startswith("worker"))
            lines.append(
                f"| {x['latency_ms']:g} ms | {x['side']} | {x['ready']:,} of {x['brands']:,} | "
                f"{x['seconds']:.2f} | {_n(x['provisions_per_s'])} | "
                f"{x.get('gateway_calls_per_brand', '-')} | {workers:.1f}, "
                f"{sum(cpu.values()):.1f} | {x.get('other_share', 0.0):.2f} |"
            )
        for x in r["ratios"]:
            target = targets.get(float(x["latency_ms"]), x["target"])
            lines.append(
                f"| {x['latency_ms']:g} ms | {x['ratio']} = **{x['value']:.2f}** "
                f"(target {target}) | | | | | | |"
            )
    return lines


def _peer_same_schedule_table(results: Sequence[dict[str, Any]]) -> list[str]:
    """The peer table of `peer-same-schedule`, headed by the peer's re-poll (as recorded,
    else as asked for) and judged by the proposed targets, not bench/peer.py's 1.0."""
    polls = sorted({float(r.get("peer_poll_s", OUR_POLL_S)) for r in results})
    heading = (
        "Against the same peer on our schedule (`bench/peer.py --peer-poll-s "
        f"{OUR_POLL_S:g}`): the peer re-polls a workspace after "
        f"{' and '.join(f'{p:g}' for p in polls)} s, doubling, as ours waits {OUR_POLL_S:g} s, "
        "doubling (`PROVISIONER_BACKOFF_BASE_S`); each side's seconds to the last brand "
        "bound, provisions/s, gateway calls a brand, CPU ms per provision of the workers and "
        "of all processes; then ours over the peer's, against the proposed targets:"
    )
    targets = {
        latency: f"{op} {threshold:g}, proposed"
        for latency, (op, threshold) in PEER_SAME_SCHEDULE_TARGETS.items()
    }
    return _peer_table(results, heading, targets)


def _stray_table(results: Sequence[dict[str, Any]]) -> list[str]:
    if not results:
        return []
    lines = [
        "",
        "Stray 429s (`bench/stray.py`): the same rollout without them, then with a share of "
        "GETs answered 429 at random; seconds to the last brand ready, calls answered 429, "
        "whether the fleet's pace ever held, deferred hops:",
        "",
        "| brands | share | without: s | with: s | with / without | 429s (share of calls) "
        "| fleet held | deferred hops | failed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        clean, stray = r["without"], r["with"]
        failed = [_failures({"brands": r["brands"], **x}) for x in (clean, stray)]
        lines.append(
            f"| {r['brands']:,} | {100 * r['share']:g} % | {clean['seconds']:.2f} | "
            f"{stray['seconds']:.2f} | {r['ratio']:.2f} | {stray['answered_429']} "
            f"({100 * stray['share_429']:.2f} %) | {'yes' if stray['fleet_held'] else 'never'} | "
            f"{stray['hops_deferred']:,.0f} | {', '.join(failed)} |"
        )
    return lines


def _crowded_table(results: Sequence[dict[str, Any]]) -> list[str]:
    if not results:
        return []
    lines = [
        "",
        "A rollout into a crowded parent (`bench/rollout.py crowded`): every brand under one "
        "parent, empty, then holding other children; seconds to the last brand ready, family "
        "reads and gateway bytes per brand, the fake's and the workers' CPU seconds:",
        "",
        "| brands | other children | empty: s | crowded: s | crowded / empty "
        "| family reads per brand | gateway bytes per brand | fake, workers CPU s | failed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        empty, crowded = r["empty"], r["crowded"]
        failed = [_failures({"brands": r["brands"], **x}) for x in (empty, crowded)]
        lines.append(
            f"| {r['brands']:,} | {r['others']:,} | {empty['seconds']:.1f} | "
            f"{crowded['seconds']:.1f} | {r['seconds_ratio']:.2f} | "
            f"{empty['family_calls_per_brand']}, {crowded['family_calls_per_brand']} | "
            f"{empty['gateway_bytes_per_brand']:,}; {crowded['gateway_bytes_per_brand']:,} | "
            f"{empty['fake_cpu_s']:.1f} → {crowded['fake_cpu_s']:.1f}; "
            f"{empty['workers_cpu_s']:.1f} → {crowded['workers_cpu_s']:.1f} | "
            f"{', '.join(failed)} |"
        )
    return lines


def _family_table(results: Sequence[dict[str, Any]]) -> list[str]:
    if not results:
        return []
    lines = [
        "",
        "A hop's family read by the family's size (`bench/family_read.py`), each beside the "
        "0-member read of the same run (x); the worker's peak memory during one read, and in "
        "brackets that of reading the body whole:",
        "",
        "| members | bytes | wall p50 ms (x) | worker CPU ms per read (x) "
        "| fake CPU ms per read (x) | worker peak KiB (body whole) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        for x in r["sizes"]:
            lines.append(
                f"| {x['members']:,} | {x['bytes']:,} | {x['wall_p50_ms']:.1f} "
                f"({x['wall_p50_x']:.1f}) | {x['client_cpu_ms']:.2f} ({x['client_cpu_x']:.1f}) | "
                f"{x['fake_cpu_ms']:.1f} ({x['fake_cpu_x']:.1f}) | {x['peak_kib']:,.0f} "
                f"({x['whole_peak_kib']:,.0f}) |"
            )
    return lines


def _promoted(x: dict[str, Any]) -> str:
    """Processes that exited 0, and how many exited otherwise, by exit status."""
    others = ", ".join(
        f"{n} exit {code}" for code, n in sorted(x["exit_codes"].items()) if code != "0"
    )
    return f"{x['promoted']:,}" + (f" ({others})" if others else "")


def _both(r: dict[str, Any], show: Callable[[dict[str, Any]], str]) -> str:
    """A scale-out figure of the run without the 429s / of the run with them."""
    return f"{show(r['without'])} / {show(r['with'])}"


def _scaleout_table(results: Sequence[dict[str, Any]]) -> list[str]:
    if not results:
        return []
    lines = [
        "",
        "Scaled out (`bench/scaleout.py`): every brand's own `provisioner provision --wait`, "
        "all started at once, against the layout below, a share of creates lost after being "
        "made; without stray 429s, then with them. Seconds from the first process started to "
        "the last one exited; then, each without / with: processes that exited 0 (promoted), "
        "workspaces the gateway holds, creates lost, calls answered 429 (the share of the "
        "calls with them), whether the fleet's pace held, the highest hop an attempt reached:",
        "",
        "| brands | layout | without: s | with: s | with / without | promoted "
        "| workspaces made | lost creates | 429s | fleet held | highest hop |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        stray = r["with"]
        share = stray["answered_429"] / max(stray["calls_total"], 1)
        lines.append(
            f"| {r['brands']:,} | {r['layout']}; {100 * r['lost']:g} % of creates lost, "
            f"{100 * r['share']:g} % stray 429s | {r['without']['seconds']:.1f} | "
            f"{stray['seconds']:.1f} | {r['ratio']:.2f} | {_both(r, _promoted)} | "
            f"{_both(r, lambda x: format(x['workspaces_made'], ','))} | "
            f"{_both(r, lambda x: str(x['lost_creates']))} | "
            f"{_both(r, lambda x: str(x['answered_429']))} ({100 * share:.2f} %) | "
            f"{_both(r, lambda x: 'yes' if x['fleet_held'] else 'never')} | "
            f"{_both(r, lambda x: str(x['highest_hop']))} |"
        )
    return lines


def _load_table(runs: Sequence[Run]) -> list[str]:
    lines = [
        "",
        "Commands and the load during each run: wall seconds, load average before → after, "
        "CPU seconds of the benchmark's process tree (with its fake, workers and relay), of "
        "the whole PostgreSQL server and of RabbitMQ, and the machine's CPU used by anything "
        "else, as a share of all cores:",
        "",
        "| command | seconds | load avg | CPU s: benchmark, PostgreSQL, RabbitMQ | other |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        load = run.load
        failed = "" if run.ok else f" **FAILED: {run.error}**"
        lines.append(
            f"| `{' '.join(run.command)}`{failed} | {run.seconds:.0f} | "
            f"{load.get('load_before', 0.0):.1f} → {load.get('load_after', 0.0):.1f} | "
            f"{load.get('tree_s', 0.0):.1f}, {load.get('postgres_s', 0.0):.1f}, "
            f"{load.get('rabbitmq_s', 0.0):.1f} | {load.get('other_share', 0.0):.2f} |"
        )
    return lines


# --------------------------------------------------------------------------- reading the machine


def _stat_fields(pid: str) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def server_cpu_s(comm: str) -> float:
    """CPU seconds of every live process named `comm`, plus what their parents of the
    same name reaped (PostgreSQL's postmaster collects its ended backends' CPU)."""
    total = 0.0
    procs: dict[str, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() == comm:
                procs[entry.name] = _stat_fields(entry.name)
        except OSError:
            continue
    for fields in procs.values():
        total += int(fields[11]) + int(fields[12])
        if fields[1] not in procs:  # the top of the tree: add what it reaped
            total += int(fields[13]) + int(fields[14])
    return total / CLK_TCK


def machine_busy_s() -> float:
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _load_sample() -> dict[str, float]:
    return {
        "tree_s": _children_cpu_s(),
        "postgres_s": server_cpu_s("postgres"),
        "rabbitmq_s": server_cpu_s("beam.smp"),
        "busy_s": machine_busy_s(),
    }


def run_bench(bench: Bench, quick: bool, python: str) -> Run:
    """Run one benchmark as a subprocess: its JSON result and the load around it."""
    argv = bench.argv(quick)
    command = [python, *argv]
    shown = [_shown_python(python), *argv]
    print(f"== {bench.name}: {' '.join(shown)}", file=sys.stderr, flush=True)
    before, load_before = _load_sample(), os.getloadavg()[0]
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        output, code = done.stdout, done.returncode
    except subprocess.TimeoutExpired:
        output, code = "", -1
    seconds = time.perf_counter() - started
    after = _load_sample()
    used = {k: after[k] - before[k] for k in before}
    cores = os.cpu_count() or 1
    outside = used["busy_s"] - used["tree_s"] - used["postgres_s"] - used["rabbitmq_s"]
    load = {
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        **used,
        "other_share": max(0.0, outside) / (seconds * cores),
    }
    result, error = None, ""
    if code == -1:
        error = f"timed out after {TIMEOUT_S:g} s"
    elif code != 0:
        error = f"exit status {code}"
    else:
        result = last_json(output)
        if result is None:
            error = "no JSON result on its output"
    if error:
        print(f"== {bench.name} FAILED: {error}", file=sys.stderr, flush=True)
    return Run(bench.name, shown, result, error, seconds, load)


def last_json(output: str) -> dict[str, Any] | None:
    """The last line of `output` that is a JSON object, if any."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def _shown_python(python: str) -> str:
    path = Path(python)
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return python


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=30
    )
    return done.stdout.strip()


def commit_text() -> str:
    """The short commit, and "dirty" when the tree differs (this document aside)."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    changed = [
        line
        for line in _git("status", "--porcelain").splitlines()
        if line[3:].strip() != str(DOC.relative_to(ROOT))
    ]
    return f"{commit} (dirty: {len(changed)} changed files)" if changed else commit


def machine_facts() -> dict[str, str]:
    meminfo = Path("/proc/meminfo").read_text()
    ram_kb = next(
        (int(ln.split()[1]) for ln in meminfo.splitlines() if ln.startswith("MemTotal")), 0
    )
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor() or "unknown CPU",
    )
    libraries = ", ".join(
        f"{name} {_version(name)}" for name in ("eventsourcing", "psycopg", "kombu", "httpx")
    )
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit_text(),
        "cores": str(os.cpu_count() or 1),
        "cpu": cpu,
        "ram": f"{ram_kb / 1024 / 1024:.1f} GiB",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "postgresql": _postgres_version(),
        "rabbitmq": _rabbitmq_version(),
        "libraries": libraries,
    }


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


def _postgres_version() -> str:
    import psycopg  # noqa: PLC0415 - only the driver's run needs a server

    url = os.environ.get("PROVISIONER_DATABASE_URL", "postgresql://root@127.0.0.1:5432/postgres")
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except psycopg.Error as exc:
        return f"unknown ({type(exc).__name__})"
    return str(row[0]) if row else "unknown"


def _rabbitmq_version() -> str:
    from kombu.connection import Connection  # noqa: PLC0415 - only the driver's run needs it

    url = os.environ.get("PROVISIONER_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
    try:
        with Connection(url, connect_timeout=5) as conn:  # type: ignore[no-untyped-call]
            conn.connect()
            version = conn.connection.server_properties.get("version", "unknown")
    except Exception as exc:  # any failure to reach the broker leaves the version unknown
        return f"unknown ({type(exc).__name__})"
    return version.decode() if isinstance(version, bytes) else str(version)


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke check")
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="runs of each benchmark (one varies by 10 %% here): 2, or 1 with --quick",
    )
    parser.add_argument("--no-write", action="store_true", help="print the region only")
    parser.add_argument(
        "--only",
        default="",
        help=f"comma-separated subset of {', '.join(b.name for b in BENCHES)} (implies --no-write)",
    )
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 2
    chosen = [b for b in BENCHES if not args.only or b.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {b.name for b in BENCHES}
    if unknown or not chosen or args.repeat < 1:
        parser.error(f"nothing to run (unknown: {', '.join(sorted(unknown)) or '-'})")
    machine = machine_facts()
    runs = [
        run_bench(b, args.quick, sys.executable)
        for n in range(args.repeat)
        for b in chosen
        if n < b.runs(args.repeat)
    ]
    runs.sort(key=lambda run: [b.name for b in BENCHES].index(run.bench))
    region = render(machine, runs, quick=args.quick)
    print(region)
    failed = [run for run in runs if not run.ok]
    if args.no_write or args.only:
        print("(not written: --no-write or --only)", file=sys.stderr)
        return 1 if failed else 0
    try:
        write_figures(DOC, runs, region)
    except (BenchFailed, RegionError) as exc:
        print(f"docs/benchmarks.md NOT written: {exc}", file=sys.stderr)
        return 1
    print(f"wrote the figures region of {DOC.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
