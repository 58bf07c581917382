"""The dispersion mechanism in trained ``mqmtar_inline`` models: how much attention each head puts on the queried
pair as the context grows, and whether that mass goes with the answers the model gets right.

    longsparse findings mechanism measure RUN_DIR [RUN_DIR ...] --out FILE.json[.gz] --stream S [--lengths 64:50,...]
    longsparse findings mechanism summary FILE.json [--json OUT.json]
    longsparse findings mechanism figure FILE.json --out PLOT.png

``measure``: for each run's last checkpoint and each length, examples of the task's ``test`` split drawn from the
stream ``S`` run one at a time through the model. A recorder on the ``_capture`` hook of every ``longsparse.nn``
Attention recomputes the layer's own attention map densely for the query block rows only (so that 16,384-token
contexts fit in memory). For each scored row (the query block's ``<kv>``, predicting v1, and v1, predicting v2)
it keeps per layer and head the probability mass on the queried pair's context tokens ``k1 k2 <kv> v1 v2``, the
normalised entropy H(p)/log n over the n keys the row may attend to, the largest weight and the support size (keys
with p > 0). The file is extended, never rewritten: a (run, length) already in it is skipped, and a file measured
with another stream or other lengths is refused.

``summary`` / ``analyse``: per run, the **retrieval head** (the layer and head with the largest mean mass on the
queried pair at the shortest length) and its mass, entropy and support at every length, with its mass on the rows
of queries answered right and wrong; per method, the seed-level drop of that mass from the shortest length and the
right − wrong difference, with Student-t intervals over seeds (labelled with their n) and the Spearman correlation
of the seeds' mass with their exact match.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from longsparse.io import atomic_write_bytes, atomic_write_text, claim_outputs
from longsparse.report.paired import t_mean_interval
from longsparse.tasks import IGNORE_INDEX
from longsparse.train.config import attention_of

WRITER = "longsparse findings mechanism"
#: The lengths (tokens) and examples per length of the first look (docs/reports/2026-11-27-mechanism-first-look.md).
DEFAULT_LENGTHS = {64: 50, 1024: 50, 4096: 20, 16384: 5}


class LastRows:
    """A ``_capture`` recorder: the attention rows of the last ``m`` query positions of every layer, as
    {layer index: (H, m, Nk) float32}."""

    def __init__(self, m: int):
        self.m, self.rows = m, {}

    @torch.no_grad()
    def record(self, attn, *, q, k, q_scale, attn_mask):
        m = self.m
        qs = None if q_scale is None else q_scale[..., -m:]
        p = attn.probabilities(q[:, :, -m:], k, qs, attn_mask)  # bottom-right causal alignment
        self.rows[attn.layer_idx] = p[0].float()


def pair_start(ids: Sequence[int], key: Sequence[int], kv_id: int, end: int) -> int:
    """Index in ``ids[:end]`` of the context's ``k1 k2 <kv>`` with this key; ValueError unless there is exactly one
    (keys in an mqmtar context are distinct)."""
    n = len(key)
    key = list(key)
    hits = [i for i in range(end - n) if list(ids[i : i + n]) == key and ids[i + n] == kv_id]
    if len(hits) != 1:
        raise ValueError(f"expected one context pair with key {key}, found {len(hits)}")
    return hits[0]


def row_statistics(row: torch.Tensor, start: int, width: int) -> dict:
    """Per head, of attention rows ``row`` (H, n) over the n keys a query may attend to: the mass on the keys
    ``start : start + width``, the normalised entropy H(p)/log n, the largest weight and the support size."""
    mass = row[:, start : start + width].sum(-1)
    n = row.shape[-1]
    ent = -torch.where(row > 0, row * row.clamp_min(1e-30).log(), row.new_zeros(())).sum(-1) / math.log(n)
    return {
        "mass": [round(x, 5) for x in mass.tolist()],
        "entropy": [round(x, 5) for x in ent.tolist()],
        "max": [round(x, 5) for x in row.max(-1).values.tolist()],
        "support": [int(x) for x in (row > 0).sum(-1).tolist()],
    }


def measure_example(model, task, batch) -> dict:
    """One example (batch of 1): ``exact`` (every query right), per query ``right``, and per scored row the
    ``row_statistics`` of every layer."""
    ids = batch.input_ids[0].tolist()
    labels = batch.labels[0].tolist()
    first_q = ids.index(task.query_id)
    T = len(ids)
    rec = LastRows(T - first_q)
    layers = [m for m in model.modules() if hasattr(m, "_capture") and hasattr(m, "layer_idx")]
    for lyr in layers:
        lyr._capture = rec
    try:
        with torch.no_grad():
            pred = model(batch.input_ids, attention_mask=batch.attention_mask).argmax(-1)[0].tolist()
    finally:
        for lyr in layers:
            lyr._capture = None
    kl, vl = task.key_len, task.value_len
    queries, rows = [], []
    for qpos in [i for i in range(first_q, T) if ids[i] == task.query_id]:
        key = ids[qpos + 1 : qpos + 1 + kl]
        start = pair_start(ids, key, task.kv_id, first_q)
        scored = [i for i in range(qpos + 1 + kl, qpos + 1 + kl + vl) if labels[i] != IGNORE_INDEX]
        queries.append({"right": all(pred[i] == labels[i] for i in scored)})
        for i in scored:
            per_layer = {
                str(L): row_statistics(p[:, i - first_q, : i + 1], start, kl + 1 + vl) for L, p in rec.rows.items()
            }
            rows.append({"query": len(queries) - 1, "row": "v1" if i == scored[0] else "v2", "layers": per_layer})
    return {"exact": all(q["right"] for q in queries), "queries": queries, "rows": rows}


def load(path: str | Path) -> dict:
    """A measured file (``.json``, or gzip-compressed ``.json.gz``)."""
    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)


def dump(path: str | Path, data: dict) -> None:
    """Write ``data`` to ``path`` atomically, gzip-compressed (with no time stamp, so that equal data give equal
    bytes) where the name ends in ``.gz``."""
    text = json.dumps(data) + "\n"
    if str(path).endswith(".gz"):
        atomic_write_bytes(path, gzip.compress(text.encode(), mtime=0))
    else:
        atomic_write_text(path, text)


def parse_lengths(text: str) -> dict[int, int]:
    """``"64:50,1024:50"`` -> {64: 50, 1024: 50}; ValueError naming a malformed item."""
    out = {}
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--lengths takes LENGTH:EXAMPLES items such as 64:50, got {item.strip()!r}")
        out[int(parts[0])] = int(parts[1])
    return out


def measure(run_dirs: Sequence[str], out: str | Path, stream: int, lengths: dict[int, int], printer=print) -> dict:
    """Measure each run's last checkpoint at ``lengths`` ({tokens: examples}) on the test stream ``stream`` into
    ``out`` (created, or extended: a (run, length) already there is kept and skipped; written atomically after
    each length). ValueError if ``out`` was measured with another stream or other lengths."""
    from longsparse.evaluate.sweep import load_run_model
    from longsparse.train.config import make_task

    out = Path(out)
    want = {str(L): n for L, n in lengths.items()}
    if out.is_file():
        data = load(out)
        have = {str(L): n for L, n in data["lengths"].items()}
        if data["stream"] != stream or have != want:
            raise ValueError(
                f"{out} was measured with stream {data['stream']} and lengths {have}, not {stream} and {want}; "
                "write to another file"
            )
    else:
        data = {"stream": stream, "lengths": want, "runs": {}}
    for run_dir in run_dirs:
        model, cfg, extra = load_run_model(run_dir, "last", "cpu")
        model.eval()
        task = make_task(cfg["task"])
        r = data["runs"].setdefault(
            str(run_dir),
            {"step": int(extra["step"]), "method": attention_of(cfg)["method"], "seed": cfg["train"]["seed"]},
        )
        for L, n in lengths.items():
            if str(L) in r:
                continue
            rng = task.rng(stream, "test")
            t0 = time.perf_counter()
            exs = [measure_example(model, task, task.batch(L, 1, rng=rng)) for _ in range(n)]
            r[str(L)] = {"n": n, "seconds": round(time.perf_counter() - t0, 1), "examples": exs}
            dump(out, data)
            printer(f"{run_dir} L={L}: {n} examples, {sum(e['exact'] for e in exs)} exact, {r[str(L)]['seconds']} s")
    return data


# ---- analysis -------------------------------------------------------------------------------------------------
def _mean(xs: list) -> Optional[float]:
    return statistics.fmean(xs) if xs else None


def _head_means(r: dict, L: str, layer: str, head: int, what: str, right: Optional[bool] = None) -> tuple:
    """(mean over rows, rows) of ``what`` at (layer, head), over the rows of queries answered ``right`` (None:
    all rows); mean None without rows."""
    vals = [
        row["layers"][layer][what][head]
        for e in r[L]["examples"]
        for row in e["rows"]
        if right is None or e["queries"][row["query"]]["right"] == right
    ]
    return _mean(vals), len(vals)


def ranks(xs: Sequence[float]) -> list[float]:
    """Ranks 1..n of ``xs``, ties at their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    """Spearman's ρ (Pearson's r of the ranks); None for fewer than 3 pairs or a constant series."""
    if len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def _seed_stats(values: list) -> dict:
    """Per-seed ``values`` (None dropped): n, mean, the 95 % Student-t interval over seeds (None below 2), and
    how many are > 0."""
    xs = [v for v in values if v is not None]
    ci = t_mean_interval(xs, bounds=(-1.0, 1.0))
    return {
        "n": len(xs),
        "mean": _mean(xs),
        "t95": None if ci is None else list(ci),
        "positive": sum(x > 0 for x in xs),
    }


def analyse_run(r: dict, lengths: Sequence[str]) -> dict:
    """One run's retrieval head (largest mean mass on the queried pair at the shortest length) and, per length,
    the examples measured, exact matches and that head's mean mass / entropy / support, all rows and by the
    queries answered right and wrong."""
    Ls = [L for L in lengths if L in r]
    first = r[Ls[0]]["examples"][0]["rows"][0]["layers"]
    heads = [(layer, h) for layer in sorted(first, key=int) for h in range(len(first[layer]["mass"]))]
    layer, head = max(heads, key=lambda lh: _head_means(r, Ls[0], lh[0], lh[1], "mass")[0])
    per_length = {}
    for L in Ls:
        right, n_right = _head_means(r, L, layer, head, "mass", True)
        wrong, n_wrong = _head_means(r, L, layer, head, "mass", False)
        has_support = "support" in r[L]["examples"][0]["rows"][0]["layers"][layer]
        per_length[L] = {
            "n": r[L]["n"],
            "exact": sum(e["exact"] for e in r[L]["examples"]),
            "mass": _head_means(r, L, layer, head, "mass")[0],
            "entropy": _head_means(r, L, layer, head, "entropy")[0],
            "support": _head_means(r, L, layer, head, "support")[0] if has_support else None,
            "mass_right": right,
            "rows_right": n_right,
            "mass_wrong": wrong,
            "rows_wrong": n_wrong,
        }
    return {
        "method": r["method"],
        "seed": r.get("seed"),
        "step": r["step"],
        "head": [int(layer), head],
        "lengths": per_length,
    }


def analyse(data: dict) -> dict:
    """``{"runs": {run: analyse_run}, "methods": {method: per length: drop, right_minus_wrong, spearman}}`` of a
    measured file. ``drop``: the retrieval head's mass at the shortest length minus at this one, per seed;
    ``right_minus_wrong``: its mass on rows of queries answered right minus wrong (seeds with both);
    ``spearman``: ρ between the seeds' mass and their exact-match fraction at this length."""
    lengths = sorted(data["lengths"], key=int)
    runs = {name: analyse_run(r, lengths) for name, r in data["runs"].items()}
    methods: dict[str, Any] = {}
    for method in dict.fromkeys(a["method"] for a in runs.values()):
        mine = [a for a in runs.values() if a["method"] == method]
        out = {"seeds": [a["seed"] for a in mine], "lengths": {}}
        for L in lengths:
            have = [a for a in mine if L in a["lengths"]]
            if not have:
                continue
            base = [a["lengths"][min(a["lengths"], key=int)]["mass"] for a in have]
            stats = [a["lengths"][L] for a in have]
            diffs = [
                None if s["mass_right"] is None or s["mass_wrong"] is None else s["mass_right"] - s["mass_wrong"]
                for s in stats
            ]
            out["lengths"][L] = {
                "mass": [s["mass"] for s in stats],
                "exact": [s["exact"] / s["n"] for s in stats],
                "drop": _seed_stats([b - s["mass"] for b, s in zip(base, stats)]),
                "right_minus_wrong": _seed_stats(diffs),
                "spearman": spearman([s["mass"] for s in stats], [s["exact"] / s["n"] for s in stats]),
            }
        methods[method] = out
    return {"stream": data["stream"], "lengths": lengths, "runs": runs, "methods": methods}


def _fmt(x: Optional[float], spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def _ci(s: dict) -> str:
    if s["t95"] is None:
        return f"{_fmt(s['mean'])} (n {s['n']})"
    return f"{_fmt(s['mean'])} [{s['t95'][0]:.3f}, {s['t95'][1]:.3f}] (t, n {s['n']})"


def summary_text(a: dict) -> str:
    """The tables of ``analyse``'s result as Markdown."""
    Ls = a["lengths"]
    x = {L: f"{int(L) // int(Ls[0])}x" for L in Ls}
    lines = [f"Test stream {a['stream']}; lengths " + ", ".join(f"{x[L]} = {L}" for L in Ls), ""]
    lines += ["### Per run: the retrieval head (largest mass on the queried pair at the shortest length)", ""]
    cols = " | ".join(f"{x[L]}: exact, mass (right / wrong), entropy, support" for L in Ls)
    lines += [f"| method | seed | step | head | {cols} |", "|---" * (4 + len(Ls)) + "|"]
    for a_run in a["runs"].values():
        cells = []
        for L in Ls:
            s = a_run["lengths"].get(L)
            if s is None:
                cells.append("")
                continue
            cells.append(
                f"{s['exact']}/{s['n']}, {_fmt(s['mass'])} ({_fmt(s['mass_right'])} / {_fmt(s['mass_wrong'])}), "
                f"{_fmt(s['entropy'])}, {_fmt(s['support'], '.1f')}"
            )
        layer, head = a_run["head"]
        lines.append(
            f"| {a_run['method']} | {a_run['seed']} | {a_run['step']} | L{layer} H{head} | " + " | ".join(cells) + " |"
        )
    lines += ["", "### Per method, over seeds (95 % Student-t intervals; nominal coverage, n seeds given)", ""]
    lines += [
        "| method | length | drop of mass from the shortest length | right − wrong mass | seeds with right > "
        "wrong | Spearman ρ (mass, exact) |",
        "|---|---|---|---|---|---|",
    ]
    for method, m in a["methods"].items():
        for L, s in m["lengths"].items():
            rw = s["right_minus_wrong"]
            lines.append(
                f"| {method} | {x[L]} | {_ci(s['drop'])} | {_ci(rw)} | {rw['positive']} of {rw['n']} | "
                f"{_fmt(s['spearman'], '.2f')} |"
            )
    return "\n".join(lines) + "\n"


def figure(a: dict, path: str | Path) -> None:
    """Mass on the queried pair of each run's retrieval head against length (log scale), one line per seed,
    one colour per method; written atomically to ``path`` (PNG)."""
    from longsparse_experiments.figures.style import color_cycle, pyplot, save

    plt = pyplot()
    colors = dict(zip(a["methods"], color_cycle()))
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    seen = set()
    for r in a["runs"].values():
        Ls = sorted(r["lengths"], key=int)
        label = None if r["method"] in seen else r["method"]
        seen.add(r["method"])
        ax.plot(
            [int(L) for L in Ls],
            [r["lengths"][L]["mass"] for L in Ls],
            "o-",
            lw=1,
            ms=3,
            color=colors[r["method"]],
            label=label,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("retrieval head: mass on queried pair")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    save(fig, Path(path))


def main_measure(args) -> int:
    torch.set_num_threads(1)
    measure(args.runs, args.out, args.stream, parse_lengths(args.lengths) if args.lengths else DEFAULT_LENGTHS)
    return 0


def main_summary(args) -> int:
    a = analyse(load(args.file))
    print(summary_text(a), end="")
    if args.json:
        claim_outputs(Path(args.json).parent, [Path(args.json).name], WRITER)
        atomic_write_text(Path(args.json), json.dumps(a, indent=1) + "\n")
    return 0


def main_figure(args) -> int:
    claim_outputs(Path(args.out).parent, [Path(args.out).name], WRITER)
    figure(analyse(load(args.file)), args.out)
    print(f"wrote {args.out}")
    return 0
