"""`longsparse bench …`: speed and memory measured as ratios within one run, written to JSON.

Absolute times on shared machines swing by 2x; the ratios to torch.softmax / SDPA measured
interleaved in the same process are what the docs report.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

import torch

from longsparse.cli import positive_int
from longsparse.io import atomic_write_json


def _time(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _time_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
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


def _fwd_bwd(mapping: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, g: torch.Tensor) -> Callable[[], None]:
    def run():
        xx = x.detach().requires_grad_()
        mapping(xx).backward(g)

    return run


def bench_mapping(lengths, repeats: int, total_elements: int = 1 << 22) -> list[dict]:
    """Rows of length N (total_elements scores per call), fwd and fwd+bwd, as ratios to torch.softmax
    and to the `entmax` package (when installed). Each mapping is timed interleaved with torch.softmax
    (alternating calls, medians), so that its ratio comes from the same stretch of machine time;
    softmax_*_s of a row are the softmax medians of that interleaved run. The package is timed interleaved
    with ours in a separate run of its own (fewer rounds: it is slow)."""
    import longsparse as ls

    try:
        import entmax as entmax_pkg
    except ImportError:
        entmax_pkg = None
    ours = {
        "entmax15": ls.entmax15,
        "entmax_alpha1.3": lambda x: ls.entmax(x, 1.3),
        "sparsemax": ls.sparsemax,
    }
    package = (
        {}
        if entmax_pkg is None
        else {
            "entmax15": entmax_pkg.entmax15,
            "entmax_alpha1.3": lambda x: entmax_pkg.entmax_bisect(x, 1.3),
            "sparsemax": entmax_pkg.sparsemax,
        }
    )
    softmax = lambda x: torch.softmax(x, -1)  # noqa: E731
    rows = []
    for n in lengths:
        gen = torch.Generator().manual_seed(n)
        x = torch.randn(max(1, total_elements // n), n, generator=gen)
        g = torch.randn(x.shape, generator=gen)
        for name, fn in ours.items():
            fwd = _time_interleaved({"softmax": lambda: softmax(x), "ours": lambda: fn(x)}, repeats)
            fb = _time_interleaved({"softmax": _fwd_bwd(softmax, x, g), "ours": _fwd_bwd(fn, x, g)}, repeats)
            row = {
                "n": n,
                "rows": x.shape[0],
                "mapping": name,
                "softmax_fwd_s": fwd["softmax"],
                "softmax_fwdbwd_s": fb["softmax"],
                "ours_fwd_s": fwd["ours"],
                "ours_fwdbwd_s": fb["ours"],
            }
            row["fwd_vs_softmax"] = row["ours_fwd_s"] / row["softmax_fwd_s"]
            row["fwdbwd_vs_softmax"] = row["ours_fwdbwd_s"] / row["softmax_fwdbwd_s"]
            if name in package:
                pk = package[name]
                reps = max(1, repeats // 2)  # the package is slow; fewer rounds, interleaved with ours again
                pf = _time_interleaved({"ours": lambda: fn(x), "package": lambda: pk(x)}, reps)
                pb = _time_interleaved({"ours": _fwd_bwd(fn, x, g), "package": _fwd_bwd(pk, x, g)}, reps)
                row["package_fwd_s"], row["package_fwdbwd_s"] = pf["package"], pb["package"]
                row["ours_fwd_s_with_package"], row["ours_fwdbwd_s_with_package"] = pf["ours"], pb["ours"]
                row["speedup_vs_package_fwd"] = pf["package"] / pf["ours"]
                row["speedup_vs_package_fwdbwd"] = pb["package"] / pb["ours"]
            rows.append(row)
            print(_format_mapping_row(row), flush=True)
    return rows


def _format_mapping_row(r: dict) -> str:
    s = (
        f"n={r['n']:>6} {r['mapping']:<16} fwd {r['fwd_vs_softmax']:5.2f}x softmax  "
        f"fwd+bwd {r['fwdbwd_vs_softmax']:5.2f}x softmax"
    )
    if "speedup_vs_package_fwd" in r:
        s += (
            f"   {r['speedup_vs_package_fwd']:6.1f}x / {r['speedup_vs_package_fwdbwd']:6.1f}x faster "
            "than entmax pkg (fwd / fwd+bwd)"
        )
    return s


# ----------------------------------------------------------------------------- attention

ATTENTION_METHODS = (
    "sdpa_softmax",
    "naive_softmax",
    "ours_softmax",
    "ours_softmax_nape",
    "ours_entmax15",
    "ours_entmax15_nape",
    "ours_entmax15_reference",
    "entmax_pkg_naive",
)
# Methods that materialise (H, N, N) logits, run up to bench_attention's max_naive only.
_DENSE_METHODS = ("naive_softmax", "ours_entmax15_reference")


def _naive(q, k, v, mapping):
    n = q.shape[2]
    z = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    z = z.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return mapping(z) @ v


def _attention_fn(method: str):
    import torch.nn.functional as F

    import longsparse as ls

    if method == "sdpa_softmax":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if method == "naive_softmax":
        return lambda q, k, v: _naive(q, k, v, lambda z: torch.softmax(z, -1))
    if method == "ours_softmax":
        return lambda q, k, v: ls.attention(q, k, v, mapping="softmax")
    if method in ("ours_softmax_nape", "ours_entmax15_nape"):
        # NAPE: ALiBi on half the heads. SDPA would need an (H, N, N) bias: beyond 2^24 elements auto picks
        # fused_cpu, so these rows time the softmax / NAPE and ASEntmax / NAPE decoders' long evaluations
        from longsparse.nn.positions import nape_slopes

        mapping = "softmax" if method == "ours_softmax_nape" else "entmax"
        return lambda q, k, v: ls.attention(q, k, v, mapping=mapping, alpha=1.5, alibi_slopes=nape_slopes(q.shape[1]))
    if method == "ours_entmax15":
        return lambda q, k, v: ls.attention(q, k, v, mapping="entmax", alpha=1.5)
    if method == "ours_entmax15_reference":
        return lambda q, k, v: ls.attention(q, k, v, mapping="entmax", alpha=1.5, backend="reference")
    if method == "entmax_pkg_naive":
        import entmax as entmax_pkg

        return lambda q, k, v: _naive(q, k, v, lambda z: entmax_pkg.entmax15(z, dim=-1))
    raise ValueError(f"unknown attention method {method!r}; choose from {ATTENTION_METHODS}")


def _worker_command(*args: str) -> list[str]:
    """The command line of a measurement in a fresh process: this module run as a script (see its end)."""
    return [sys.executable, "-m", "longsparse_experiments.bench", *args]


def attention_worker(
    method: str, n: int, heads: int, dim: int, backward: bool, repeats: int, interleave_sdpa: bool = False
) -> dict:
    """One measurement in a fresh process: median time and peak RSS above the inputs' baseline. With
    ``interleave_sdpa`` the method and SDPA-softmax are then timed again in alternation (after the memory
    reading, so SDPA's buffers do not count): ``time_vs_sdpa_interleaved`` (wall) is immune to slow load
    drifts, ``time_vs_sdpa_interleaved_cpu`` (process CPU time) also to other processes' time slices."""
    import resource

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, dim, generator=gen) for _ in range(3))
    g = torch.randn(1, heads, n, dim, generator=gen)
    if method.startswith("ours_"):
        import longsparse as ls

        ls.entmax15(torch.zeros(2, 2))  # builds/loads the kernel before the baseline
    if backward:
        q, k, v = (t.requires_grad_() for t in (q, k, v))

    def runner(fn):
        if backward:

            def run():
                fn(q, k, v).backward(g)
                q.grad = k.grad = v.grad = None
        else:

            def run():
                with torch.no_grad():
                    fn(q, k, v)

        return run

    run = runner(_attention_fn(method))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = _time(run, repeats)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"seconds": seconds, "extra_peak_bytes": (peak - base) * 1024}
    if interleave_sdpa and method != "sdpa_softmax":
        t = _interleaved_wall_and_cpu({"sdpa": runner(_attention_fn("sdpa_softmax")), "method": run}, repeats)
        out["time_vs_sdpa_interleaved"] = t["method"]["wall_s"] / t["sdpa"]["wall_s"]
        out["time_vs_sdpa_interleaved_cpu"] = t["method"]["cpu_s"] / t["sdpa"]["cpu_s"]
    return out


def bench_attention(
    lengths,
    repeats: int,
    heads: int = 8,
    dim: int = 64,
    fwd_only_lengths=(),
    max_naive: int = 8192,
    max_package: int = 4096,
    max_interleaved: int = 16384,
    methods=ATTENTION_METHODS,
) -> list[dict]:
    """Causal attention, B = 1: each (method, N, direction) in its own process so that peak memory
    (ru_maxrss) is its own. Ratios are to SDPA-softmax (no bias) at the same N and direction:
    ``time_vs_sdpa`` from the separate processes, and up to ``max_interleaved`` also
    ``time_vs_sdpa_interleaved`` (wall) and ``_cpu`` (process CPU time), timed in alternation inside the
    method's process. Beyond 4096 tokens each timing takes min(repeats, 3) calls."""
    import subprocess

    rows = []
    plan = [(n, True) for n in lengths] + [(n, False) for n in lengths] + [(n, False) for n in fwd_only_lengths]
    for n, backward in plan:
        sdpa = None
        for method in ("sdpa_softmax",) + tuple(m for m in methods if m != "sdpa_softmax"):
            if method in _DENSE_METHODS and n > max_naive:
                continue
            if method == "entmax_pkg_naive" and n > max_package:
                continue
            reps = repeats if n <= 4096 else min(repeats, 3)
            cmd = _worker_command(
                "--attention-worker",
                method,
                str(n),
                str(heads),
                str(dim),
                str(int(backward)),
                str(reps),
                str(torch.get_num_threads()),
                str(int(n <= max_interleaved)),
            )
            proc = subprocess.run(cmd, capture_output=True, text=True)
            row = {
                "n": n,
                "method": method,
                "direction": "fwd+bwd" if backward else "fwd",
                "heads": heads,
                "dim": dim,
                "scores_buffer_bytes": 4 * heads * n * n,
            }
            if proc.returncode != 0:
                row["error"] = (proc.stderr.strip().splitlines() or ["failed"])[-1]
            else:
                row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
                row["buffers"] = row["extra_peak_bytes"] / row["scores_buffer_bytes"]
                if method == "sdpa_softmax":
                    sdpa = row["seconds"]
                if sdpa:
                    row["time_vs_sdpa"] = row["seconds"] / sdpa
            rows.append(row)
            print(_format_attention_row(row), flush=True)
    return rows


def bench_short(lengths, repeats: int, batch: int = 64, heads: int = 4, dim: int = 16) -> list[dict]:
    """Causal attention fwd+bwd at training shapes of the synthetic tasks (NAPE-like ALiBi on half the
    heads, q-scales on all): ``backend="auto"`` against the recomputing backward (``chunked_s``: fused_cpu
    where it takes the mapping, else chunked), timed interleaved, per mapping and length."""
    import longsparse as ls
    from longsparse.attention import BACKENDS
    from longsparse.attention.call import make_call

    rows = []
    g = torch.Generator().manual_seed(0)
    slopes = torch.tensor([2.0**-h if h < heads // 2 else 0.0 for h in range(heads)])
    for n in lengths:
        q, k, v = (torch.randn(batch, heads, n, dim, generator=g) for _ in range(3))
        q_scale = torch.rand(batch, heads, n, generator=g) + 0.5
        up = torch.randn(batch, heads, n, dim, generator=g)
        for mapping in ("entmax", "adatemp", "sparsemax"):

            def run(backend, mapping=mapping):
                def call():
                    leaves = [t.detach().requires_grad_() for t in (q, k, v, q_scale)]
                    out = ls.attention(
                        *leaves[:3],
                        q_scale=leaves[3],
                        mapping=mapping,
                        alibi_slopes=slopes,
                        is_causal=True,
                        backend=backend,
                    )
                    out.backward(up)

                return call

            recomputing = (
                "fused_cpu"
                if BACKENDS["fused_cpu"].supports(
                    make_call(q, k, v, q_scale=q_scale, mapping=mapping, alibi_slopes=slopes)
                )
                is None
                else "chunked"
            )
            t = _time_interleaved({"auto": run("auto"), "chunked": run(recomputing)}, repeats)
            rows.append(
                {
                    "n": n,
                    "mapping": mapping,
                    "batch": batch,
                    "heads": heads,
                    "dim": dim,
                    "auto_s": t["auto"],
                    "chunked_s": t["chunked"],
                    "auto_vs_chunked": t["auto"] / t["chunked"],
                }
            )
            print(
                f"N={n:>5} {mapping:<9} auto {t['auto'] * 1e3:8.1f} ms  chunked {t['chunked'] * 1e3:8.1f} ms  "
                f"auto/chunked {t['auto'] / t['chunked']:.2f}"
            )
    return rows


def _format_attention_row(r: dict) -> str:
    head = f"N={r['n']:>6} {r['direction']:<7} {r['method']:<24}"
    if "error" in r:
        return head + " error: " + r["error"]
    inter = ""
    if "time_vs_sdpa_interleaved" in r:
        inter = f" ({r['time_vs_sdpa_interleaved']:.2f}x interleaved"
        inter += f", {r['time_vs_sdpa_interleaved_cpu']:.2f}x CPU time)" if "time_vs_sdpa_interleaved_cpu" in r else ")"
    return (
        head + f" {r['seconds']:8.3f} s  {r.get('time_vs_sdpa', float('nan')):6.2f}x SDPA{inter}  "
        f"extra peak {r['extra_peak_bytes'] / 2**20:8.1f} MiB = {r['buffers']:.2f} x (H*N^2 fp32)"
    )


# ----------------------------------------------------------------------------- training steps, runs, evaluation

TRAIN_BENCH_METHODS = ("softmax", "asentmax")  # ratios are to the first


def _train_setup(task: str, preset: str, method: str, positions: str, sets=()):
    """(resolved config, task, model, AdamW) of one method as `longsparse train` starts them; ``sets``: its
    ``--set KEY=VALUE`` overrides."""
    from longsparse.train import build_config
    from longsparse.train.config import make_task, resolve
    from longsparse.train.loop import build_model_and_optimizer

    cfg = resolve(build_config(task, preset=preset, method=method, positions=positions, sets=list(sets)))
    task_obj = make_task(cfg["task"])
    return (cfg, task_obj, *build_model_and_optimizer(cfg, task_obj, torch.device("cpu")))


def _step_fn(cfg, model, opt, batch) -> Callable[[], None]:
    """One `longsparse.train.loop.train_step` of `longsparse train` (no autocast, one process) on ``batch``."""
    from longsparse.tasks import IGNORE_INDEX
    from longsparse.train.loop import train_step

    tr = cfg["train"]
    n_target = int((batch.labels != IGNORE_INDEX).sum())
    autocast = torch.autocast("cpu", enabled=False)
    return lambda: train_step(
        model, opt, batch, n_target=n_target, lr=tr["lr"], grad_clip=tr["grad_clip"], autocast=autocast
    )


def _rss_now_and_peak() -> tuple[int, int]:
    """(current, peak) resident set size of this process in bytes, from /proc/self/status (VmRSS, VmHWM).
    Unlike getrusage's ru_maxrss, VmHWM is not inherited from the parent across exec, and it can be reset."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                fields[line.split(":")[0]] = int(line.split()[1]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def train_step_worker(
    task: str, preset: str, method: str, positions: str, length: int, steps: int, threads: int, sets=()
) -> dict:
    """Peak memory of training steps in a fresh process (Linux): the peak RSS while ``steps`` steps run at task
    length ``length``, absolute and above the RSS once the model, optimizer and batch exist (the peak is reset
    to that first: /proc/self/clear_refs)."""
    torch.set_num_threads(threads)
    cfg, task_obj, model, opt = _train_setup(task, preset, method, positions, sets)
    batch = task_obj.batch(
        (length, length), cfg["train"]["batch_size"], rng=task_obj.rng(cfg["train"]["seed"], "train")
    )
    import longsparse as ls

    ls.entmax15(torch.zeros(2, 2))  # builds/loads the kernel before the baseline
    step = _step_fn(cfg, model, opt, batch)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base, _ = _rss_now_and_peak()
    for _ in range(steps):
        step()
    _, peak = _rss_now_and_peak()
    return {"peak_rss_bytes": peak, "extra_peak_bytes": peak - base}


def _interleaved_wall_and_cpu(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, dict[str, float]]:
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


def bench_train_step(
    lengths,
    repeats: int,
    methods=TRAIN_BENCH_METHODS,
    task: str = "mqmtar_inline",
    preset: str = "cpu",
    positions: str = "nape",
    sets=(),
    memory_steps: int = 3,
) -> list[dict]:
    """Whole training steps (forward, loss, backward, clip, AdamW) of the preset's model, one batch per task
    length (the preset's batch size; all methods get the same batch), every method timed interleaved in
    this process; peak memory of ``memory_steps`` steps per method in a fresh process each. Ratios are to
    the first method."""
    import subprocess

    threads = torch.get_num_threads()
    setups = {m: _train_setup(task, preset, m, positions, sets) for m in methods}
    rows = []
    for length in lengths:
        cfg0, task0 = setups[methods[0]][:2]
        batch = task0.batch(
            (length, length), cfg0["train"]["batch_size"], rng=task0.rng(cfg0["train"]["seed"], "train")
        )
        fns = {m: _step_fn(cfg, model, opt, batch) for m, (cfg, _, model, opt) in setups.items()}
        t = _interleaved_wall_and_cpu(fns, repeats)
        mem = {}
        for m in methods:
            arg = json.dumps(
                {
                    "task": task,
                    "preset": preset,
                    "method": m,
                    "positions": positions,
                    "length": length,
                    "steps": memory_steps,
                    "threads": threads,
                    "sets": list(sets),
                }
            )
            proc = subprocess.run(_worker_command("--train-step-worker", arg), capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"train-step memory worker ({m}, length {length}) failed: "
                    + (proc.stderr.strip().splitlines() or ["no output"])[-1]
                )
            mem[m] = json.loads(proc.stdout.strip().splitlines()[-1])
        base = methods[0]
        for m in methods:
            row = {
                "length": length,
                "tokens": int(batch.input_ids.shape[1]),
                "batch": int(batch.input_ids.shape[0]),
                "method": m,
                "positions": positions,
                **t[m],
                **mem[m],
                "wall_vs_base": t[m]["wall_s"] / t[base]["wall_s"],
                "cpu_vs_base": t[m]["cpu_s"] / t[base]["cpu_s"],
                "peak_vs_base": mem[m]["peak_rss_bytes"] / mem[base]["peak_rss_bytes"],
                "extra_peak_vs_base": mem[m]["extra_peak_bytes"] / max(1, mem[base]["extra_peak_bytes"]),
            }
            rows.append(row)
            print(_format_train_step_row(row), flush=True)
    return rows


def _format_train_step_row(r: dict) -> str:
    return (
        f"L={r['length']:>4} ({r['tokens']} tokens, batch {r['batch']}) {r['method']:<9} "
        f"{r['wall_s'] * 1e3:7.1f} ms wall ({r['wall_vs_base']:.2f}x)  {r['cpu_s'] * 1e3:7.1f} ms CPU "
        f"({r['cpu_vs_base']:.2f}x)  peak {r['peak_rss_bytes'] / 2**20:6.0f} MiB ({r['peak_vs_base']:.2f}x), "
        f"above the model {r['extra_peak_bytes'] / 2**20:5.0f} MiB ({r['extra_peak_vs_base']:.2f}x)"
    )


def _run_train_command(args: list[str]) -> dict:
    """Runs ``longsparse train ARGS`` as a child process; its wall and CPU seconds and peak RSS (os.wait4)."""
    import os
    import subprocess

    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "longsparse.cli", "train", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    err = proc.stderr.read()  # until the child closes it, at exit
    _, status, usage = os.wait4(proc.pid, 0)  # the child's own rusage (Popen.wait would discard it)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: tell Popen, which would wait again
    if proc.returncode != 0:
        raise RuntimeError(f"longsparse train {' '.join(args)} failed: " + (err.strip().splitlines() or ["?"])[-1])
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_bytes": usage.ru_maxrss * 1024}


def bench_train_run(
    steps: int,
    repeats: int,
    methods=TRAIN_BENCH_METHODS,
    task: str = "mqmtar_inline",
    preset: str = "cpu",
    positions: str = "nape",
    sets=(),
    workdir: str | None = None,
) -> list[dict]:
    """Whole ``longsparse train`` runs of the preset (``steps`` steps, its validations and checkpoints
    included), one child process each, the methods in turn for ``repeats`` rounds (medians). Also the
    seconds its validations took (from metrics.jsonl) and its last logged loss. Ratios are to the first
    method. Run folders go to a temporary folder (``workdir``: kept there instead)."""
    import tempfile

    from longsparse.io import read_jsonl

    tmp = None if workdir else tempfile.TemporaryDirectory(prefix="longsparse-bench-")
    root = Path(workdir or tmp.name)
    res: dict[str, list[dict]] = {m: [] for m in methods}
    try:
        for r in range(repeats):
            for m in methods:
                out = root / f"{m}-{positions}-r{r}"
                if out.exists():
                    raise FileExistsError(f"{out} exists; give an empty --workdir")
                one = _run_train_command(
                    [
                        "--task",
                        task,
                        "--preset",
                        preset,
                        "--method",
                        m,
                        "--positions",
                        positions,
                        "--steps",
                        str(steps),
                        "--out",
                        str(out),
                        *(a for kv in sets for a in ("--set", kv)),
                    ]
                )
                recs = read_jsonl(out / "metrics.jsonl")
                one["val_s"] = sum(rec.get("seconds", 0.0) for rec in recs if "val" in rec)
                one["last_loss"] = [rec["loss"] for rec in recs if "loss" in rec][-1]
                res[m].append(one)
                print(
                    f"round {r} {m:<9} {one['wall_s']:6.1f} s wall  {one['cpu_s']:6.1f} s CPU  peak "
                    f"{one['peak_rss_bytes'] / 2**20:5.0f} MiB  validation {one['val_s']:.1f} s  "
                    f"last loss {one['last_loss']:.4f}",
                    flush=True,
                )
    finally:
        if tmp is not None:
            tmp.cleanup()
    med = {
        m: {k: statistics.median(o[k] for o in v) for k in ("wall_s", "cpu_s", "peak_rss_bytes", "val_s")}
        for m, v in res.items()
    }
    base = methods[0]
    rows = []
    for m in methods:
        row = {
            "method": m,
            "positions": positions,
            "task": task,
            "preset": preset,
            "steps": steps,
            **med[m],
            "runs": res[m],
            "wall_vs_base": med[m]["wall_s"] / med[base]["wall_s"],
            "cpu_vs_base": med[m]["cpu_s"] / med[base]["cpu_s"],
            "peak_vs_base": med[m]["peak_rss_bytes"] / med[base]["peak_rss_bytes"],
        }
        rows.append(row)
        print(
            f"{m:<9} median {row['wall_s']:6.1f} s wall ({row['wall_vs_base']:.2f}x)  {row['cpu_s']:6.1f} s CPU "
            f"({row['cpu_vs_base']:.2f}x)  peak {row['peak_rss_bytes'] / 2**20:5.0f} MiB ({row['peak_vs_base']:.2f}x)",
            flush=True,
        )
    return rows


def _attention_backend(model, n: int) -> str:
    """The backend auto picks for the first attention layer of ``model`` on one sequence of n tokens, no
    gradient (what evaluation runs)."""
    import longsparse as ls

    attn = model.attention_layers()[0]
    x = torch.zeros(1, attn.n_heads, n, attn.head_dim)
    q_scale = torch.ones(1, attn.n_heads, n) if attn.scaler is not None else None
    with torch.no_grad():
        return ls.explain_attention(
            x,
            x,
            x,
            is_causal=True,
            scale=attn.scale,
            alibi_slopes=attn.alibi_slopes,
            q_scale=q_scale,
            **attn.mapping_kwargs(),
        ).backend


def bench_eval(
    lengths,
    repeats: int,
    samples: int = 1,
    runs=None,
    train_steps: int = 30,
    methods=TRAIN_BENCH_METHODS,
    task: str = "mqmtar_inline",
    preset: str = "cpu",
    positions: str = "nape",
    sets=(),
) -> list[dict]:
    """Evaluation throughput (examples/s of `score_length`, what `longsparse eval` runs per length) of two or
    more trained decoders: the best checkpoints of ``runs`` (run folders of one task), else the preset's model
    trained here for ``train_steps`` steps per method. Per length, ``repeats`` rounds score ``samples``
    test examples with each model in turn (round r uses test seed r, the same examples for every model);
    medians of wall and process-CPU seconds, ratios to the first model; examples/s from the wall time."""
    from longsparse.evaluate.sweep import load_run_model
    from longsparse.tasks.scoring import score_length, sequence_tokens
    from longsparse.train import build_config, train
    from longsparse.train.config import make_task, run_label

    threads = torch.get_num_threads()
    models, task_cfgs = {}, []
    if runs:
        for run in runs:
            model, cfg, extra = load_run_model(run, "best")
            models[f"{run_label(cfg)} ({Path(run).name}, step {extra.get('step')})"] = model
            task_cfgs.append(cfg["task"])
    else:
        for m in methods:
            cfg = build_config(
                task,
                preset=preset,
                method=m,
                positions=positions,
                steps=train_steps,
                sets=[*sets, "train.val_every=0", "train.val_samples=1"],
            )
            res = train(cfg, None, printer=lambda s: None, progress=False)
            models[f"{run_label(res['config'])} ({train_steps} steps here)"] = res["model"]
            task_cfgs.append(res["config"]["task"])
        torch.set_num_threads(threads)  # training set the preset's thread count
    if any(c != task_cfgs[0] for c in task_cfgs):
        raise ValueError("bench eval: the runs must share one task configuration (same examples for every model)")
    task_obj = make_task(task_cfgs[0])
    for model in models.values():
        model.eval()
    rows = []
    for length in lengths:
        times: dict[str, list[float]] = {k: [] for k in models}
        cpu: dict[str, list[float]] = {k: [] for k in models}
        exact: dict[str, list[float]] = {k: [] for k in models}
        for r in range(repeats):
            for name, model in models.items():
                c0, t0 = time.process_time(), time.perf_counter()
                res = score_length(model, task_obj, length, samples, seed=r, split="test")
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                exact[name].append(res["exact_match"])
        base = next(iter(models))
        for name, model in models.items():
            sec = statistics.median(times[name])
            row = {
                "length": length,
                "tokens": sequence_tokens(task_obj, length),
                "model": name,
                "samples": samples,
                "repeats": repeats,
                "seconds": sec,
                "examples_per_s": samples / sec,
                "all_seconds": times[name],
                "exact_match": exact[name],
                "backend": _attention_backend(model, sequence_tokens(task_obj, length)),
                "time_vs_base": sec / statistics.median(times[base]),
                "cpu_seconds": statistics.median(cpu[name]),
                "cpu_vs_base": statistics.median(cpu[name]) / statistics.median(cpu[base]),
            }
            rows.append(row)
            print(
                f"L={length:>6} {name:<40} {row['examples_per_s']:8.4f} ex/s  {sec:8.2f} s per {samples}  "
                f"{row['time_vs_base']:.2f}x wall, {row['cpu_vs_base']:.2f}x CPU  attention: {row['backend']}",
                flush=True,
            )
    return rows


def _train_step_table(rows: list[dict]) -> list[str]:
    out = [
        "| task length (tokens) | method | step wall (ms) | / base | step CPU (ms) | / base | peak RSS (MiB) | "
        "/ base | above the model (MiB) | / base |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['length']} ({r['tokens']}) | {r['method']} | {r['wall_s'] * 1e3:.1f} | "
            f"{r['wall_vs_base']:.2f} | {r['cpu_s'] * 1e3:.1f} | {r['cpu_vs_base']:.2f} | "
            f"{r['peak_rss_bytes'] / 2**20:.0f} | {r['peak_vs_base']:.2f} | "
            f"{r['extra_peak_bytes'] / 2**20:.0f} | {r['extra_peak_vs_base']:.2f} |"
        )
    return out


def _train_run_table(rows: list[dict]) -> list[str]:
    out = [
        "| method | steps | wall (s) | / base | CPU (s) | / base | peak RSS (MiB) | / base | validation (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['method']} | {r['steps']} | {r['wall_s']:.1f} | {r['wall_vs_base']:.2f} | "
            f"{r['cpu_s']:.1f} | {r['cpu_vs_base']:.2f} | {r['peak_rss_bytes'] / 2**20:.0f} | "
            f"{r['peak_vs_base']:.2f} | {r['val_s']:.1f} |"
        )
    return out


def _eval_table(rows: list[dict]) -> list[str]:
    out = [
        "| length (tokens) | model | examples/s | wall / base | CPU / base | attention backend |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['length']} ({r['tokens']}) | {r['model']} | {r['examples_per_s']:.4f} | "
            f"{r['time_vs_base']:.2f} | {r['cpu_vs_base']:.2f} | {r['backend']} |"
        )
    return out


def _short_table(rows: list[dict]) -> list[str]:
    out = ["| N | mapping | auto (ms) | chunked (ms) | auto / chunked |", "|---:|---|---:|---:|---:|"]
    for r in rows:
        out.append(
            f"| {r['n']} | {r['mapping']} | {r['auto_s'] * 1e3:.1f} | {r['chunked_s'] * 1e3:.1f} | "
            f"{r['auto_vs_chunked']:.2f} |"
        )
    return out


def _sdpa_blocks_table(rows: list[dict]) -> list[str]:
    out = ["| N | backend | median (s) | / sdpa blocks | max abs difference |", "|---:|---|---:|---:|---|"]
    for r in rows:
        out.append(
            f"| {r['n']} | {r['backend']} | {r['median_s']:.3f} | {r['vs_sdpa_blocks']:.2f} | "
            f"{r['max_abs_diff']:.1e} (vs {r['diff_against']}) |"
        )
    return out


def _alibi_band_table(rows: list[dict]) -> list[str]:
    out = [
        "| N | source | NAPE (s) | NoPE (s) | SDPA (s) | NAPE / NoPE | NAPE / NoPE, CPU time |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        w = r["median_wall_s"]
        out.append(
            f"| {r['n']} | {r['src']} | {w['nape']:.2f} | {w['nope']:.2f} | {w['sdpa']:.2f} | "
            f"{r['nape_vs_nope_wall_s']:.2f} | {r['nape_vs_nope_cpu_s']:.2f} |"
        )
    return out


def _compile_table(rows: list[dict]) -> list[str]:
    out = ["| method | mode | batch | first step (s) | median step (s) | / eager |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        out.append(
            f"| {r['method']} | {r['mode']} | {tuple(r['batch'])} | {r['first_step_s']:.2f} | "
            f"{r['median_step_s']:.3f} | {r['vs_eager']:.2f} |"
        )
    return out


def _mapping_table(rows: list[dict]) -> list[str]:
    out = [
        "| n | mapping | fwd / softmax | fwd+bwd / softmax | entmax pkg / ours (fwd) | entmax pkg / ours (fwd+bwd) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['n']} | {r['mapping']} | {r['fwd_vs_softmax']:.2f} | {r['fwdbwd_vs_softmax']:.2f} | "
            f"{r.get('speedup_vs_package_fwd', float('nan')):.1f} | "
            f"{r.get('speedup_vs_package_fwdbwd', float('nan')):.1f} |"
        )
    return out


def _attention_table(rows: list[dict]) -> list[str]:
    out = [
        "| N | direction | method | time (s) | / SDPA | / SDPA, interleaved | / SDPA, interleaved CPU time | "
        "extra peak (MiB) | × (H·N² fp32) |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['n']} | {r['direction']} | {r['method']} | error: {r['error']} | | | | | |")
            continue
        inter, cpu = (
            f"{r[key]:.2f}" if key in r else "—" for key in ("time_vs_sdpa_interleaved", "time_vs_sdpa_interleaved_cpu")
        )
        out.append(
            f"| {r['n']} | {r['direction']} | {r['method']} | {r['seconds']:.3f} | "
            f"{r.get('time_vs_sdpa', float('nan')):.2f} | {inter} | {cpu} | "
            f"{r['extra_peak_bytes'] / 2**20:.0f} | {r['buffers']:.2f} |"
        )
    return out


def markdown(path: str) -> str:
    """The markdown table of a saved benchmark JSON (what docs/benchmarks.md shows), by its kind's `Bench`."""
    data = json.loads(Path(path).read_text())
    kind = data["benchmark"]
    if kind not in BENCHES:
        raise ValueError(f"{path}: benchmark kind {kind!r} has no table (known: {', '.join(sorted(BENCHES))})")
    out = BENCHES[kind].table(data["rows"])
    env = data["env"]
    out.append(f"\n_{path}: torch {env['torch']}, {env['threads']} threads, {env['time']}_")
    return "\n".join(out)


def environment() -> dict:
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _device() -> str:
    """What the measurements ran on, for the default file name: "cpu", or the CUDA device's name."""
    if torch.cuda.is_available():
        return "".join(c if c.isalnum() else "-" for c in torch.cuda.get_device_name().lower()).strip("-")
    return "cpu"


def _commit() -> Optional[str]:
    """The checkout's commit (with "+changes" when the tree differs from it), or None outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True)
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def write_result(kind: str, rows: list[dict], out: str | None, config: dict) -> Path:
    """Writes a result of a registered kind (`BENCHES`: so `markdown` can print it) to ``out``, by default
    benchmarks/results/<kind>-<device>-<date>.json, with the environment and the commit measured. Never
    overwrites a file."""
    if kind not in BENCHES:
        raise ValueError(f"benchmark kind {kind!r} is not registered (register_bench); known: {', '.join(BENCHES)}")
    default = Path("benchmarks/results") / f"{kind}-{_device()}-{datetime.now(timezone.utc):%Y-%m-%d}.json"
    path = Path(out) if out else default
    if path.exists():
        raise FileExistsError(f"{path} exists; choose another --out (results are never overwritten)")
    path.parent.mkdir(parents=True, exist_ok=True)
    env = {**environment(), "commit": _commit()}
    atomic_write_json(path, {"benchmark": kind, "config": config, "env": env, "rows": rows}, indent=1)
    return path


@dataclass(frozen=True)
class Bench:
    """One kind of benchmark result: ``table`` turns its rows into markdown lines; ``run`` (None for the kinds
    that a script in benchmarks/ writes) measures them for ``longsparse bench NAME`` from the parsed flags and
    the lengths, adding what it used to ``config``; ``lengths`` is its default --lengths."""

    name: str
    table: Callable[[list[dict]], list[str]]
    run: Optional[Callable[[argparse.Namespace, list[int], dict], list[dict]]] = None
    lengths: str = "512,1024,2048,4096,8192,16384"
    help: str = ""


BENCHES: dict[str, Bench] = {}


def register_bench(bench: Bench) -> Bench:
    """Adds a kind: its table to `markdown`, and with a ``run`` a choice of ``longsparse bench``."""
    if bench.name in BENCHES or bench.name == "table":
        raise ValueError(f"benchmark {bench.name!r} is already registered")
    BENCHES[bench.name] = bench
    return bench


def _methods(args: argparse.Namespace, config: dict) -> tuple:
    methods = tuple(m for m in args.methods.split(",") if m)
    config.update(task=args.task, preset=args.preset, positions=args.positions, methods=methods, sets=args.set)
    return methods


def _run_mapping(args, lengths, config):
    return bench_mapping(lengths, args.repeats)


def _run_short(args, lengths, config):
    config.update(batch=64, heads=4, dim=16, causal=True)
    return bench_short(lengths, args.repeats)


def _run_attention(args, lengths, config):
    fwd_only = [int(v) for v in args.fwd_only_lengths.split(",") if v]
    config.update(heads=8, dim=64, fwd_only_lengths=fwd_only, batch=1, causal=True)
    return bench_attention(lengths, args.repeats, fwd_only_lengths=fwd_only)


def _run_train_step(args, lengths, config):
    methods = _methods(args, config)
    return bench_train_step(lengths, args.repeats, methods, args.task, args.preset, args.positions, args.set)


def _run_train_run(args, lengths, config):
    methods = _methods(args, config)
    config.update(steps=args.steps or 150)
    return bench_train_run(
        config["steps"], args.repeats, methods, args.task, args.preset, args.positions, args.set, workdir=args.workdir
    )


def _run_eval(args, lengths, config):
    methods = _methods(args, config)
    config.update(samples=args.samples, runs=args.runs, train_steps=args.steps or 30)
    return bench_eval(
        lengths,
        args.repeats,
        args.samples,
        args.runs,
        config["train_steps"],
        methods,
        args.task,
        args.preset,
        args.positions,
        args.set,
    )


for _bench in (
    Bench("mapping", _mapping_table, _run_mapping, "512,1024,2048,4096,8192", "row-wise mappings, fwd and fwd+bwd"),
    Bench("attention", _attention_table, _run_attention, help="attention fwd / fwd+bwd per method against SDPA"),
    Bench(
        "short",
        _short_table,
        _run_short,
        "32,64,128,256,512",
        "attention fwd+bwd at training lengths, auto vs the chunked path",
    ),
    Bench("train-step", _train_step_table, _run_train_step, "32,64", "whole training steps per method: time, memory"),
    Bench("train-run", _train_run_table, _run_train_run, "", "whole `longsparse train` runs per method"),
    Bench("eval", _eval_table, _run_eval, "16384", "evaluation examples/s of trained decoders"),
    Bench("sdpa_blocks", _sdpa_blocks_table, help="benchmarks/sdpa_blocks.py"),
    Bench("alibi_band", _alibi_band_table, help="benchmarks/alibi_band.py"),
    Bench("train_step_compile", _compile_table, help="benchmarks/compile_cpu.py"),
):
    register_bench(_bench)


def add_cli(sub: argparse._SubParsersAction) -> None:
    """Register ``longsparse bench`` on ``sub``, the ``longsparse`` command's subcommands."""
    b = sub.add_parser("bench", help="speed/memory benchmarks written to JSON")
    b.add_argument(
        "what",
        choices=[*(name for name, b in BENCHES.items() if b.run is not None), "table"],
        help="what to benchmark ("
        + "; ".join(f"{name}: {b.help}" for name, b in BENCHES.items() if b.run is not None)
        + "); `table --out FILE.json` prints a saved result (of any kind) as markdown",
    )
    b.add_argument(
        "--out", default=None, help="JSON output path (default benchmarks/results/<what>-<device>-<date>.json)"
    )
    b.add_argument(
        "--lengths",
        default=None,
        help="row lengths / sequence lengths (default mapping 512..8192, attention 512..16384, short 32..512)",
    )
    b.add_argument("--fwd-only-lengths", default="32768,65536", help="attention: forward-only lengths")
    b.add_argument("--repeats", type=positive_int, default=5)
    b.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    b.add_argument(
        "--methods",
        default="softmax,asentmax",
        help="train-step / train-run / eval: methods compared, ratios to the first (default softmax,asentmax)",
    )
    b.add_argument(
        "--task", default="mqmtar_inline", help="train-step / train-run / eval: task (default mqmtar_inline)"
    )
    b.add_argument("--preset", default="cpu", help="train-step / train-run / eval: preset (default cpu)")
    b.add_argument("--positions", default="nape", help="train-step / train-run / eval: positions (default nape)")
    b.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help="train-run: steps per run (default 150); eval: training steps of the decoders trained "
        "here when no --runs are given (default 30)",
    )
    b.add_argument("--samples", type=positive_int, default=1, help="eval: examples per length and round (default 1)")
    b.add_argument(
        "--runs",
        nargs="+",
        default=None,
        metavar="RUN",
        help="eval: run folders whose best checkpoints are measured (instead of training decoders here)",
    )
    b.add_argument("--workdir", default=None, help="train-run: keep the run folders here (default: a temporary folder)")
    b.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="train-step / train-run / eval: config override of the measured runs, as for train (repeatable)",
    )
    b.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Run the benchmark ``args.what`` (the parsed ``longsparse bench`` flags, see ``add_cli``) and write its JSON;
    ``table`` prints the markdown of the saved result ``args.out`` instead."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.what == "table":
        if not args.out:
            raise SystemExit("longsparse bench table: --out FILE.json (the saved result to print) is required")
        print(markdown(args.out))
        return 0
    bench = BENCHES[args.what]
    lengths = [int(v) for v in (args.lengths or bench.lengths).split(",") if v]
    config = {"lengths": lengths, "repeats": args.repeats}
    rows = bench.run(args, lengths, config)
    path = write_result(args.what, rows, args.out, config)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # the per-measurement workers of bench_attention and bench_train_step
    if len(sys.argv) == 3 and sys.argv[1] == "--train-step-worker":
        print(json.dumps(train_step_worker(**json.loads(sys.argv[2]))))
    elif len(sys.argv) == 10 and sys.argv[1] == "--attention-worker":
        _, _, method, n, heads, dim, backward, reps, threads, interleave = sys.argv
        torch.set_num_threads(int(threads))
        print(
            json.dumps(
                attention_worker(
                    method, int(n), int(heads), int(dim), bool(int(backward)), int(reps), bool(int(interleave))
                )
            )
        )
    else:
        raise SystemExit(
            "usage: python -m longsparse_experiments.bench --attention-worker METHOD N H D BACKWARD "
            "REPEATS THREADS INTERLEAVE_SDPA"
        )
