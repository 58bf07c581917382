"""The clocks of the benchmarks: medians of repeated calls, interleaved so that load changes on a shared machine
hit every variant alike, process CPU time beside wall time, and the resident memory of this process."""

from __future__ import annotations

import statistics
import sys
import time
from typing import Callable


def time_median(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each of `fns` over `repeats` rounds that call every function once, in turn
    (after one warm-up call each): load changes on a shared machine then hit all of them alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def rss_now_and_peak() -> tuple[int, int]:
    """(current, peak) resident set size of this process in bytes, from /proc/self/status (VmRSS, VmHWM).
    Unlike getrusage's ru_maxrss, VmHWM is not inherited from the parent across exec, and it can be reset."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                fields[line.split(":")[0]] = int(line.split()[1]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def wall_and_cpu_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, dict[str, float]]:
    """Median wall and process-CPU seconds of each of `fns`, called in turn for `repeats` rounds after one
    warm-up call each. CPU time counts only this process's own work: on a shared core it drifts less than
    wall time (another process's time slices are not in it; its cache misses are)."""
    for fn in fns.values():
        fn()
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return {k: {"wall_s": statistics.median(wall[k]), "cpu_s": statistics.median(cpu[k])} for k in fns}


def worker_command(*args: str) -> list[str]:
    """The command line of a measurement in a fresh process: the package's __main__ (its workers)."""
    return [sys.executable, "-m", "longsparse_experiments.bench", *args]
