"""The HSA six-seed study (protocol docs/reports/2026-11-28-hsa-seeds.md): how often each variant trains, how far
those that train extrapolate, and the paired rows B1-B7 of docs/findings.md over the six seeds.

    longsparse findings hsa-seeds [--store results/hsa_seeds] [--out DIR]

reads the study's records (runs ``hsa_seeds/<variant>_s<seed>``; a later evaluation of a length wins) and prints,
or writes into ``DIR`` as ``analysis.json`` and ``analysis.md``:

* per variant, **k of n seeds train** (exact match ≥ 50 % at 256 tokens, 1×) with a 95 % Wilson interval for the
  rate, and every run's exact match by length;
* per variant, over the seeds that train, exact match at 16× and 64× per seed and pooled (Wilson over all their
  examples, marked pooled);
* per row, the paired difference A − B at 64× (16,384 tokens) per seed, over all seeds both variants have (a
  Student-t interval over seeds, nominal 95 %, and the exact sign-flip p) and over the seeds where both train;
  the protocol's verdict and its "robust" rule.

A study still running is analysed as far as its records go: every count says of how many seeds.
"""

from __future__ import annotations

from typing import Optional, Sequence

from longsparse.report.paired import is_robust, seed_summary
from longsparse.stats import wilson_interval
from longsparse_experiments.findings.output import store_analysis_command, summary_text

WRITER = "longsparse findings hsa-seeds"
#: The study's run folder prefix in the records' run names.
FOLDER = "hsa_seeds"
#: The variants in the study file's order.
VARIANTS = ("full", "dec_softmax", "swa", "mean", "encmean", "standard", "dense16", "sb2warm", "entmax")
#: The rows of docs/findings.md: (row, A, B, what A − B asks).
ROWS = (
    ("B1", "full", "dec_softmax", "HSA − softmax decoder (RoPE)"),
    ("B2", "full", "swa", "retrieval needed: HSA − sliding window only"),
    ("B3", "full", "mean", "CLS landmark − mean pooling"),
    ("B3b", "full", "encmean", "CLS landmark − encoder mean"),
    ("B4", "full", "standard", "bypassing residual − standard fusion"),
    ("B5", "full", "dense16", "top-4 − top-16 selection"),
    ("B6", "sb2warm", "full", "top-2 stick-breaking (warm-up) − top-4 softmax"),
    ("B7", "entmax", "full", "1.5-entmax chunk weights − top-4 softmax"),
)
TRAIN_LENGTH = 256
#: "Trains": exact match at least this at the training length (chance is 1/16).
TRAIN_BAR = 0.5
#: The primary length (64×) and the secondary one (16×).
ENDPOINT = 16384
SECONDARY = 4096
#: At least this many seeds where both train before a row can be called robust.
ROBUST_MIN_SEEDS = 3


def runs_by_variant(records: Sequence[dict]) -> dict[str, dict[int, dict[int, dict]]]:
    """{variant: {seed: {length: result}}} of the study's records (later records of a run and length win); variants
    in ``VARIANTS`` order, then any other, seeds ascending."""
    out: dict[str, dict[int, dict[int, dict]]] = {}
    for rec in records:
        folder, _, name = rec["run"].partition("/")
        variant, _, seed = name.rpartition("_s")
        if folder != FOLDER or not seed.isdigit():
            continue
        by_len = out.setdefault(variant, {}).setdefault(int(seed), {})
        for r in rec["results"]:
            by_len[int(r["length"])] = r
    order = {v: i for i, v in enumerate(VARIANTS)}
    return {v: dict(sorted(out[v].items())) for v in sorted(out, key=lambda v: (order.get(v, len(order)), v))}


def trains(result_by_length: dict[int, dict]) -> Optional[bool]:
    """Whether a run trains (exact match ≥ ``TRAIN_BAR`` at ``TRAIN_LENGTH``); None before that is evaluated."""
    r = result_by_length.get(TRAIN_LENGTH)
    return None if r is None else r["exact_match"] >= TRAIN_BAR


def _count(r: dict) -> int:
    """The examples a result answered right (its rate × n, which the evaluator computed as a count / n)."""
    return round(r["exact_match"] * r["n"])


def training_rate(seeds: dict[int, dict[int, dict]]) -> dict:
    """k of n evaluated seeds train, with the 95 % Wilson interval of the rate (percent)."""
    flags = [t for t in (trains(by_len) for by_len in seeds.values()) if t is not None]
    k, n = sum(flags), len(flags)
    lo, hi = wilson_interval(k, n)
    return {"k": k, "n": n, "wilson": [100 * lo, 100 * hi]}


def pooled(seeds: dict[int, dict[int, dict]], length: int) -> dict:
    """Exact match at ``length`` over the seeds that train, per seed and pooled (Wilson over all their examples)."""
    per_seed = {}
    for s, by_len in seeds.items():
        if trains(by_len) and length in by_len:
            r = by_len[length]
            lo, hi = wilson_interval(_count(r), r["n"])
            per_seed[s] = {"exact_match": 100 * r["exact_match"], "n": r["n"], "wilson": [100 * lo, 100 * hi]}
    right = sum(_count(seeds[s][length]) for s in per_seed)
    n = sum(r["n"] for r in per_seed.values())
    out: dict = {"length": length, "per_seed": per_seed}
    if n:
        lo, hi = wilson_interval(right, n)
        out["pooled"] = {"exact_match": 100 * right / n, "n": n, "seeds": len(per_seed), "wilson": [100 * lo, 100 * hi]}
    return out


def verdict(t_ci: Optional[Sequence[float]], p: Optional[float]) -> str:
    """The protocol's rule on the six-seed interval: "supported" (A > B) where the t-interval excludes 0 from below
    and p < 0.05, "reversed" (A < B) where it excludes 0 from above and p < 0.05, "inconclusive" where the interval
    allows both signs (or there is none), and "not significant" where the interval excludes 0 but p ≥ 0.05 (a tie
    or a seed of the other sign keeps the exact sign-flip test from 0.05), which the protocol's two words do not
    cover."""
    if t_ci is None or p is None or t_ci[0] <= 0 <= t_ci[1]:
        return "inconclusive"
    if p >= 0.05:
        return "not significant"
    return "supported" if t_ci[0] > 0 else "reversed"


def _paired(per_seed: list[dict]) -> dict:
    return {"seeds": [r["seed"] for r in per_seed], **seed_summary([r["d"] for r in per_seed])}


def compare_row(runs: dict, a: str, b: str, length: int = ENDPOINT) -> dict:
    """A − B at ``length`` (percentage points) per seed both have evaluated there, with each run's Wilson interval,
    whether both train and whether the intervals are disjoint; summaries over all those seeds and over the seeds
    where both train; the verdict (all seeds) and the protocol's robust rule (seeds where both train)."""
    ra, rb = runs.get(a, {}), runs.get(b, {})
    per_seed = []
    for s in sorted(set(ra) & set(rb)):
        if length not in ra[s] or length not in rb[s]:
            continue
        x, y = ra[s][length], rb[s][length]
        wa, wb = wilson_interval(_count(x), x["n"]), wilson_interval(_count(y), y["n"])
        per_seed.append(
            {
                "seed": s,
                "a": 100 * x["exact_match"],
                "b": 100 * y["exact_match"],
                "d": 100 * (x["exact_match"] - y["exact_match"]),
                "n": [x["n"], y["n"]],
                "a_trains": bool(trains(ra[s])),
                "b_trains": bool(trains(rb[s])),
                "disjoint": wa[0] > wb[1] or wb[0] > wa[1],
            }
        )
    both = [r for r in per_seed if r["a_trains"] and r["b_trains"]]
    all_seeds, both_train = _paired(per_seed), _paired(both)
    robust = is_robust(both, ROBUST_MIN_SEEDS)
    return {
        "a": a,
        "b": b,
        "length": length,
        "per_seed": per_seed,
        "all_seeds": all_seeds,
        "both_train": both_train,
        "verdict": verdict(all_seeds.get("t_ci"), all_seeds.get("p")),
        "robust": robust,
        "training": {"a": training_rate(ra), "b": training_rate(rb)},
    }


def analyse(records: Sequence[dict]) -> dict:
    """The whole analysis of the study's records (see the module docstring)."""
    runs = runs_by_variant(records)
    if not runs:
        raise ValueError(f"no {FOLDER}/<variant>_s<seed> runs in the records")
    return {
        "format": "longsparse-hsa-seeds-analysis",
        "train_length": TRAIN_LENGTH,
        "train_bar": TRAIN_BAR,
        "endpoint": ENDPOINT,
        "variants": {
            v: {
                "training": training_rate(seeds),
                "runs": {
                    str(s): {str(L): 100 * r["exact_match"] for L, r in sorted(by_len.items())}
                    for s, by_len in seeds.items()
                },
                "n": {str(s): {str(L): r["n"] for L, r in sorted(by_len.items())} for s, by_len in seeds.items()},
                "trained": {str(L): pooled(seeds, L) for L in (SECONDARY, ENDPOINT)},
            }
            for v, seeds in runs.items()
        },
        "rows": [
            {"row": row, "what": what, **compare_row(runs, a, b)} for row, a, b, what in ROWS if a in runs and b in runs
        ],
    }


def markdown(a: dict) -> str:
    """The analysis as markdown tables: training rates, per-run exact match, the trained seeds at 16× / 64×, rows."""
    lengths = sorted({int(L) for v in a["variants"].values() for r in v["runs"].values() for L in r})
    x = lambda L: f"{L // a['train_length']:,}×"  # noqa: E731
    lines = [
        f"Trains: exact match ≥ {100 * a['train_bar']:.0f} % at {a['train_length']} tokens. Intervals: Wilson 95 % "
        "for rates; Student-t over seeds (nominal 95 %) for paired differences, p the exact sign-flip p.",
        "",
        "| variant | trains (k of n) | rate, Wilson 95 % |",
        "|---|---|---|",
    ]
    for v, d in a["variants"].items():
        t = d["training"]
        lines.append(f"| {v} | {t['k']} of {t['n']} | [{t['wilson'][0]:.0f}, {t['wilson'][1]:.0f}] % |")
    lines += ["", "Exact match % per run (n examples at each length: see analysis.json):", ""]
    lines += ["| run | " + " | ".join(f"{L:,} ({x(L)})" for L in lengths) + " |", "|---" * (len(lengths) + 1) + "|"]
    for v, d in a["variants"].items():
        for s, r in d["runs"].items():
            lines.append(
                f"| {v} s{s} | " + " | ".join(f"{r[str(L)]:.1f}" if str(L) in r else "–" for L in lengths) + " |"
            )
    lines += ["", "Over the seeds that train, exact match %:", "", "| variant | length | per seed | pooled |"]
    lines.append("|---|---|---|---|")
    for v, d in a["variants"].items():
        for L, t in d["trained"].items():
            seeds = ", ".join(f"s{s} {r['exact_match']:.0f} (n {r['n']})" for s, r in t["per_seed"].items()) or "–"
            p = t.get("pooled")
            pooled_cell = (
                f"{p['exact_match']:.1f} [{p['wilson'][0]:.1f}, {p['wilson'][1]:.1f}] pooled, {p['seeds']} seeds"
                if p
                else "–"
            )
            lines.append(f"| {v} | {int(L):,} ({x(int(L))}) | {seeds} | {pooled_cell} |")
    lines += [
        "",
        f"Rows at {a['endpoint']:,} tokens ({x(a['endpoint'])}), A − B in points:",
        "",
        "| row | A − B | trains A / B | all seeds | where both train | verdict | robust |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in a["rows"]:
        ta, tb = r["training"]["a"], r["training"]["b"]
        lines.append(
            f"| {r['row']} | {r['a']} − {r['b']} ({r['what']}) | {ta['k']}/{ta['n']} vs {tb['k']}/{tb['n']} | "
            f"{summary_text(r['all_seeds'])} | {summary_text(r['both_train'])} | {r['verdict']} | "
            f"{'yes' if r['robust'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(args) -> int:
    return store_analysis_command(args.store, args.out, analyse, markdown, WRITER)
