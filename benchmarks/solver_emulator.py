"""An exact emulator of the Triton forward's threshold solve for α = 1.5 on heads without ALiBi, per query block,
to compare solve strategies on the CPU in seconds (the instrumented kernel in Triton's interpreter,
benchmarks/kernel_counts.py, takes minutes per length). tests/experiments/test_solver_emulator.py checks two strategies
against the interpreter's committed counts: `two_point` against the forward before its solve changed
(kernel-counts-cpu-2026-11-27.json), `anchored` against the forward as it is (kernel-counts-cpu-2026-11-28.json).

* two_point: a first sweep at P0 points geometric over the bracket [−1, −n^{−1/2}], then sweeps at the bracket's
  two ends (lo, hi) until every row of the block has certified its τ;
* one_point: later sweeps at ONE point, the closed form of the latest sweep (from its lowest point above the
  root, else its highest point below) where it lies in the bracket, else the bracket's middle; a row whose next
  point would repeat its last ends at lo (renormalised, as the kernel's no-progress rule does);
* anchored (the kernel's, `ANCHOR` in triton_kernels/forward.py): `one_point`, with the first sweep folded into
  the max pass: its P0 points are placed from the row max of the block's diagonal tile (the first tile the pass
  visits), the only maximum known before the pass ends. That sweep proposes the first point and nothing else
  (no bound, no finish: its sums are taken relative to a different maximum, so only sweeps relative to the row
  max decide anything), and the P0-point sweep after the max pass is skipped.
* folded (the kernel's `FOLD_FROM`, off by default): `anchored`, with the output pass folded into the sweeps
  from sweep FOLD_FROM on: such a sweep also accumulates P·V at its point, and when it certifies every row of the block
  (none ended by the no-progress rule, none with s > 0 above half its smallest gap, where d − s computed from
  a rounded d would lose precision) that accumulation is the output and no output pass follows. A certified
  row's support at its point equals its support at τ, so the output at τ = t + s is exact from three
  accumulators over the support at t: Σ(x−t)²v − 2sΣ(x−t)v + s²Σv (and the backward's Σ u v from the last two).
  A sweep that fails to certify the block only cost its P·V work (counted in `pv_passes`).
* top (the kernel's `TOP_SCORES`, off by default): the max pass (tiles in order, no anchored sweep) also keeps each
  row's TOP_SCORES largest scores. Sorted scores decide the support exactly: x_k > τ_k (the closed form over the
  k largest) holds for k up to the support's size and fails after it, so a row whose support is smaller than
  TOP_SCORES (or that has at most TOP_SCORES keys) is certified with no sweep; the others know τ_T ≤ τ* ≤ x_T and
  sweep once at FIRST_POINTS points geometric over that bracket, then at one point as `one_point`.
* top_folded (both options on): `top`, with the output pass folded into its one-point sweeps from sweep FOLD_FROM
  on as `folded` does (the kernel counts the P0-point sweep after the max pass as sweep 0, so the first sweep
  that can fold is sweep max(1, FOLD_FROM)).

Counted per query block of 64 rows (CUDA's tile; BN = 64): QKᵀ passes (tiles whose logits were computed over
every pass, per causal tile), P·V passes (tiles whose values were accumulated, per causal tile), sweeps, rows that ended renormalised instead of certified, and point evaluations
(tile × sweep point pairs, per causal tile: the element-wise work of the sweeps, which a GPU pays beside the
QKᵀ tile). Live-tile lists are emulated as the kernel keeps them. τ is checked against a float64 solve.

    python benchmarks/solver_emulator.py --out benchmarks/results/FILE.json [--lengths 1024 4096] [--run RUN] \
        [--strategies anchored top top_folded] [--top-scores 16] [--fold-from 2]
    python benchmarks/solver_emulator.py --table benchmarks/results/FILE.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from longsparse.io import atomic_write_json

AM1 = 0.5  # α − 1
TILE = 64  # BM = BN of the CUDA configuration
STRATEGIES = ("two_point", "one_point", "anchored", "folded", "top", "top_folded")
FIRST_POINTS = 4  # SOLVER_POINTS[1][0]
MAX_SWEEPS = 24  # the kernel's _MAX_SWEEPS_EXACT
FOLD_FROM = 2  # `folded`, `top_folded`: the first sweep (0-based, after the max pass) that also accumulates P·V
TOP_SCORES = 16  # `top`: the largest scores per row the max pass keeps


def sweep_sums(X: torch.Tensor, points: torch.Tensor) -> tuple:
    """Per-point sums of a sweep over shifted scores X (R, N) (−inf where masked) at points (R, P): support
    count, Σw = Σd₊, Σp = Σd₊², the smallest positive gap and the largest non-positive one, each (R, P)."""
    d = X[:, None, :] - points[:, :, None]
    pos = d > 0
    dp = torch.where(pos, d, 0.0)
    inf = torch.tensor(math.inf)
    return (
        pos.float().sum(-1),
        dp.sum(-1),
        (dp * dp).sum(-1),
        torch.where(pos, d, inf).amin(-1),
        torch.where(pos, -inf, d).amax(-1),
    )


def bracket_update(points, sums, lo, hi, tau, active):
    """The kernel's `_bracket_update` for α = 1.5 (each point: bounds, the closed form τ_S of its support,
    the exact finish when S is certified), without its end rule. Returns (lo, hi, tau, active, certified,
    candidate): candidate (R,) is the closed form from the lowest point above the root, else from the highest
    point below it (nan where neither has one)."""
    cnt, sw, sp, mind, dneg = sums
    done = ~active
    new_tau = tau.clone()
    certified = torch.zeros_like(active)
    from_above = torch.full_like(lo, math.nan)
    from_below = torch.full_like(lo, math.nan)
    for pi in range(points.shape[1]):
        t, n, w, f = points[:, pi], cnt[:, pi], sw[:, pi], sp[:, pi] - 1.0
        below, has = f >= 0, w > 0
        newton = t + f * AM1 / torch.where(has, w, 1.0)
        disc = w * w - n * f
        s = f / torch.where(has, w + disc.clamp(min=0).sqrt(), 1.0)
        valid = has & (disc >= 0)
        lo = torch.where(active & below, torch.maximum(lo, t), lo)
        hi = torch.where(active & ~below, torch.minimum(hi, t), hi)
        lo = torch.where(active & below & has, torch.maximum(lo, torch.minimum(newton, hi)), lo)
        hi = torch.where(active & below & valid, torch.minimum(hi, t + s), hi)
        lo = torch.where(active & ~below & valid, torch.maximum(lo, torch.minimum(t + s, hi)), lo)
        fin = active & ~done & valid & torch.where(below, mind[:, pi] > s, dneg[:, pi] <= s)
        certified |= fin
        new_tau = torch.where(fin, t + s, new_tau)
        done |= fin
        from_below = torch.where(below & valid, t + s, from_below)
        from_above = torch.where(~below & valid & from_above.isnan(), t + s, from_above)
    candidate = torch.where(from_above.isnan(), from_below, from_above)
    return lo, hi, torch.where(active, new_tau, tau), active & ~done, certified, candidate


def geometric_points(lo: torch.Tensor, hi: torch.Tensor, P: int) -> torch.Tensor:
    """P points from lo to hi (both < 0), evenly spaced in log2(−t), as the kernel's first sweep (R, P)."""
    a, b = torch.log2(-lo), torch.log2(-hi)
    frac = torch.arange(P) / (P - 1)
    return -torch.exp2(a[:, None] + (b - a)[:, None] * frac[None, :])


def top_scores_solve(X: torch.Tensor, nkeys: torch.Tensor, lo, hi, T: int) -> tuple:
    """The kernel's `_top_solve`: what the T largest shifted scores of each row of X (R, N) decide. Returns
    (certified (R,), τ where certified, lo, hi)."""
    R = X.shape[0]
    top = X.topk(min(T, X.shape[1]), -1).values
    if top.shape[1] < T:
        top = torch.cat([top, torch.full((R, T - top.shape[1]), -math.inf)], -1)
    col = torch.arange(T)[None, :]
    valid = top > -math.inf
    xv = torch.where(valid, top, 0.0)
    k = valid.float().cumsum(-1)
    s1, s2 = xv.cumsum(-1), (xv * xv).cumsum(-1)
    tau_k = (s1 - (k - (k * s2 - s1 * s1)).clamp(min=0).sqrt()) / k.clamp(min=1)
    n_in = (valid & (top > tau_k)).sum(-1)
    decided = (n_in < T) | (nkeys <= T)
    n_sel = torch.where(decided, n_in, T)
    x_last = torch.where(col == n_sel[:, None] - 1, top, 0.0).sum(-1)
    x_next = torch.where(col == n_sel[:, None], top, -math.inf).amax(-1)
    d = torch.where(col < n_sel[:, None], top - x_last[:, None], 0.0)
    n, w, f = n_sel.float(), d.sum(-1), (d * d).sum(-1) - 1.0
    s = f / (w + (w * w - n * f).clamp(min=0).sqrt()).clamp(min=1e-30)
    tau = x_last + s
    certified = decided & (n_sel > 0) & (x_last > tau) & (x_next <= tau)
    x_T = top[:, T - 1]
    new_hi = torch.where(decided, hi, torch.minimum(hi, x_T))
    new_lo = torch.where(decided, lo, torch.minimum(torch.maximum(lo, tau), new_hi))
    return certified, tau, new_lo, new_hi


def _live_tiles(X: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """Which key tiles hold an entry above their row's floor, for some row (n_tiles,) bool."""
    R, N = X.shape
    above = (X - floor[:, None]) > 0
    return above.view(R, N // TILE, TILE).any(-1).any(0)


def solve_block(
    z: torch.Tensor,
    nkeys: torch.Tensor,
    strategy: str,
    first_points: int = FIRST_POINTS,
    top_scores: int = TOP_SCORES,
    fold_from: int = FOLD_FROM,
) -> dict:
    """Emulates one query block: z (R, N) raw logits (−inf where masked, N a multiple of the tile, the
    diagonal tile last), nkeys (R,) keys per row. Returns the block's counts and τ (R,)."""
    top_path = strategy in ("top", "top_folded")
    folding = strategy in ("folded", "top_folded")
    R, N = z.shape
    n_tiles = N // TILE
    m = z.amax(-1)
    X = AM1 * (z - m[:, None])
    lo = torch.full((R,), -1.0)
    hi = -nkeys.float().clamp(min=1).rsqrt()
    tau = lo.clone()
    active = nkeys > 1
    uncertified = 0
    point_evals = 0
    visited = n_tiles  # the max pass
    pv = 0
    output_folded = False
    proposal = None
    if strategy in ("anchored", "folded"):
        anchor = z[:, -TILE:].amax(-1)  # the diagonal tile's row max (each row holds its own key there)
        offset = AM1 * (anchor - m)
        pts = offset[:, None] + geometric_points(lo, hi, first_points)
        *_, candidate = bracket_update(pts, sweep_sums(X, pts), lo, hi, tau, active)
        proposal = torch.where((candidate >= lo) & (candidate <= hi), candidate, 0.5 * (lo + hi))
        point_evals += first_points * n_tiles
        # the max pass's list: tiles holding an entry within 1 (in X) of the row max seen so far, visiting the
        # diagonal tile first, then the others in order (a superset of the tiles live at the row max)
        order = [n_tiles - 1, *range(n_tiles - 1)]
        tile_max = z.view(R, n_tiles, TILE).amax(-1)[:, order]
        running = tile_max.cummax(-1).values
        live = torch.zeros(n_tiles, dtype=torch.bool)
        live[order] = (AM1 * (tile_max - running) > -1.0).any(0)
    if top_path:
        # the max pass's list, in order: tiles holding an entry within 1 (in X) of the running row max
        tile_max = z.view(R, n_tiles, TILE).amax(-1)
        live = (AM1 * (tile_max - tile_max.cummax(-1).values) > -1.0).any(0)
        certified, tau_top, lo, hi = top_scores_solve(X, nkeys, lo, hi, top_scores)
        tau = torch.where(active & certified, tau_top, tau)
        active = active & ~certified
    sweeps = 0
    while bool(active.any()) and sweeps < MAX_SWEEPS:
        floor = torch.where(active, lo, tau)
        if sweeps == 0 and top_path:
            pts = geometric_points(lo, hi, first_points)
            tiles = int(live.sum())
        elif sweeps == 0 and strategy not in ("anchored", "folded"):
            pts = geometric_points(lo, hi, first_points)
            tiles = n_tiles
        elif strategy == "two_point":
            pts = torch.stack([lo, hi], 1)
            tiles = int(live.sum())
        else:
            pts = proposal[:, None]
            tiles = int(live.sum())
        visited += tiles
        point_evals += pts.shape[1] * tiles
        live = _live_tiles(X, floor)  # the list the next pass reads: floors only rise
        was = active
        lo_in, hi_in = lo, hi
        sums = sweep_sums(X, pts)
        lo, hi, tau, active, certified, candidate = bracket_update(pts, sums, lo, hi, tau, active)
        proposal = torch.where((candidate >= lo) & (candidate <= hi), candidate, 0.5 * (lo + hi))
        if pts.shape[1] == 1:
            stuck = active & ((proposal == pts[:, 0]) | (hi <= lo))
        else:
            stuck = active & (((lo <= lo_in) & (hi >= hi_in)) | (hi <= lo))
        tau = torch.where(stuck, lo, tau)
        if folding and sweeps >= fold_from and pts.shape[1] == 1:
            pv += tiles
            # a row ended by the no-progress rule ends at lo, not at this sweep's point, and one with s > 0 above
            # half its smallest gap would lose precision in d − s: either needs the output pass
            s = torch.where(certified, tau - pts[:, 0], 0.0)  # rows finished before: at their τ in the kernel
            steep = (s > 0) & (s > 0.5 * sums[3][:, 0])
            output_folded = not bool(active.any()) and not bool(stuck.any()) and not bool(steep.any())
        active = active & ~stuck
        uncertified += int((was & ~active & ~certified).sum())
        sweeps += 1
        if output_folded:
            break
    tau = torch.where(active, lo, tau)
    uncertified += int(active.sum())
    if not output_folded:
        visited += int(live.sum())  # the output pass
        pv += int(live.sum())
    return {
        "sweeps": sweeps,
        "passes": visited / n_tiles,
        "pv_passes": pv / n_tiles,
        "point_evals": point_evals / n_tiles,
        "uncertified": uncertified,
        "tau": tau,
        "X": X,
    }


def exact_tau(X: torch.Tensor) -> torch.Tensor:
    """τ of 1.5-entmax of each row of X (R, N), in float64, from the sorted row: the k whose closed form
    τ_k (Σ_{i ≤ k} (x_i − τ)² = 1) satisfies x_k > τ_k ≥ x_{k+1}."""
    xs = X.double().sort(-1, descending=True).values
    xs = torch.where(xs.isinf(), -1e30, xs)
    k = torch.arange(1, xs.shape[1] + 1, dtype=torch.float64)
    s1, s2 = xs.cumsum(-1), (xs * xs).cumsum(-1)
    t = (s1 - (s1 * s1 - k * (s2 - 1)).clamp(min=0).sqrt()) / k
    nxt = torch.cat([xs[:, 1:], torch.full_like(xs[:, :1], -1e30)], -1)
    ok = (xs > t) & (t >= nxt)
    return torch.where(ok, t, torch.nan).nan_to_num(nan=-math.inf).amax(-1)


def random_logits(N: int, seed: int = 0, temperature: float = 1.0) -> list:
    """The NoPE heads of benchmarks/kernel_counts.py's random input (8 heads of dim 64, q, k, v ~ N(0, 1) from
    the generator seeded seed + N; heads 4–7 have slope 0), causal logits (4, N, N), times `temperature`."""
    H, D = 8, 64
    g = torch.Generator().manual_seed(seed + N)
    q, k, _ = (torch.randn(1, H, N, D, generator=g) for _ in range(3))
    z = temperature * (q[0, H // 2 :] @ k[0, H // 2 :].transpose(-1, -2)) / math.sqrt(D)
    return list(z.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), -math.inf))


def count(
    heads: list, strategy: str, check: bool = True, top_scores: int = TOP_SCORES, fold_from: int = FOLD_FROM
) -> dict:
    """Emulates every query block of causal logits heads [(N, N)]: the counts' means and maxima."""
    passes, pv, sweeps, evals, uncertified, err = [], [], [], [], 0, 0.0
    for z in heads:
        N = z.shape[0]
        for b in range(N // TILE):
            rows = slice(b * TILE, (b + 1) * TILE)
            nkeys = torch.arange(b * TILE + 1, (b + 1) * TILE + 1)  # causal: row i sees keys 0..i
            r = solve_block(z[rows, : (b + 1) * TILE], nkeys, strategy, top_scores=top_scores, fold_from=fold_from)
            passes.append(r["passes"])
            pv.append(r["pv_passes"])
            sweeps.append(r["sweeps"])
            evals.append(r["point_evals"])
            uncertified += r["uncertified"]
            if check:
                ok = nkeys > 1
                err = max(err, (r["tau"][ok].double() - exact_tau(r["X"][ok])).abs().max().item())
    return {
        "strategy": strategy,
        "qk_passes_mean": sum(passes) / len(passes),
        "qk_passes_max": max(passes),
        "pv_passes_mean": sum(pv) / len(pv),
        "sweeps_mean": sum(sweeps) / len(sweeps),
        "sweeps_max": max(sweeps),
        "point_evals_mean": sum(evals) / len(evals),
        "uncertified_rows": uncertified,
        "max_tau_error": err if check else None,
        "blocks": len(passes),
    }


def trained_logits(run: str, N: int) -> list:
    """The NoPE heads' causal logits (q times its q-scale, the model's scale) of every layer of a trained
    model on one test example of its task at length N: [(layer, [(N, N)])]."""
    from kernel_counts import capture_attention_inputs

    out = []
    for layer, (q, k, slopes, scale) in enumerate(capture_attention_inputs(run, N)):
        nope = [h for h in range(q.shape[1]) if slopes is None or float(slopes[h]) == 0.0]
        s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        z = s * (q[0, nope].float() @ k[0, nope].float().transpose(-1, -2))
        out.append((layer, list(z.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), -math.inf))))
    return out


def table(path: str) -> str:
    """A stored result as a markdown table."""
    data = json.loads(Path(path).read_text())
    lines = [
        "| input | N | layer | strategy | QKᵀ passes mean / max | sweeps mean / max | point evaluations per tile "
        "| uncertified rows | max abs τ error | P·V passes |",
        "|---|---:|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        err = "-" if r["max_tau_error"] is None else f"{r['max_tau_error']:.0e}"
        pv = f"{r['pv_passes_mean']:.2f}" if "pv_passes_mean" in r else "-"  # counted since `folded` exists
        lines.append(
            f"| {r['source']} | {r['N']} | {r.get('layer', '-')} | {r['strategy']} | {r['qk_passes_mean']:.2f} / "
            f"{r['qk_passes_max']:.0f} | {r['sweeps_mean']:.2f} / {r['sweeps_max']} | {r['point_evals_mean']:.1f} "
            f"| {r['uncertified_rows']} | {err} | {pv} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON file to write")
    ap.add_argument("--table", metavar="JSON", help="print a stored result as a markdown table, and stop")
    ap.add_argument("--lengths", type=int, nargs="*", default=[1024, 4096])
    ap.add_argument("--run", help="a trained run folder: also count on its layers' NoPE heads")
    ap.add_argument("--temperature", type=float, default=1.0, help="multiplies the random logits")
    ap.add_argument("--strategies", nargs="*", default=list(STRATEGIES), help=f"of {', '.join(STRATEGIES)}")
    ap.add_argument("--top-scores", type=int, default=TOP_SCORES, help="`top`: the largest scores kept per row")
    ap.add_argument(
        "--fold-from", type=int, default=FOLD_FROM, help="`folded`, `top_folded`: the first sweep that folds (>= 0)"
    )
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table), end="")
        return 0
    if not args.out:
        ap.error("--out is required (the JSON file to write), unless --table")
    if Path(args.out).exists():
        ap.error(f"--out {args.out} exists: choose a new file (stored results are not overwritten)")
    unknown = [x for x in args.strategies if x not in STRATEGIES]
    if unknown or not args.strategies:
        ap.error(f"--strategies {unknown or 'none'}: choose from {', '.join(STRATEGIES)}")
    top = args.top_scores
    if top < 1 or top > TILE or top & (top - 1):
        ap.error(f"--top-scores {top}: a power of two from 1 to the tile ({TILE})")
    if args.fold_from < 0:
        ap.error(f"--fold-from {args.fold_from}: the first folding sweep is 0 or later")
    bad = [n for n in args.lengths if n < TILE or n % TILE]
    if bad:
        ap.error(f"--lengths {bad}: each must be a positive multiple of the tile ({TILE})")
    if args.run and not Path(args.run, "config.json").is_file():
        ap.error(f"--run {args.run}: not a run folder (no config.json)")
    torch.set_num_threads(1)
    data = {
        "benchmark": "solver_emulator",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "first_points": FIRST_POINTS,
        "top_scores": top,
        "fold_from": args.fold_from,
        "tile": TILE,
        "temperature": args.temperature,
        "rows": [],
    }
    for N in args.lengths:
        inputs = [("random", None, random_logits(N, temperature=args.temperature))]
        if args.run:
            inputs += [(f"trained:{Path(args.run).name}", layer, z) for layer, z in trained_logits(args.run, N)]
        for source, layer, heads in inputs:
            for strategy in args.strategies:
                t0 = time.perf_counter()
                row = {"source": source, "N": N, **({"layer": layer} if layer is not None else {})}
                row |= count(heads, strategy, check=N <= 4096, top_scores=top, fold_from=args.fold_from)
                row["seconds"] = round(time.perf_counter() - t0, 1)
                print(json.dumps(row), flush=True)
                data["rows"].append(row)
        atomic_write_json(Path(args.out), data, indent=1)  # after each length: a run cut short keeps its rows
    return 0


if __name__ == "__main__":
    sys.exit(main())
