"""GPU rows of the compiled training step and the flex backend, measured side by side in one process
(`gpu_train_rows`, called by a GPU benchmark script; a dry run on the CPU exercises the code with tiny shapes):

(a) training steps/s of the GPU-scale MQMTAR model (configs/reproduce/gpu_scale.toml: 4 layers, d 256, FFN 512,
    8 heads × 32, batch 128, float32, NAPE), softmax and ASEntmax, the eager step against the compiled one
    (``train.compile``): the trainer's per-step work (a fresh batch from the task's stream, the update, the loss
    read back), a fixed number of steps after warm-up, in interleaved rounds; the first steps' seconds (compiling)
    are reported apart.
(b) softmax with NAPE slopes, causal, forward, bfloat16, B = 1, 8 heads × 32, N = 4K / 16K / 64K: flex against the
    path auto took before it (sdpa in query blocks), the chunked backend and SDPA's flash kernel without a bias
    (the anchor); interleaved rounds, medians of CUDA-event times, ratios to the anchor, and flex's largest
    difference from the sdpa blocks.
(c) evaluation (`score_length`, what `longsparse eval` runs) of the GPU-scale model, untrained, float32: seconds per
    example at 256× and 1,024× the training length, softmax against ASEntmax, each on what auto picks (flex for
    softmax's long prefill, triton for ASEntmax).

Every part checks the deadline before it starts work and the rows it did not reach say so ("skipped"), so the
result is JSON-able and partial results survive a short budget.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F

# [study.overrides] of configs/reproduce/gpu_scale.toml that shape the model and the step (tested equal to it)
GPU_SCALE_SETS = {
    "model.n_layers": 4,
    "model.d_model": 256,
    "model.n_heads": 8,
    "model.head_dim": 32,
    "model.d_ff": 512,
    "train.batch_size": 128,
    "train.bf16": False,
}
DRY_SETS = {
    "model.n_layers": 1,
    "model.d_model": 32,
    "model.n_heads": 2,
    "model.head_dim": 16,
    "model.d_ff": 32,
    "train.batch_size": 2,
    "train.bf16": False,
}
TRAIN_LENGTH = 64  # the GPU-scale study's training length (task length L)
METHODS = ("softmax", "asentmax")
# seconds a part needs at least before it is started (its first call compiles)
RESERVE_S = {"train": 45.0, "forward": 15.0, "eval": 20.0}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _sets(dry: bool, device: torch.device, **extra) -> list:
    table = {**(DRY_SETS if dry else GPU_SCALE_SETS), "train.device": device.type, **extra}
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in table.items()]


# ----------------------------------------------------------------------------- (a) training steps


def _trainer_step(method: str, compiled: bool, device: torch.device, dry: bool) -> tuple[Callable[[], float], dict]:
    """(one training step as the trainer takes it, facts of the setup) for the GPU-scale model of `method`."""
    from longsparse.tasks import IGNORE_INDEX
    from longsparse.train import build_config
    from longsparse.train.config import RunConfig
    from longsparse.train.loop import CompiledLoss, bucket_length, build_model_and_optimizer, pad_batch, train_step

    cfg = build_config("mqmtar", preset="paper", method=method, positions="nape", sets=_sets(dry, device))
    run = RunConfig.from_dict(cfg)
    tr, task = run.train, run.task.build()
    model, opt = build_model_and_optimizer(run, task, device, fused=compiled and device.type == "cuda")
    # the dry run traces the step without generating code (seconds, not a minute of compiling on a CPU)
    loss_fn = CompiledLoss(device, backend="eager" if dry else "inductor") if compiled else None
    rng = task.rng(tr.seed, "train")
    autocast = torch.autocast(device.type, enabled=False)
    lengths = tuple(tr.train_lengths)

    def step() -> float:
        batch = task.batch(lengths, tr.batch_size, rng=rng)
        n_target = int((batch.labels != IGNORE_INDEX).sum())
        if compiled:  # as the trainer does
            batch = pad_batch(batch, bucket_length(batch.input_ids.shape[1]))
        loss, _ = train_step(
            model,
            opt,
            batch.to(device),
            n_target=n_target,
            lr=tr.lr,
            grad_clip=tr.grad_clip,
            autocast=autocast,
            loss_fn=loss_fn,
        )
        return float(loss)  # the trainer reads every step's loss back

    facts = {"batch_size": tr.batch_size, "params": model.num_parameters(), "fused_adamw": compiled}
    if loss_fn is not None:
        facts["compile_mode"] = loss_fn.mode or "default"
        facts["compile_backend"] = loss_fn.backend
        facts["loss_fn"] = loss_fn
    return step, facts


def train_rows(device: torch.device, deadline: float, dry: bool, steps: int, warmup: int, rounds: int) -> list:
    """Steps/s of eager and compiled training steps of each method, ``steps`` timed steps each in ``rounds``
    interleaved rounds after ``warmup`` steps; the ratio compiled / eager of steps/s."""
    rows = []
    for method in METHODS:
        row = {"part": "train", "method": method, "model": "gpu_scale" if not dry else "dry"}
        rows.append(row)
        if time.perf_counter() > deadline - (0 if dry else RESERVE_S["train"]):
            row["skipped"] = "budget"
            continue
        try:
            fns = {}
            for mode in ("eager", "compiled"):
                step, facts = _trainer_step(method, mode == "compiled", device, dry)
                loss_fn = facts.pop("loss_fn", None)
                row[f"{mode}_setup"] = facts
                _sync(device)
                t0 = time.perf_counter()
                losses = [step() for _ in range(warmup)]
                _sync(device)
                row[f"{mode}_warmup_s"] = round(time.perf_counter() - t0, 3)
                row[f"{mode}_warmup_losses"] = losses
                if loss_fn is not None:
                    row["compiled_as_one_graph"] = loss_fn.fullgraph
                fns[mode] = step
            times: dict = {m: [] for m in fns}
            per_round = max(1, steps // rounds)
            for _ in range(rounds):
                for mode, step in fns.items():
                    if time.perf_counter() > deadline:
                        break
                    _sync(device)
                    t0 = time.perf_counter()
                    for _ in range(per_round):
                        step()
                    _sync(device)
                    times[mode].append((time.perf_counter() - t0) / per_round)
            for mode, ts in times.items():
                row[f"{mode}_steps"] = per_round * len(ts)
                if ts:
                    row[f"{mode}_steps_per_s"] = 1.0 / statistics.median(ts)
            if row.get("eager_steps_per_s") and row.get("compiled_steps_per_s"):
                row["compiled_vs_eager"] = row["compiled_steps_per_s"] / row["eager_steps_per_s"]
            if len(times["compiled"]) < rounds:
                row["note"] = "budget: fewer rounds than asked"
        except Exception as exc:  # noqa: BLE001 - recorded in the row; the other parts go on
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
    return rows


# ----------------------------------------------------------------------------- (b) forward


def _time_call(fn: Callable[[], object], device: torch.device) -> float:
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def _forward_methods(q, k, v, slopes, device: torch.device) -> dict:
    """The forward calls (B, H, N, D) compared at one length, by name."""
    import longsparse as ls

    def named(backend):
        return lambda: ls.attention(q, k, v, mapping="softmax", alibi_slopes=slopes, is_causal=True, backend=backend)

    def flash():
        if device.type != "cuda":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return {
        "sdpa_flash_no_bias": flash,
        "flex": named("flex"),
        "sdpa_blocks": named("sdpa"),
        "chunked": named("chunked"),
    }


def forward_rows(device: torch.device, deadline: float, lengths, rounds: int, slow_call_s: float = 1.5) -> list:
    """Softmax + NAPE forward at each length: flex, sdpa (query blocks), chunked, and SDPA flash without bias.
    A method whose call took over ``slow_call_s`` is not run at longer lengths."""
    from longsparse.nn.positions import nape_slopes

    H, D = 8, 32
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    slopes = nape_slopes(H).to(device)
    too_slow: set = set()
    rows = []
    for N in lengths:
        g = torch.Generator().manual_seed(N)
        q, k, v = (torch.randn(1, H, N, D, generator=g).to(device=device, dtype=dtype) for _ in range(3))

        methods = _forward_methods(q, k, v, slopes, device)
        group = {"part": "forward", "n": N, "dtype": str(dtype).replace("torch.", ""), "heads": H, "head_dim": D}
        outs, times = {}, {m: [] for m in methods}
        with torch.no_grad():
            for name, fn in methods.items():
                row = {**group, "method": name}
                rows.append(row)
                if name in too_slow:
                    row["skipped"] = f"slower than {slow_call_s} s per call at a shorter N"
                    continue
                if time.perf_counter() > deadline - RESERVE_S["forward"] * (name == "flex"):
                    row["skipped"] = "budget"
                    continue
                try:
                    t0 = time.perf_counter()
                    outs[name] = fn()
                    _sync(device)
                    row["first_call_s"] = round(time.perf_counter() - t0, 3)
                except Exception as exc:  # noqa: BLE001 - recorded; the others go on
                    row["error"] = f"{type(exc).__name__}: {exc}"[:500]
            live = [m for m in methods if m in outs]
            for _ in range(rounds):
                for name in live:
                    if time.perf_counter() > deadline or (times[name] and times[name][-1] > slow_call_s):
                        continue
                    times[name].append(_time_call(methods[name], device))
        by_name = {r["method"]: r for r in rows[-len(methods) :]}
        anchor = statistics.median(times["sdpa_flash_no_bias"]) if times["sdpa_flash_no_bias"] else None
        for name in live:
            row = by_name[name]
            if times[name]:
                row["median_s"] = statistics.median(times[name])
                row["calls"] = len(times[name])
                if anchor:
                    row["vs_sdpa_flash"] = row["median_s"] / anchor
                if row["median_s"] > slow_call_s:
                    too_slow.add(name)
        if "flex" in outs and "sdpa_blocks" in outs:
            by_name["flex"]["max_abs_diff_vs_sdpa_blocks"] = (
                (outs["flex"].float() - outs["sdpa_blocks"].float()).abs().max().item()
            )
        q = k = v = outs = methods = None  # free this length's tensors before the next
    return rows


# ----------------------------------------------------------------------------- (c) evaluation


def eval_rows(device: torch.device, deadline: float, dry: bool, multiples, samples: int) -> list:
    """Seconds per example of `score_length` at each multiple of the training length, every attention call on
    the backend auto picks: on CUDA flex for softmax's long prefill (decoding steps, whose key count grows by one,
    stay on SDPA: flex compiles per shape) and triton for ASEntmax. A warm-up at 2× and 4× compiles the kernels."""
    from longsparse.tasks.scoring import score_length, sequence_tokens
    from longsparse.train import build_config
    from longsparse.train.config import RunConfig, build_model

    pairs = (("softmax", "auto"), ("asentmax", "auto"))
    rows = []
    for method, backend in pairs:
        cfg = build_config(
            "mqmtar",
            preset="paper",
            method=method,
            positions="nape",
            sets=_sets(dry, device) + [f"model.attention.attn_backend={backend}"],
        )
        run = RunConfig.from_dict(cfg)
        task = run.task.build()
        torch.manual_seed(0)
        model = build_model(run.as_dict()["model"], task.vocab_size).to(device).eval()
        warm = False
        for m in multiples:
            length = TRAIN_LENGTH * m
            row = {"part": "eval", "method": method, "backend": backend, "multiple": m, "length": length}
            rows.append(row)
            if time.perf_counter() > deadline - (0 if dry else RESERVE_S["eval"]):
                row["skipped"] = "budget"
                continue
            try:
                if not warm:  # two lengths: the compiled kernels' second shape makes their lengths dynamic
                    t0 = time.perf_counter()
                    for w in (2, 4):
                        score_length(model, task, w * TRAIN_LENGTH, 1, seed=1, split="test")
                    row["warmup_s"] = round(time.perf_counter() - t0, 3)
                    warm = True
                _sync(device)
                t0 = time.perf_counter()
                res = score_length(model, task, length, samples, seed=0, split="test", batch_size=1)
                _sync(device)
                sec = time.perf_counter() - t0
                row.update(
                    samples=samples,
                    tokens=sequence_tokens(task, length),
                    seconds_per_example=sec / samples,
                    exact_match=res["exact_match"],
                )
            except Exception as exc:  # noqa: BLE001 - recorded; the others go on
                row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        del model
    by = {(r["method"], r["multiple"]): r for r in rows}
    for m in multiples:
        a, b = by.get(("softmax", m), {}), by.get(("asentmax", m), {})
        if a.get("seconds_per_example") and b.get("seconds_per_example"):
            a["vs_asentmax_triton"] = a["seconds_per_example"] / b["seconds_per_example"]
    return rows


# ----------------------------------------------------------------------------- driver


def gpu_train_rows(
    budget_s: float = 90.0,
    *,
    device: Optional[str] = None,
    dry: bool = False,
    parts=("forward", "train", "eval"),
    start: Optional[float] = None,
) -> dict:
    """The rows of `parts` (in that order) within ``budget_s`` seconds from ``start`` (perf_counter; default now):
    a JSON-able dict {"device", "torch", "dry", "budget_s", "rows": [...], "elapsed_s"}. device: "cuda" (default
    when available) or "cpu"; dry: tiny shapes and few steps (numbers meaningless: a check that the code runs).
    Each row that was not reached says "skipped": "budget"; one that failed holds "error"."""
    start = time.perf_counter() if start is None else start
    deadline = start + budget_s
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out = {
        "kind": "gpu_train_rows",
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dry": dry,
        "budget_s": budget_s,
        "rows": [],
    }
    unknown = set(parts) - {"forward", "train", "eval"}
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from forward, train, eval")
    for part in parts:
        if part == "forward":
            lengths = (256, 512) if dry else (4096, 16384, 65536)
            out["rows"] += forward_rows(dev, deadline, lengths, rounds=2 if dry else 5)
        elif part == "train":
            out["rows"] += train_rows(dev, deadline, dry, steps=2 if dry else 30, warmup=2 if dry else 5,
                                      rounds=2 if dry else 3)  # fmt: skip
        else:
            out["rows"] += eval_rows(
                dev, deadline, dry, multiples=(2,) if dry else (256, 1024), samples=1 if dry else 2
            )
    out["elapsed_s"] = round(time.perf_counter() - start, 3)
    return out


if __name__ == "__main__":  # python -m longsparse_experiments.bench_gpu_train [BUDGET_S] [--dry]
    import json
    import sys

    budget = float(next((a for a in sys.argv[1:] if not a.startswith("--")), 90))
    print(json.dumps(gpu_train_rows(budget, dry="--dry" in sys.argv), indent=1, default=str))
