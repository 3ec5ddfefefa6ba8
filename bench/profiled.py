"""Run a module under cProfile in every thread, and write the merged profile at exit.

    python bench/profiled.py OUT.pstats -m worker.cli.main worker

cProfile follows only the thread that enabled it; this starts one profiler in
each thread the program starts (the worker's hops run on a pool), timed by the
thread's own CPU time (`time.thread_time`: waiting for I/O or for the
interpreter does not count), and merges them all into OUT.pstats when the
program exits (a worker exits on SIGTERM
after its threads stop). Used by `bench/pipeline.py --profile DIR`. The
profiler's overhead inflates small functions: compare call counts and
cumulative times between two commits, not with unprofiled runs.
"""

from __future__ import annotations

import atexit
import cProfile
import pstats
import runpy
import sys
import threading
import time

_profiles: list[cProfile.Profile] = []
_original_run = threading.Thread.run


def _profiled_run(self: threading.Thread) -> None:
    profile = cProfile.Profile(time.thread_time)
    _profiles.append(profile)
    profile.enable()
    try:
        _original_run(self)
    finally:
        profile.disable()


def _dump(path: str) -> None:
    stats: pstats.Stats | None = None
    for profile in _profiles:
        try:
            stats = pstats.Stats(profile) if stats is None else stats.add(profile)
        except TypeError:  # a thread that never ran a profiled call
            continue
    if stats is not None:
        stats.dump_stats(path)


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit(__doc__)
    out, module = sys.argv[1], sys.argv[3]
    sys.argv = [module, *sys.argv[4:]]
    threading.Thread.run = _profiled_run  # type: ignore[method-assign]
    main_profile = cProfile.Profile(time.thread_time)
    _profiles.append(main_profile)
    atexit.register(_dump, out)
    main_profile.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        main_profile.disable()


if __name__ == "__main__":
    main()
