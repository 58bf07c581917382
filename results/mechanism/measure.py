"""Attention mass on the queried pair in mqmtar_inline models (docs/reports/2026-11-27-mechanism-first-look.md).

    OMP_NUM_THREADS=1 PYTHONPATH=src python results/mechanism/measure.py RUN_DIR [RUN_DIR ...] --out FILE.json

For each run's last checkpoint and each length, examples of the test stream (seed STREAM) are run one at a time
through the model; a recorder on the `_capture` hook of every longsparse Attention layer recomputes the layer's
own attention map densely for the last rows only (the query blocks), so that 16,384-token contexts fit in memory.
For each scored row (the query block's <kv>, predicting v1, and v1, predicting v2) it keeps, per layer and head,
the probability mass on the queried pair's 5 context tokens, the normalised entropy and the largest weight. The
output JSON holds per run, length and example these per-row values plus the per-query correctness; the summary
tables are printed by `--summary FILE.json`. Resumable: a (run, length) already in FILE is skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from longsparse.evaluate.sweep import load_run_model
from longsparse.io import atomic_write_text
from longsparse.tasks import IGNORE_INDEX
from longsparse.train.config import make_task

STREAM = 20261130
LENGTHS = {64: 50, 1024: 50, 4096: 20, 16384: 5}


class LastRows:
    """A `_capture` recorder: the attention rows of the last ``m`` query positions of every layer."""

    def __init__(self, m: int):
        self.m, self.rows = m, {}

    @torch.no_grad()
    def record(self, attn, *, q, k, q_scale, attn_mask):
        m = self.m
        qs = None if q_scale is None else q_scale[..., -m:]
        p = attn.probabilities(q[:, :, -m:], k, qs, attn_mask)  # bottom-right causal alignment
        self.rows[attn.layer_idx] = p[0].float()  # (H, m, Nk)


def pair_start(ids: list[int], key: list[int], kv_id: int, end: int) -> int:
    """Index of the context's ``k1 k2 <kv>`` with this key (unique: keys in a context are distinct)."""
    n = len(key)
    hits = [i for i in range(end - n) if ids[i : i + n] == key and ids[i + n] == kv_id]
    if len(hits) != 1:
        raise ValueError(f"expected one context pair with key {key}, found {len(hits)}")
    return hits[0]


def measure_example(model, task, batch) -> dict:
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
        right = all(pred[i] == labels[i] for i in scored)
        queries.append({"right": right})
        for i in scored:
            per_layer = {}
            for L, p in rec.rows.items():
                row = p[:, i - first_q, : i + 1]  # (H, keys up to and including i)
                mass = row[:, start : start + kl + 1 + vl].sum(-1)
                n = torch.tensor(float(i + 1))
                ent = -(row.clamp_min(1e-30).log() * row).sum(-1) / n.log()
                per_layer[str(L)] = {
                    "mass": [round(x, 5) for x in mass.tolist()],
                    "entropy": [round(x, 5) for x in ent.tolist()],
                    "max": [round(x, 5) for x in row.max(-1).values.tolist()],
                }
            rows.append({"query": len(queries) - 1, "row": "v1" if i == scored[0] else "v2", "layers": per_layer})
    return {"exact": all(q["right"] for q in queries), "queries": queries, "rows": rows}


def run(args) -> int:
    torch.set_num_threads(1)
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.is_file() else {"stream": STREAM, "lengths": LENGTHS, "runs": {}}
    for run_dir in args.runs:
        model, cfg, extra = load_run_model(run_dir, "last", "cpu")
        model.eval()
        task = make_task(cfg["task"])
        r = data["runs"].setdefault(str(run_dir), {"step": int(extra["step"]), "method": cfg["model"]["method"]})
        for L, n in LENGTHS.items():
            if str(L) in r:
                continue
            rng = task.rng(STREAM, "test")
            t0, exs = time.perf_counter(), []
            for _ in range(n):
                exs.append(measure_example(model, task, task.batch(L, 1, rng=rng)))
            r[str(L)] = {"n": n, "seconds": round(time.perf_counter() - t0, 1), "examples": exs}
            atomic_write_text(out, json.dumps(data) + "\n")
            print(
                f"{run_dir} L={L}: {n} examples, {sum(e['exact'] for e in exs)} exact, "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    return 0


def summary(path: str) -> int:
    data = json.loads(Path(path).read_text())
    for run_dir, r in data["runs"].items():
        Ls = [L for L in map(str, data["lengths"]) if L in r]
        layers = sorted(r[Ls[0]]["examples"][0]["rows"][0]["layers"], key=int)
        H = len(r[Ls[0]]["examples"][0]["rows"][0]["layers"][layers[0]]["mass"])

        def mean(L, layer, head, what, right=None):
            vals = [
                row["layers"][layer][what][head]
                for e in r[L]["examples"]
                for row in e["rows"]
                if right is None or e["queries"][row["query"]]["right"] == right
            ]
            return (sum(vals) / len(vals), len(vals)) if vals else (float("nan"), 0)

        print(f"\n### {run_dir} ({r['method']}, step {r['step']})\n")
        print(
            "Exact match per length: "
            + ", ".join(f"{int(L) // 64}x {sum(e['exact'] for e in r[L]['examples'])}/{r[L]['n']}" for L in Ls)
        )
        print(
            "\n| layer | head | "
            + " | ".join(f"mass {int(L) // 64}x" for L in Ls)
            + " | "
            + " | ".join(f"entropy {int(L) // 64}x" for L in Ls)
            + " |"
        )
        print("|---" * (2 + 2 * len(Ls)) + "|")
        best = None
        for layer in layers:
            for h in range(H):
                ms = [mean(L, layer, h, "mass")[0] for L in Ls]
                es = [mean(L, layer, h, "entropy")[0] for L in Ls]
                if best is None or ms[0] > best[0]:
                    best = (ms[0], layer, h)
                print(
                    f"| {layer} | {h} | "
                    + " | ".join(f"{x:.3f}" for x in ms)
                    + " | "
                    + " | ".join(f"{x:.3f}" for x in es)
                    + " |"
                )
        _, layer, h = best
        print(
            f"\nRetrieval head (largest mass at 1x): layer {layer}, head {h}. Its mass on queries answered right /"
            " wrong (rows):"
        )
        for L in Ls:
            (a, na), (b, nb) = mean(L, layer, h, "mass", True), mean(L, layer, h, "mass", False)
            print(f"  {int(L) // 64}x: right {a:.3f} ({na} rows), wrong {b:.3f} ({nb} rows)")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*")
    p.add_argument("--out", help="the JSON file (created, or extended)")
    p.add_argument("--summary", help="print the tables of a measured JSON file and exit")
    a = p.parse_args(argv)
    if a.summary:
        return summary(a.summary)
    if not a.runs or not a.out:
        p.error("give RUN_DIR(s) and --out, or --summary FILE")
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
