"""What the Triton α-entmax forward does per query block, counted by the kernel itself (`solver_counts`) on the
CPU, in Triton's interpreter with CUDA's 64×64 tiles and solver settings: QKᵀ passes (key tiles whose logits
were computed, over every pass, per tile of the block's causal range), solver sweeps, blocks at the sweep cap,
and rows that ended renormalised rather than certified. Two kinds of input:

* random: q, k, v ~ N(0, 1), 8 heads of dim 64 (NAPE: 4 ALiBi heads with slopes 1/h, 4 NoPE heads);
* trained: the q (times its q-scale) and k of every layer of a trained model (a run folder's last checkpoint)
  on one test example of the run's task at each length, scored as 1.5-entmax with the model's slopes.

--alpha sets α of the random rows (1.5 and 2 certify in closed form, others stop at a Newton step);
--tolerance counts the opt-in tolerance mode (rows may stop where |Σp − 1| ≤ EPS) instead of the exact solve;
--fold-from K counts the α = 1.5 forward whose sweeps from the K-th on also accumulate P·V, so that the sweep
certifying a whole block is its output pass too (triton_ops.FOLD_FROM); --top-scores K the α = 1.5 forward whose
max pass keeps each row's K largest scores (triton_ops.TOP_SCORES).

    TRITON_INTERPRET=1 python benchmarks/kernel_counts.py --out benchmarks/results/FILE.json \\
        [--lengths 1024 4096] [--run RUN_FOLDER] [--alpha 1.5] [--tolerance EPS] [--fold-from K] [--top-scores K]
    python benchmarks/kernel_counts.py --table benchmarks/results/FILE.json

The counts are exact and device-independent up to floating-point rounding (a GPU run counts the same way:
benchmarks/gpu_check.py); they take minutes at 4K keys in the interpreter.
"""

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from longsparse.attention import triton_entmax as te
from longsparse.attention import triton_ops
from longsparse.io import atomic_write_json

TILE = 64  # the CUDA configuration's BM = BN


def _summary(counts: dict, heads, label: str, N: int, source: str) -> dict:
    sweeps = counts["sweeps"][:, heads].float()
    visited = counts["tiles_visited"][:, heads].float()
    causal = counts["causal_tiles"][:, heads].float()
    return {
        "source": source,
        "N": N,
        "heads": label,
        "qk_passes_mean": (visited / causal.clamp(min=1)).mean().item(),
        "qk_passes_max": (visited / causal.clamp(min=1)).max().item(),
        "qk_passes_pooled": (visited.sum() / causal.sum()).item(),
        "sweeps_mean": sweeps.mean().item(),
        "sweeps_max": sweeps.max().item(),
        "blocks_at_cap": int((counts["sweeps"][:, heads] >= te._MAX_SWEEPS_EXACT).sum()),
        "uncertified_rows": int(counts["uncertified"][:, heads].sum()),
        "blocks": int(sweeps.numel()),
    }


def random_rows(N: int, seed: int = 0, alpha: float = 1.5, tolerance: float | None = None) -> list:
    H, D = 8, 64
    g = torch.Generator().manual_seed(seed + N)
    q, k, v = (torch.randn(1, H, N, D, generator=g) for _ in range(3))
    slopes = torch.tensor([1.0 / (h + 1) if h < H // 2 else 0.0 for h in range(H)])
    counts = te.solver_counts(q, k, v, alpha=alpha, is_causal=True, alibi_slopes=slopes, tolerance=tolerance)
    solve = {"alpha": alpha, "tolerance": tolerance}
    return [
        {**_summary(counts, slice(0, H // 2), "alibi", N, "random"), **solve},
        {**_summary(counts, slice(H // 2, H), "nope", N, "random"), **solve},
    ]


def capture_attention_inputs(run: str, N: int) -> list:
    """What each attention layer of a trained model (a run folder's last checkpoint) receives on one test example
    of its task at length N: [(q times its q-scale, k, ALiBi slopes or None, scale or None)] per layer."""
    import random

    from longsparse.evaluate.sweep import load_run_model
    from longsparse.nn import attention as nn_attention
    from longsparse.train.config import make_task

    model, cfg, _ = load_run_model(run, "last")
    task = make_task(cfg["task"])
    batch = task.batch(N, 1, rng=random.Random(20261127))
    seen = []
    original = nn_attention.attention

    def recording(q, k, v, **kw):
        seen.append((q.detach(), k.detach(), kw.get("q_scale"), kw.get("alibi_slopes"), kw.get("scale")))
        return original(q, k, v, **kw)

    nn_attention.attention = recording
    try:
        with torch.no_grad():
            model.eval()(batch.input_ids[:, :N])
    finally:
        nn_attention.attention = original
    out = []
    for q, k, q_scale, slopes, scale in seen:
        if q_scale is not None:
            q = q * (q_scale if q_scale.dim() == 4 else q_scale.unsqueeze(-1))
        out.append((q, k, slopes, scale))
    return out


def trained_rows(run: str, N: int) -> list:
    """Counts on the per-layer q, k of a trained model at length N (one test example)."""
    rows = []
    for layer, (q, k, slopes, scale) in enumerate(capture_attention_inputs(run, N)):
        H = q.shape[1]
        v = torch.zeros_like(k)
        counts = te.solver_counts(
            q.float(), k.float(), v.float(), alpha=1.5, is_causal=True, alibi_slopes=slopes, scale=scale
        )
        kinds = slopes if slopes is not None else torch.zeros(H)
        for label, heads in (("alibi", (kinds > 0).nonzero().flatten()), ("nope", (kinds == 0).nonzero().flatten())):
            if len(heads):
                rows.append({**_summary(counts, heads, label, N, f"trained:{Path(run).name}"), "layer": layer})
    return rows


def table(path: str) -> str:
    """A stored result as a markdown table (per source, length, layer and head kind)."""
    data = json.loads(Path(path).read_text())
    lines = [
        "| input | α | tolerance | N | layer | heads | QKᵀ passes mean / max | sweeps mean / max | blocks at cap "
        "| uncertified rows |",
        "|---|---:|---|---:|---:|---|---|---|---:|---:|",
    ]
    for r in data["rows"]:
        tol = r.get("tolerance")
        solve = "exact" if tol is None else str(tol)
        if r.get("fold_from", -1) >= 0:
            solve += f", output folded from sweep {r['fold_from']}"
        if r.get("top_scores", 0) > 0:
            solve += f", {r['top_scores']} largest scores kept"
        lines.append(
            f"| {r['source']} | {r.get('alpha', 1.5)} | {solve} | {r['N']} | "
            f"{r.get('layer', '-')} | {r['heads']} | {r['qk_passes_mean']:.2f} / "
            f"{r['qk_passes_max']:.0f} | {r['sweeps_mean']:.2f} / {r['sweeps_max']:.0f} | {r['blocks_at_cap']} | "
            f"{r['uncertified_rows']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON file to write")
    ap.add_argument("--table", metavar="JSON", help="print a stored result as a markdown table, and stop")
    ap.add_argument("--lengths", type=int, nargs="*", default=[1024, 4096])
    ap.add_argument("--run", help="a trained run folder: also count on its layers' q, k")
    ap.add_argument("--alpha", type=float, default=1.5, help="α of the random rows, in (1, 2]")
    ap.add_argument("--tolerance", type=float, help="count the tolerance mode with this bound on |Σp − 1|")
    ap.add_argument("--fold-from", type=int, default=-1, help="α = 1.5: the sweep from which P·V is accumulated")
    ap.add_argument("--top-scores", type=int, default=0, help="α = 1.5: the largest scores per row the max pass keeps")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table), end="")
        return 0
    if not args.out:
        ap.error("--out is required (the JSON file to write), unless --table")
    if not te._interpreter_mode():
        ap.error("set TRITON_INTERPRET=1 before the kernels are built (this script counts in the interpreter)")
    if not 1.0 < args.alpha <= 2.0:
        ap.error(f"--alpha {args.alpha} outside (1, 2]")
    problem = te.tolerance_problem(args.tolerance)
    if problem:
        ap.error(f"--tolerance: {problem}")
    if args.fold_from < -1 or (args.fold_from >= 0 and (args.alpha != 1.5 or args.tolerance is not None)):
        ap.error(f"--fold-from {args.fold_from}: a sweep index ≥ 0 (or −1: off), for the exact α = 1.5 solve only")
    top = args.top_scores
    if top < 0 or top > TILE or top & (top - 1) or (top and (args.alpha != 1.5 or args.tolerance is not None)):
        ap.error(f"--top-scores {top}: a power of two ≤ {TILE} (or 0: off), for the exact α = 1.5 solve only")
    if Path(args.out).exists():
        ap.error(f"--out {args.out} exists: choose a new file (stored results are not overwritten)")
    if args.run and not Path(args.run, "config.json").is_file():
        ap.error(f"--run {args.run}: not a run folder (no config.json)")
    triton_ops.INTERPRETER_BLOCK = TILE  # where the launches read it
    triton_ops.FOLD_FROM = args.fold_from
    triton_ops.TOP_SCORES = top
    data = {
        "benchmark": "kernel_counts",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "solver_points": {str(k): list(v) for k, v in te.SOLVER_POINTS.items()},
        "tile": TILE,
        "rows": [],
    }
    out = Path(args.out)
    for N in args.lengths:
        t0 = time.perf_counter()
        rows = random_rows(N, alpha=args.alpha, tolerance=args.tolerance)
        rows += trained_rows(args.run, N) if args.run else []
        for r in rows:
            if args.fold_from >= 0:
                r["fold_from"] = args.fold_from
            if top:
                r["top_scores"] = top
            r["seconds"] = round(time.perf_counter() - t0, 1)
            print(json.dumps(r), flush=True)
        data["rows"] += rows
        atomic_write_json(out, data, indent=1)  # after each length: a run cut short keeps what it counted
    return 0


if __name__ == "__main__":
    sys.exit(main())
