"""`make bench`'s driver rewrites only its region of docs/benchmarks.md, and only after
every benchmark succeeded (bench/report.py). No benchmark is run here."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.report import (
    BEGIN,
    BENCHES,
    DOC,
    END,
    METERED_TARGETS,
    SCALEOUT_TARGET,
    Bench,
    BenchFailed,
    RegionError,
    Run,
    last_json,
    render,
    replace_region,
    script_constant,
    write_figures,
)

HEAD = "# Benchmarks\n\nText before, with `code` and a table:\n\n| a | b |\n|---|---|\n\n"
TAIL = "\n\n## Engine\n\nText after.\n<!-- another comment -->\n"
DOCUMENT = f"{HEAD}{BEGIN}\nold figures\nmore old figures\n{END}{TAIL}"

MACHINE = {
    "date": "2026-11-30 17:00 UTC",
    "commit": "abc1234",
    "cores": "2",
    "cpu": "AMD EPYC",
    "ram": "23.5 GiB",
    "python": "CPython 3.11.7",
    "postgresql": "15.20",
    "rabbitmq": "3.10.8",
    "libraries": "eventsourcing 9.5.6",
}

# Results in the shape each benchmark's --json prints (figures from real runs).
ENGINE: dict[str, Any] = {
    "attempts": 2000,
    "attempts_per_s": 400.0,
    "engine_saves_per_s": 1200.0,
    "transactions_per_attempt": 3.0,
    "ratio": 0.3,
    "bare_saves_per_s_one_writer": 2900.0,
    "bare_saves_per_s_same_layout": 4000.0,
    "cpu_ms_per_attempt": {"engine": 2.8, "fake": 0.5, "postgres": 1.0},
    "cpu_ms_per_bare_save": {"client": 0.17, "postgres": 0.12},
    "machine_cpu_busy": {"engine": 0.9, "bare_one_writer": 0.6, "bare_same_layout": 0.8},
    "skeleton": {
        "attempts_per_s": 480.0,
        "saves_per_s": 1440.0,
        "cpu_ms_per_attempt": {"client": 2.4, "fake": 0.5, "postgres": 1.1},
        "machine_cpu_busy": 0.9,
    },
}
PIPELINE: dict[str, Any] = {
    "brands": 1000,
    "latency_ms": 0.0,
    "seconds": 3.5,
    "provisions_per_s": 285.7,
    "hop_p50_ms": 80.0,
    "hop_p99_ms": 250.0,
    "hop_mean_ms": 90.0,
    "slot_busy": 0.7,
    "worker_rss_mb": 59.0,
    "raw_publish_per_s": 2500.0,
    "bare_saves_per_s": 2400.0,
    "cpu_ms_per_provision": {
        "relay": 0.3,
        "fake": 0.6,
        "worker0": 1.7,
        "worker1": 1.6,
        "bench": 0.5,
        "postgres": 0.9,
        "rabbitmq": 0.4,
    },
    "other_share": 0.03,
}
SLOW_PIPELINE = {**PIPELINE, "latency_ms": 100.0, "seconds": 10.1, "provisions_per_s": 99.0}
READMODELS: dict[str, Any] = {
    "events": 998563,
    "seed_events_per_s": 12573,
    "scan_events_per_s": 106093,
    "scan_decoded_events_per_s": 55196,
    "rebuild_events_per_s": 25161,
    "rebuild": {
        "brand_workspaces": {"events": 425710, "seconds": 17.4},
        "attempts": {"events": 714280, "seconds": 27.9},
    },
    "rebuild_vs_scan": 0.237,
    "history_p50_ms": 1.74,
    "history_p99_ms": 2.88,
    "attempt_p50_ms": 0.52,
    "attempt_p99_ms": 0.94,
    "stuck_ms": 3.3,
    "stuck_median_ms": 1.8,
}


# The metered runs sit within bench/rollout.py's TARGETS: configured at most 1.05 x the
# floor with no 429, learned at most 1.15 x with at most 5 % answered 429.
METERED_RUN: dict[str, Any] = {
    "seconds": 62.4,
    "publish_s": 1.3,
    "ready": 300,
    "pending": 0,
    "failed": 0,
    "failed_reasons": {},
    "calls_total": 1200,
    "throttled": 0,
    "calls_per_brand": 4.0,
    "calls_per_brand_with_429": 4.0,
    "floor_s": 60.0,
    "seconds_over_floor": 1.04,
    "share_429": 0.0,
    "held": 0.0,
    "hops": {"promoted": 300.0, "scheduled": 300.0, "deferred": 0.0, "failed": 0.0},
}
METERED: dict[str, Any] = {
    "brands": 300,
    "rate_limit": 20.0,
    "burst": 5,
    "configured": METERED_RUN,
    "learned": {
        **METERED_RUN,
        "seconds": 67.8,
        "throttled": 51,
        "calls_total": 1251,
        "calls_per_brand_with_429": 4.17,
        "seconds_over_floor": 1.13,
        "share_429": 0.041,
        "held": 120.0,
    },
}
OUTAGE: dict[str, Any] = {
    "brands": 200,
    "mode": "503",
    "outage_s": 600.0,
    "outage_calls": 92,
    "circuit_opened_after_s": 0.1,
    "calls_before_open": 32,
    "calls_after_open": 60,
    "allowed_after_open": 60,
    "circuit_closed_after_end_s": 0.5,
    "recovery_s": 41.9,
    "created_twice": 0,
    "recovery_s_created_twice": None,
    "recovery_s_created_once": 41.9,
    "ready": 200,
    "failed": 0,
    "failed_reasons": {},
}


SCALEOUT_RUN: dict[str, Any] = {
    "spawned_s": 50.36,
    "seconds": 230.09,
    "exit_codes": {"0": 300},
    "promoted": 300,
    "not_promoted": [],
    "ready": 300,
    "failed": 0,
    "failed_reasons": {},
    "workspaces_made": 300,
    "lost_creates": 5,
    "calls_total": 1651,
    "answered_429": 0,
    "fleet_held": False,
    "rate_learned": False,
    "highest_hop": 2,
}
SCALEOUT: dict[str, Any] = {
    "brands": 300,
    "share": 0.03,
    "lost": 0.02,
    "layout": "3 x 8, 2 relays, 2 reconcilers",
    "without": SCALEOUT_RUN,
    "with": {
        **SCALEOUT_RUN,
        "spawned_s": 42.79,
        "seconds": 184.08,
        "lost_creates": 4,
        "calls_total": 1699,
        "answered_429": 44,
        "highest_hop": 4,
    },
    "ratio": 0.8,
    "target": 1.2,
    "passed": True,
    "load": 211.0,
}


def runs(**results: dict[str, Any] | None) -> list[Run]:
    """One run per benchmark; pass a benchmark's name (with _ for -) to replace its result."""
    chosen = {
        "engine": ENGINE,
        "pipeline-0ms": PIPELINE,
        "pipeline-100ms": SLOW_PIPELINE,
        "readmodels": READMODELS,
        "rollout-metered": METERED,
        "rollout-outage": OUTAGE,
    }
    chosen |= {name.replace("_", "-"): result for name, result in results.items()}
    return [
        Run(name, ["python", f"bench/{name}.py"], copy.deepcopy(result), "" if result else "boom")
        for name, result in chosen.items()
    ]


# --------------------------------------------------------------------------- the region


def test_the_region_is_replaced_and_the_text_around_it_kept_byte_for_byte() -> None:
    updated = replace_region(DOCUMENT, "new figures\n| x | y |")
    assert updated == f"{HEAD}{BEGIN}\nnew figures\n| x | y |\n{END}{TAIL}"
    assert "old figures" not in updated


def test_rewriting_twice_gives_the_same_document() -> None:
    once = replace_region(DOCUMENT, "figures")
    assert replace_region(once, "figures") == once
    assert replace_region(replace_region(once, "other"), "figures") == once


@pytest.mark.parametrize(
    "document",
    [
        pytest.param(f"{HEAD}old figures\n{END}{TAIL}", id="no begin marker"),
        pytest.param(f"{HEAD}{BEGIN}\nold figures\n{TAIL}", id="no end marker"),
        pytest.param(f"{HEAD}{TAIL}", id="no markers"),
        pytest.param(f"{HEAD}{END}\nold\n{BEGIN}{TAIL}", id="end before begin"),
        pytest.param(f"{DOCUMENT}{BEGIN}\nx\n{END}\n", id="two regions"),
        pytest.param(f"{HEAD}{BEGIN}\n{BEGIN}\nx\n{END}{TAIL}", id="begin twice"),
    ],
)
def test_a_document_without_one_ordered_pair_of_markers_is_refused(document: str) -> None:
    with pytest.raises(RegionError):
        replace_region(document, "new figures")


def test_docs_benchmarks_md_has_its_region() -> None:
    text = DOC.read_text()
    before, after = text.split(BEGIN)[0], text.split(END)[1]
    assert replace_region(text, "x") == f"{before}{BEGIN}\nx\n{END}{after}"


# --------------------------------------------------------------------------- writing


def test_figures_are_written_into_the_region_only(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(DOCUMENT)
    all_runs = runs()
    write_figures(doc, all_runs, render(MACHINE, all_runs, quick=False))
    text = doc.read_text()
    assert text.startswith(f"{HEAD}{BEGIN}\n")
    assert text.endswith(f"\n{END}{TAIL}")
    assert "old figures" not in text
    assert "abc1234" in text
    assert list(tmp_path.iterdir()) == [doc]  # no temporary file left behind


@pytest.mark.parametrize(
    "failed",
    [
        "engine",
        "pipeline_0ms",
        "pipeline_100ms",
        "readmodels",
        "rollout_metered",
        "rollout_outage",
        "scaleout",
    ],
)
def test_nothing_is_written_when_a_benchmark_failed(tmp_path: Path, failed: str) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(DOCUMENT)
    all_runs = runs(**{failed: None})
    with pytest.raises(BenchFailed, match=failed.replace("_", "-")):
        write_figures(doc, all_runs, render(MACHINE, all_runs, quick=False))
    assert doc.read_text() == DOCUMENT


def test_nothing_is_written_when_nothing_ran(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(DOCUMENT)
    with pytest.raises(BenchFailed):
        write_figures(doc, [], render(MACHINE, [], quick=False))
    assert doc.read_text() == DOCUMENT


def test_nothing_is_written_when_the_markers_are_missing(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"{HEAD}{TAIL}")
    all_runs = runs()
    with pytest.raises(RegionError):
        write_figures(doc, all_runs, render(MACHINE, all_runs, quick=False))
    assert doc.read_text() == f"{HEAD}{TAIL}"


# --------------------------------------------------------------------------- what the region says


def figure_row(region: str, label: str) -> str:
    rows = [line for line in region.splitlines() if line.startswith(f"| {label}")]
    assert len(rows) == 1, rows
    return rows[0]


def test_each_target_is_judged_against_its_figure() -> None:
    region = render(MACHINE, runs(), quick=False)
    assert figure_row(region, "pipeline, zero latency: provisions/s").endswith(
        "| 285.7 | ≥ 150 | pass |"
    )
    assert figure_row(region, "engine / skeleton").endswith("| 0.83 | ≥ 0.8 | pass |")
    assert figure_row(region, "engine / best bare").endswith("|  |")  # no target, no verdict
    assert "FAIL" not in region
    assert "QUICK" not in region


def test_a_missed_target_is_written_as_a_failure() -> None:
    slow = {**SLOW_PIPELINE, "seconds": 11.4}
    slow_engine = {**ENGINE, "attempts_per_s": 370.0}
    region = render(MACHINE, runs(pipeline_100ms=slow, engine=slow_engine), quick=False)
    assert figure_row(region, "pipeline, 100 ms").endswith("| 11.40 | ≤ 11 s | **FAIL** (1 of 1) |")
    assert figure_row(region, "engine / skeleton").endswith("| 0.77 | ≥ 0.8 | **FAIL** (1 of 1) |")


def test_repeated_runs_are_all_shown_and_judged() -> None:
    twice = [*runs(), Run("pipeline-0ms", ["python"], {**PIPELINE, "provisions_per_s": 140.0})]
    row = figure_row(render(MACHINE, twice, quick=False), "pipeline, zero latency: provisions/s")
    assert row.endswith("| 285.7, 140.0 | ≥ 150 | **FAIL** (1 of 2) |")


def test_a_quick_run_says_so_and_judges_nothing() -> None:
    region = render(MACHINE, runs(), quick=True)
    assert region.startswith("<!--")
    assert "QUICK RUN" in region
    assert "| pass |" not in region
    assert "not judged (quick)" in region


def test_the_region_names_the_machine_the_commit_and_each_command() -> None:
    all_runs = runs()
    all_runs[0].load = {"load_before": 0.4, "load_after": 3.2, "other_share": 0.05}
    region = render(MACHINE, all_runs, quick=False)
    for fact in MACHINE.values():
        assert fact in region
    for run in all_runs:
        assert f"`{' '.join(run.command)}`" in region
    assert "0.4 → 3.2" in region
    assert "CPU ms per provision" in region
    # workers together, relay, fake, bench, PostgreSQL, RabbitMQ = total
    assert "3.30, 0.30, 0.60, 0.50, 0.90, 0.40 = 6.0" in region


def test_the_last_json_object_of_a_benchmarks_output_is_its_result() -> None:
    output = 'seeding ...\n{"partial": \n{"a": 1}\nnot json\n{"b": 2}\ntrailing text\n'
    assert last_json(output) == {"b": 2}
    assert last_json("no result\n[1, 2]\n") is None


def test_the_rollout_targets_are_judged_run_by_run() -> None:
    region = render(MACHINE, runs(), quick=False)
    assert figure_row(region, "rollout, rate configured: seconds").endswith(
        "| 1.04 | ≤ 1.05 | pass |"
    )
    assert figure_row(region, "rollout, rate configured: calls answered 429").endswith(
        "| 0.00 | ≤ 0 % | pass |"
    )
    assert figure_row(region, "rollout, rate learned: seconds").endswith("| 1.13 | ≤ 1.15 | pass |")
    assert figure_row(region, "rollout, rate learned: calls answered 429").endswith(
        "| 4.1 | ≤ 5 % | pass |"
    )
    assert figure_row(region, "outage, calls after the circuit opened").endswith(
        "| 1.00 | ≤ 1 | pass |"
    )
    assert "| 300 | 20/s, burst 5 | learned | 67.8 | 4.00 (4.17) | 60.0 | 1.13 | 4.1 % |" in region
    assert "| 200 | 600 s, 503 | 92 | 32 / 60 (60) |" in region


def test_the_metered_targets_are_the_benchmarks_own() -> None:
    """report.py judges by bench/rollout.py's TARGETS, read from its source: one place."""
    assert script_constant("bench/rollout.py", "TARGETS") == {
        "configured": (1.05, 0.0),
        "learned": (1.15, 0.05),
    }
    assert METERED_TARGETS == {"configured": (1.05, 0.0), "learned": (1.15, 0.05)}
    assert script_constant("bench/scaleout.py", "TARGET") == SCALEOUT_TARGET == 1.2
    with pytest.raises(LookupError):
        script_constant("bench/rollout.py", "NO_SUCH_TARGET")


def test_a_metered_rollout_past_the_new_targets_is_written_as_a_failure() -> None:
    """The old targets' passes (1.15 x and 2 % configured, 1.5 x and 10 % learned) now fail."""
    metered = copy.deepcopy(METERED)
    metered["configured"] |= {"seconds_over_floor": 1.06, "share_429": 0.001}
    metered["learned"] |= {"seconds_over_floor": 1.34, "share_429": 0.074}
    region = render(MACHINE, runs(rollout_metered=metered), quick=False)
    assert figure_row(region, "rollout, rate configured: seconds").endswith(
        "| 1.06 | ≤ 1.05 | **FAIL** (1 of 1) |"
    )
    assert figure_row(region, "rollout, rate configured: calls answered 429").endswith(
        "| 0.10 | ≤ 0 % | **FAIL** (1 of 1) |"
    )
    assert figure_row(region, "rollout, rate learned: seconds").endswith(
        "| 1.34 | ≤ 1.15 | **FAIL** (1 of 1) |"
    )
    assert figure_row(region, "rollout, rate learned: calls answered 429").endswith(
        "| 7.4 | ≤ 5 % | **FAIL** (1 of 1) |"
    )


def test_a_metered_rollout_at_its_targets_passes() -> None:
    """At the targets exactly, as bench/rollout.py judges (`<=`): 100 x 0.05 is 5 here."""
    metered = copy.deepcopy(METERED)
    metered["configured"] |= {"seconds_over_floor": 1.05, "share_429": 0.0}
    metered["learned"] |= {"seconds_over_floor": 1.15, "share_429": 0.05}
    region = render(MACHINE, runs(rollout_metered=metered), quick=False)
    assert figure_row(region, "rollout, rate learned: calls answered 429").endswith(
        "| 5.0 | ≤ 5 % | pass |"
    )
    assert "FAIL" not in region


def test_an_outage_that_failed_brands_or_leaked_calls_is_written_as_a_failure() -> None:
    leaky = {
        **OUTAGE,
        "calls_after_open": 75,
        "ready": 197,
        "failed": 3,
        "failed_reasons": {"exhausted": 3},
        "recovery_s": 161.3,
        "created_twice": 5,
        "recovery_s_created_twice": 161.3,
    }
    region = render(MACHINE, runs(rollout_outage=leaky), quick=False)
    assert figure_row(region, "outage, calls after").endswith("| 1.25 | ≤ 1 | **FAIL** (1 of 1) |")
    assert figure_row(region, "outage, seconds from").endswith(
        "| 161.3 | ≤ 60 s | **FAIL** (1 of 1) |"
    )
    assert figure_row(region, "outage, brands not ready").endswith(
        "| 3 | ≤ 0 | **FAIL** (1 of 1) |"
    )
    assert "| 161.3 / 161.3 (5) / 41.9 | 3 (3 exhausted) |" in region
    never_opened = {**OUTAGE, "calls_after_open": None}
    region = render(MACHINE, runs(rollout_outage=never_opened), quick=False)
    assert figure_row(region, "outage, calls after").endswith("| inf | ≤ 1 | **FAIL** (1 of 1) |")


def test_the_outage_runs_once_whatever_the_repeat() -> None:
    by_name = {bench.name: bench for bench in BENCHES}
    assert by_name["rollout-outage"].runs(2) == 1
    assert by_name["rollout-metered"].runs(2) == 2
    twice = [*runs(), *runs()[:-1]]  # every benchmark twice but the outage
    region = render(MACHINE, twice, quick=False)
    assert "2 run(s) of each (rollout-outage once)." in region


# --------------------------------------------------------------------------- the scale-out


def test_the_scaleout_figures_pass_and_its_table_is_written() -> None:
    region = render(MACHINE, runs(scaleout=SCALEOUT), quick=False)
    assert figure_row(region, "scale-out: seconds with 3 % stray 429s / without").endswith(
        "| 0.80 | ≤ 1.2 | pass |"
    )
    assert figure_row(region, "scale-out: brands not promoted, or made twice").endswith(
        "| 0 | ≤ 0 | pass |"
    )
    assert "FAIL" not in region
    assert "Scaled out (`bench/scaleout.py`)" in region
    assert (
        "| brands | layout | without: s | with: s | with / without | promoted "
        "| workspaces made | lost creates | 429s | fleet held | highest hop |"
    ) in region
    assert (
        "| 300 | 3 x 8, 2 relays, 2 reconcilers; 2 % of creates lost, 3 % stray 429s "
        "| 230.1 | 184.1 | 0.80 | 300 / 300 | 300 / 300 | 5 / 4 | 0 / 44 (2.59 %) "
        "| never / never | 2 / 4 |"
    ) in region


def test_a_scaleout_result_is_read_as_printed() -> None:
    """The line a real bench/scaleout.py --json run printed, through last_json, judged."""
    run = (
        '"spawned_s": {}, "seconds": {}, "exit_codes": {{"0": 300}}, "promoted": 300, '
        '"not_promoted": [], "ready": 300, "failed": 0, "failed_reasons": {{}}, '
        '"workspaces_made": 300, "lost_creates": {}, "calls_total": {}, "answered_429": {}, '
        '"fleet_held": false, "rate_learned": false, "highest_hop": {}'
    )
    line = (
        '{"brands": 300, "share": 0.03, "lost": 0.02, "layout": "3 x 8, 2 relays, 2 reconcilers", '
        f'"without": {{{run.format(50.36, 230.09, 5, 1651, 0, 2)}}}, '
        f'"with": {{{run.format(42.79, 184.08, 4, 1699, 44, 4)}}}, '
        '"ratio": 0.8, "target": 1.2, "passed": true, "load": 211.0}'
    )
    result = last_json(f"[rollout] without: 300/300 promoted in 230.1 s\n{line}\n")
    assert result == SCALEOUT
    region = render(
        MACHINE, [Run("scaleout", ["python", "bench/scaleout.py"], result)], quick=False
    )
    assert figure_row(region, "scale-out: seconds").endswith("| pass |")


def test_a_slow_scaleout_with_brands_unpromoted_or_made_twice_fails() -> None:
    bad = copy.deepcopy(SCALEOUT)
    bad["ratio"] = 1.31
    bad["with"] |= {
        "seconds": 301.4,
        "exit_codes": {"0": 297, "1": 2, "124": 1},
        "promoted": 297,
        "not_promoted": ["b-0007", "b-0131", "b-0250"],
        "workspaces_made": 302,  # two made twice
        "fleet_held": True,
    }
    region = render(MACHINE, runs(scaleout=bad), quick=False)
    assert figure_row(region, "scale-out: seconds with").endswith(
        "| 1.31 | ≤ 1.2 | **FAIL** (1 of 1) |"
    )
    # 3 not promoted and 2 made twice, in the run with the 429s
    assert figure_row(region, "scale-out: brands not promoted").endswith(
        "| 5 | ≤ 0 | **FAIL** (1 of 1) |"
    )
    assert "| 300 / 297 (2 exit 1, 1 exit 124) | 300 / 302 |" in region
    assert "| never / yes |" in region


@pytest.mark.parametrize(
    ("run", "changed", "missed"),
    [
        pytest.param("without", {"promoted": 299, "exit_codes": {"0": 299, "1": 1}}, 1, id="one"),
        pytest.param("with", {"workspaces_made": 301}, 1, id="made twice"),
        pytest.param("with", {"workspaces_made": 299, "promoted": 299}, 1, id="never made"),
        pytest.param("without", {"promoted": 0, "exit_codes": {"1": 300}}, 300, id="none"),
    ],
)
def test_each_brand_not_promoted_or_made_twice_counts_once(
    run: str, changed: dict[str, Any], missed: int
) -> None:
    bad = copy.deepcopy(SCALEOUT)
    bad[run] |= changed
    region = render(MACHINE, runs(scaleout=bad), quick=False)
    assert figure_row(region, "scale-out: brands not promoted").endswith(
        f"| {missed} | ≤ 0 | **FAIL** (1 of 1) |"
    )


def test_the_scaleout_is_run_quick_at_40_brands_and_judged_not() -> None:
    bench = {b.name: b for b in BENCHES}["scaleout"]
    assert bench.argv(quick=False) == ["bench/scaleout.py", "--json"]
    assert bench.argv(quick=True) == ["bench/scaleout.py", "--brands", "40", "--json"]
    quick = {**SCALEOUT, "brands": 40}
    for name in ("without", "with"):
        quick[name] = {**SCALEOUT[name], "promoted": 40, "workspaces_made": 40}
    region = render(MACHINE, runs(scaleout=quick), quick=True)
    assert figure_row(region, "scale-out: seconds").endswith("| not judged (quick) |")


def test_the_scaleout_runs_once_whatever_the_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    by_name = {bench.name: bench for bench in BENCHES}
    assert by_name["scaleout"].runs(1) == 1
    assert by_name["scaleout"].runs(3) == 1
    started: list[str] = []

    def run_bench(bench: Bench, quick: bool, python: str) -> Run:
        started.append(bench.name)
        result = SCALEOUT if bench.name == "scaleout" else METERED
        return Run(bench.name, [python, *bench.argv(quick)], copy.deepcopy(result))

    monkeypatch.setattr(report, "run_bench", run_bench)
    monkeypatch.setattr(report, "machine_facts", lambda: MACHINE)
    code = report.main(["--repeat", "2", "--only", "rollout-metered,scaleout"])
    assert code == 0
    assert started == ["rollout-metered", "scaleout", "rollout-metered"]
    twice = [*runs(scaleout=SCALEOUT), *runs()[:-1]]  # twice each but the outage and scale-out
    region = render(MACHINE, twice, quick=False)
    assert "2 run(s) of each (rollout-outage once, scaleout once)." in region
    assert figure_row(region, "scale-out: seconds").endswith("| 0.80 | ≤ 1.2 | pass |")


# ----------------------------------------------------------------- the peer on our schedule


def peer_side(side: str, latency_ms: float, seconds: float) -> dict[str, Any]:
    return {
        "side": side,
        "brands": 1000,
        "ready": 1000,
        "failed": 0,
        "latency_ms": latency_ms,
        "settle_polls": 1,
        "seconds": seconds,
        "provisions_per_s": round(1000 / seconds, 1),
        "gateway_calls_per_brand": 4.0 if side == "ours" else 3.0,
        "cpu_ms_per_provision": {"worker0": 3.0, "worker1": 3.0, "postgres": 1.0},
        "other_share": 0.03,
    }


def peer_result(at_0ms: float, at_100ms: float, poll_s: float | None = 5.0) -> dict[str, Any]:
    """bench/peer.py --json's line: ours then the peer's at 0 and 100 ms, then the ratios
    (with bench/peer.py's own targets, 1.0 both)."""
    result: dict[str, Any] = {
        "commit": "abc1234",
        "settle_polls": 1,
        "runs": [
            peer_side("ours", 0.0, 10.0),
            peer_side("peer", 0.0, 8.0),
            peer_side("ours", 100.0, 16.0),
            peer_side("peer", 100.0, 12.0),
        ],
        "ratios": [
            {"latency_ms": 0.0, "ratio": "ours / peer provisions/s", "value": at_0ms,
             "target": ">= 1", "met": at_0ms >= 1},
            {"latency_ms": 100.0, "ratio": "our s / peer s", "value": at_100ms,
             "target": "<= 1", "met": at_100ms <= 1},
        ],
    }  # fmt: skip
    if poll_s is not None:
        result["peer_poll_s"] = poll_s
    return result


SAME_SCHEDULE_0MS = "peer on our schedule (re-polls after 5 s), zero latency"
SAME_SCHEDULE_100MS = "peer on our schedule (re-polls after 5 s), 100 ms per call"


def test_the_peer_on_our_schedule_is_run_as_the_peer_is_with_a_5_s_re_poll() -> None:
    by_name = {bench.name: bench for bench in BENCHES}
    peer, same = by_name["peer"], by_name["peer-same-schedule"]
    assert same.script == peer.script == "bench/peer.py"
    assert same.argv(quick=False) == [
        "bench/peer.py", "--brands", "1000", "--peer-poll-s", "5", "--json",
    ]  # fmt: skip
    assert same.argv(quick=True) == [
        "bench/peer.py", "--brands", "100", "--peer-poll-s", "5", "--json",
    ]  # fmt: skip
    assert peer.argv(quick=False) == ["bench/peer.py", "--brands", "1000", "--json"]
    assert peer.argv(quick=True) == ["bench/peer.py", "--brands", "100", "--json"]
    assert same.runs(2) == peer.runs(2) == 2
    assert "peer-same-schedule" in (report.__doc__ or "")


@pytest.mark.parametrize(
    ("at_0ms", "at_100ms", "verdict_0ms", "verdict_100ms"),
    [
        pytest.param(0.69, 1.35, "pass", "**FAIL** (1 of 1)", id="measured"),
        pytest.param(0.65, 1.33, "pass", "pass", id="at the targets"),
        pytest.param(0.64, 1.34, "**FAIL** (1 of 1)", "**FAIL** (1 of 1)", id="just past"),
        pytest.param(0.57, 1.0, "**FAIL** (1 of 1)", "pass", id="slow at 0 ms"),
    ],
)
def test_the_peer_on_our_schedule_is_judged_by_the_proposed_targets(
    at_0ms: float, at_100ms: float, verdict_0ms: str, verdict_100ms: str
) -> None:
    result = peer_result(at_0ms, at_100ms)
    region = render(MACHINE, runs(peer_same_schedule=result), quick=False)
    assert figure_row(
        region, f"{SAME_SCHEDULE_0MS}: ours / peer's provisions/s (same run)"
    ).endswith(f"| {at_0ms:.2f} | ≥ 0.65 | {verdict_0ms} |")
    assert figure_row(region, f"{SAME_SCHEDULE_100MS}: our seconds / peer's (same run)").endswith(
        f"| {at_100ms:.2f} | ≤ 1.33 | {verdict_100ms} |"
    )
    # the peer's own figures (bench/peer.py at its 1 s re-poll) are not judged by these
    assert "| peer, zero latency" not in region


def test_the_peer_and_the_peer_on_our_schedule_are_judged_apart() -> None:
    region = render(
        MACHINE,
        runs(peer=peer_result(0.37, 1.54, poll_s=1.0), peer_same_schedule=peer_result(0.69, 1.3)),
        quick=False,
    )
    assert figure_row(region, "peer, zero latency").endswith("| 0.37 | ≥ 1 | **FAIL** (1 of 1) |")
    assert figure_row(region, "peer, 100 ms").endswith("| 1.54 | ≤ 1 | **FAIL** (1 of 1) |")
    assert figure_row(region, SAME_SCHEDULE_0MS).endswith("| 0.69 | ≥ 0.65 | pass |")
    assert figure_row(region, SAME_SCHEDULE_100MS).endswith("| 1.30 | ≤ 1.33 | pass |")
    # two tables: the peer's as before, then the one on our schedule after it
    plain = region.index("Against a conventional peer (`bench/peer.py`):")
    same = region.index("Against the same peer on our schedule (`bench/peer.py --peer-poll-s 5`)")
    assert plain < same
    assert region.count("| 0 ms | ours / peer provisions/s = **0.37** (target >= 1) |") == 1
    assert (
        region.count("| 0 ms | ours / peer provisions/s = **0.69** (target >= 0.65, proposed) |")
        == 1
    )
    assert region.count("| 100 ms | our s / peer s = **1.30** (target <= 1.33, proposed) |") == 1


def test_the_table_of_the_peer_on_our_schedule_names_the_schedule() -> None:
    region = render(MACHINE, runs(peer_same_schedule=peer_result(0.69, 1.35)), quick=False)
    assert (
        "Against the same peer on our schedule (`bench/peer.py --peer-poll-s 5`): the peer "
        "re-polls a workspace after 5 s, doubling, as ours waits 5 s, doubling "
        "(`PROVISIONER_BACKOFF_BASE_S`)"
    ) in region
    assert "| 0 ms | ours | 1,000 of 1,000 | 10.00 | 100.0 | 4.0 | 6.0, 7.0 | 0.03 |" in region
    assert "| 100 ms | peer | 1,000 of 1,000 | 12.00 | 83.3 | 3.0 | 6.0, 7.0 | 0.03 |" in region
    assert "| 100 ms | our s / peer s = **1.35** (target <= 1.33, proposed) |" in region
    assert "Against a conventional peer" not in region  # no `peer` run, no table of it
    # the re-poll as bench/peer.py recorded it; as asked for when its line has none
    region = render(MACHINE, runs(peer_same_schedule=peer_result(0.69, 1.35, 2.5)), quick=False)
    assert "the peer re-polls a workspace after 2.5 s, doubling" in region
    region = render(MACHINE, runs(peer_same_schedule=peer_result(0.69, 1.35, None)), quick=False)
    assert "the peer re-polls a workspace after 5 s, doubling" in region


def test_a_quick_peer_on_our_schedule_is_not_judged() -> None:
    quick = peer_result(0.5, 1.6)
    region = render(MACHINE, runs(peer_same_schedule=quick), quick=True)
    assert figure_row(region, SAME_SCHEDULE_0MS).endswith("| 0.50 | ≥ 0.65 | not judged (quick) |")
    assert figure_row(region, SAME_SCHEDULE_100MS).endswith(
        "| 1.60 | ≤ 1.33 | not judged (quick) |"
    )


def test_a_failed_peer_on_our_schedule_writes_nothing(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(DOCUMENT)
    all_runs = runs(peer_same_schedule=None)
    with pytest.raises(BenchFailed, match="peer-same-schedule"):
        write_figures(doc, all_runs, render(MACHINE, all_runs, quick=False))
    assert doc.read_text() == DOCUMENT


def test_only_the_peer_on_our_schedule_can_be_run(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []

    def run_bench(bench: Bench, quick: bool, python: str) -> Run:
        started.append(bench.argv(quick))
        return Run(bench.name, [python, *bench.argv(quick)], peer_result(0.7, 1.2))

    monkeypatch.setattr(report, "run_bench", run_bench)
    monkeypatch.setattr(report, "machine_facts", lambda: MACHINE)
    assert report.main(["--quick", "--only", "peer-same-schedule"]) == 0
    assert started == [["bench/peer.py", "--brands", "100", "--peer-poll-s", "5", "--json"]]
