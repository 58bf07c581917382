"""`longsparse bench train-step | train-run | eval`: whole training steps (time, peak memory), whole
`longsparse train` runs and evaluation throughput per method, as ratios to the first method."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from longsparse_experiments.bench.timing import rss_now_and_peak, wall_and_cpu_interleaved, worker_command

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
    base, _ = rss_now_and_peak()
    for _ in range(steps):
        step()
    _, peak = rss_now_and_peak()
    return {"peak_rss_bytes": peak, "extra_peak_bytes": peak - base}


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
        t = wall_and_cpu_interleaved(fns, repeats)
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
            proc = subprocess.run(worker_command("--train-step-worker", arg), capture_output=True, text=True)
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
