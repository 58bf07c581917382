"""A study as a job with a wall-clock limit: how the time budget is split, and a pool of worker processes that
runs several cells at once on one device and can be stopped at a given time.

    budget = TimeBudget.split(420)         # `longsparse reproduce ... --time-budget 420`
    budget.train_until, budget.eval_until, budget.stop_at, budget.end

The split, from the end: the report and the bundles get ``pack_seconds``; before that, workers still running
are stopped (``stop_at``; a stopped evaluation loses one batch at most, a stopped training nothing since its last
checkpoint); evaluations end ``grace_seconds`` before that (``eval_until``); trainings end ``eval_seconds`` before
that (``train_until``), leaving that long to evaluate what finished. ``train.deadline`` and the evaluations'
``until`` enforce the two deadlines from inside; the stop is the pool's.
"""

from __future__ import annotations

import math
import multiprocessing
import signal
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Iterable, Optional

from longsparse.train.config import ConfigError

MIN_TRAIN_SECONDS = 10.0  # a budget that leaves less for training is refused before anything starts
# `longsparse reproduce` options (argparse dest, flag) that run a study as a time-boxed or parallel job, or analyse
# its records: a study recorded its own way (report = "hsa" or "lm") runs its cells one by one in this process
JOB_OPTIONS = (
    ("time_budget", "--time-budget"),
    ("eval_seconds", "--eval-seconds"),
    ("max_examples", "--max-examples"),
    ("bundle_out", "--bundle-out"),
    ("bundle_max", "--bundle-max"),
    ("bundle_files", "--bundle-files"),
    ("resume_from", "--resume-from"),
    ("analyse", "--analyse"),
)


def refuse_job_options(args, report: str, also: Iterable[tuple[str, str]] = ()) -> None:
    """ConfigError naming the job options (``JOB_OPTIONS``, ``--workers`` above 1, and ``also``) given in the
    parsed ``longsparse reproduce`` command line ``args`` of a study file with ``report = REPORT``."""
    given = [flag for key, flag in (*JOB_OPTIONS, *also) if getattr(args, key, None) is not None]
    if getattr(args, "workers", 1) != 1:
        given.append("--workers")
    if given:
        raise ConfigError(f"{', '.join(given)}: not for a study with report = {report!r} (its cells run one by one)")


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, x))


@dataclass(frozen=True)
class TimeBudget:
    """The split of a job's ``seconds`` of wall clock from ``start`` (a ``time.time()`` value; module docstring)."""

    start: float
    seconds: float
    eval_seconds: float
    pack_seconds: float
    grace_seconds: float

    @classmethod
    def split(cls, seconds: float, *, start: Optional[float] = None, eval_seconds: Optional[float] = None):
        """The default split of ``seconds``: report and bundles 8 % (5-60 s), stopping 3 % (2-15 s), evaluation
        ``eval_seconds`` (default 12 %, at least 5 s). ConfigError, before any work, when the budget is not a
        positive number or leaves under MIN_TRAIN_SECONDS for training."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise ConfigError(f"--time-budget must be a number of seconds, got {seconds!r}")
        if seconds <= 0:
            raise ConfigError(f"--time-budget must be positive, got {seconds:g}")
        if eval_seconds is not None and (not math.isfinite(eval_seconds) or eval_seconds < 0):
            raise ConfigError(f"--eval-seconds must be a number of seconds >= 0, got {eval_seconds!r}")
        budget = cls._of(seconds, start if start is not None else time.time(), eval_seconds)
        if budget.train_seconds < MIN_TRAIN_SECONDS:
            need = cls._least(eval_seconds)
            raise ConfigError(
                f"--time-budget {seconds:g} s leaves {max(budget.train_seconds, 0):.0f} s for training (evaluation "
                f"{budget.eval_seconds:.0f} s, stopping {budget.grace_seconds:.0f} s, report and bundles "
                f"{budget.pack_seconds:.0f} s are kept at the end); at least {MIN_TRAIN_SECONDS:.0f} s are needed: "
                f"give at least {need} s"
            )
        return budget

    @classmethod
    def _least(cls, eval_seconds: Optional[float]) -> int:
        """The fewest whole seconds whose split leaves MIN_TRAIN_SECONDS for training (the training time grows
        with the budget: a doubling search, then bisection)."""
        enough = lambda s: cls._of(s, 0.0, eval_seconds).train_seconds >= MIN_TRAIN_SECONDS  # noqa: E731
        hi = 1
        while not enough(hi):
            hi *= 2
        lo = hi // 2  # not enough (or 0)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if enough(mid) else (mid, hi)
        return hi

    @classmethod
    def _of(cls, seconds: float, start: float, eval_seconds: Optional[float]) -> "TimeBudget":
        return cls(
            start=start,
            seconds=float(seconds),
            eval_seconds=float(eval_seconds) if eval_seconds is not None else max(5.0, 0.12 * seconds),
            pack_seconds=_clamp(0.08 * seconds, 5.0, 60.0),
            grace_seconds=_clamp(0.03 * seconds, 2.0, 15.0),
        )

    @property
    def end(self) -> float:
        return self.start + self.seconds

    @property
    def stop_at(self) -> float:
        return self.end - self.pack_seconds

    @property
    def eval_until(self) -> float:
        return self.stop_at - self.grace_seconds

    @property
    def train_until(self) -> float:
        return self.eval_until - self.eval_seconds

    @property
    def train_seconds(self) -> float:
        return self.train_until - self.start

    def describe(self) -> str:
        at = lambda t: f"+{t - self.start:.0f} s"  # noqa: E731
        return (
            f"time budget {self.seconds:.0f} s: training until {at(self.train_until)}, evaluation until "
            f"{at(self.eval_until)}, workers stopped at {at(self.stop_at)}, report and bundles until {at(self.end)}"
        )


# ---- worker processes -------------------------------------------------------------------------------------------
def single_thread() -> None:
    """A worker's set-up: one intra-op thread (several cells share the machine's cores)."""
    import torch

    torch.set_num_threads(1)


def _worker_main(conn, initializer: Optional[Callable[[], None]]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt stops
    if initializer is not None:
        initializer()
    while True:
        msg = conn.recv()
        if msg is None:
            return
        key, fn, args = msg
        try:
            conn.send((key, True, fn(*args)))
        except Exception as e:  # the job's failure is reported to the parent; the worker takes the next job
            conn.send((key, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


class WorkerPool:
    """``n`` worker processes (spawned: safe with CUDA and with torch's threads) that run jobs, module-level
    functions with picklable arguments, in the order given; a worker that dies fails its job and is replaced.
    Use as a context manager: leaving it ends the workers (terminated if still busy)."""

    def __init__(self, n: int, initializer: Optional[Callable[[], None]] = single_thread):
        self._ctx = multiprocessing.get_context("spawn")
        self._initializer = initializer
        self._stopped = False
        self._workers = [self._start() for _ in range(n)]

    def _start(self) -> dict:
        parent, child = self._ctx.Pipe()
        # not daemonic: a worker may start processes of its own (torch.compile's compile workers)
        proc = self._ctx.Process(target=_worker_main, args=(child, self._initializer))
        proc.start()
        child.close()
        return {"proc": proc, "conn": parent, "job": None}

    def run(
        self,
        jobs: Iterable[tuple[Any, Callable, tuple]],
        on_result: Callable[[Any, bool, Any], None],
        until: Optional[float] = None,
    ) -> list:
        """Run ``jobs`` ((key, function, args)) and call ``on_result(key, ok, value or error text)`` as each
        ends; at ``until`` (a ``time.time()`` value) end the workers still busy (the pool runs nothing after
        that). Returns the keys of the jobs stopped there or never started."""
        queue = deque(jobs)
        while queue or any(w["job"] is not None for w in self._workers):
            if self._stopped or (until is not None and time.time() >= until):
                return self._stop(queue)
            for i, w in enumerate(self._workers):
                if w["job"] is None and queue:
                    if not w["proc"].is_alive():  # ended after its last result: a fresh one takes the job
                        self._end(w)
                        self._workers[i] = w = self._start()
                    w["job"] = queue.popleft()
                    w["conn"].send(w["job"])
            busy = [w for w in self._workers if w["job"] is not None]
            timeout = None if until is None else max(0.0, until - time.time())
            ready = wait([w["conn"] for w in busy] + [w["proc"].sentinel for w in busy], timeout=timeout)
            if not ready:  # the stop time: whatever runs now is cut off
                return self._stop(queue)
            for i, w in enumerate(self._workers):
                if w["job"] is None or (w["conn"] not in ready and w["proc"].sentinel not in ready):
                    continue
                try:
                    key, ok, value = w["conn"].recv()
                    w["job"] = None
                except EOFError:  # the worker died (out of memory, a signal, an exit): its job failed
                    w["proc"].join()
                    key, ok, value = w["job"][0], False, f"worker process ended (exit code {w['proc'].exitcode})"
                    w["conn"].close()
                    self._workers[i] = self._start()
                on_result(key, ok, value)
        return []

    def _stop(self, queue: deque) -> list:
        """End the busy workers for good (none is started again: the job is past its stop time); the keys of
        their jobs and of those never started."""
        left = [w["job"][0] for w in self._workers if w["job"] is not None] + [job[0] for job in queue]
        for w in self._workers:
            if w["job"] is not None:
                self._end(w)
        self._workers = [w for w in self._workers if w["job"] is None]
        self._stopped = True
        return left

    @staticmethod
    def _end(w: dict) -> None:
        if w["proc"].is_alive():
            w["proc"].terminate()
        w["proc"].join(timeout=10)
        if w["proc"].is_alive():
            w["proc"].kill()
            w["proc"].join()
        w["conn"].close()

    def close(self) -> None:
        for w in self._workers:
            if w["job"] is None and w["proc"].is_alive():
                try:
                    w["conn"].send(None)
                except OSError:
                    pass
                w["proc"].join(timeout=10)
            self._end(w)
        self._workers = []

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- the job's summary ------------------------------------------------------------------------------------------
SUMMARY_FORMAT = "longsparse-job-summary"


def cells_table(cells: list[dict], lengths: list[int]) -> str:
    """One row per cell: steps reached of the total, steps/s in this job, final loss, and per length the exact
    match % with n (complete or stored), or with how many of the examples are done so far (partial)."""
    head = "| cell | steps | steps/s | loss | " + " | ".join(f"{L / lengths[0]:g}x" for L in lengths) + " |"
    rows = [head, "|---" * (4 + len(lengths)) + "|"]
    for r in cells:
        ck = r["checkpoint_step"]
        parts = [
            r["run"].split("/")[-1],
            f"{ck if ck is not None else '-'}/{r['steps']}",
            str(r.get("steps_per_s_this_call") or "-"),
            str(r.get("final_loss") if r.get("final_loss") is not None else "-"),
        ]
        for L in lengths:
            x = r["lengths"].get(str(L), {})
            if x.get("status") in ("complete", "archived", "stored"):
                parts.append(f"{100 * x['exact_match']:.1f} (n={x['n']})")
            elif x.get("status") == "partial":
                parts.append(f"{100 * x['exact_match']:.1f} ({x['n']}/{x['target']} so far)")
            else:
                parts.append("-")
        rows.append("| " + " | ".join(parts) + " |")
    return "\n".join(rows)


def seconds_table(cells: list[dict], lengths: list[int]) -> str:
    """One row per cell: seconds per evaluated example at each length (where measured)."""
    head = "| cell | " + " | ".join(f"{L / lengths[0]:g}x" for L in lengths) + " |"
    rows = [head, "|---" * (1 + len(lengths)) + "|"]
    for r in cells:
        parts = [r["run"].split("/")[-1]]
        for L in lengths:
            x = r["lengths"].get(str(L), {})
            parts.append(f"{x['s_per_example']:.4g}" if x.get("s_per_example") is not None else "-")
        rows.append("| " + " | ".join(parts) + " |")
    return "\n".join(rows)


def summary_markdown(summary: dict) -> str:
    """A job summary (``SUMMARY_FORMAT``) as markdown: per study the cells table and the seconds table."""
    parts = []
    for name, sd in summary["studies"].items():
        parts += [
            f"**{name}** ({sd['checkpoint']} checkpoint; exact match %)\n",
            cells_table(sd["cells"], sd["lengths"]),
            "\nSeconds per evaluated example:\n",
            seconds_table(sd["cells"], sd["lengths"]),
            "",
        ]
    return "\n".join(parts)
