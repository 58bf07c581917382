"""Accuracy on the first vs the second value token of mqmtar_inline runs (docs/results.md, RoPE section).

v1 is predicted at `<kv>` (it needs the query's key matched against the context: a lookup two tokens back),
v2 at v1 (a plain induction step: find v1 in the context, copy the token after it). Teacher-forced, test split,
seed 0.  usage: python docs/results/value_token_acc.py OUT.json RUN[:best|last] ... [--length 64 --samples 200]
"""
import argparse
import json

import torch

from longsparse.evaluate.sweep import load_run_model
from longsparse.tasks.base import IGNORE_INDEX
from longsparse.train.config import make_task


def value_token_acc(run: str, which: str, length: int, samples: int) -> dict:
    model, cfg, extra = load_run_model(run, which)
    model.eval()
    if cfg["task"]["name"] != "mqmtar_inline":
        raise SystemExit(f"{run}: task {cfg['task']['name']!r}, expected mqmtar_inline")
    task = make_task(cfg["task"])
    if task.value_len != 2:
        raise SystemExit(f"{run}: value_len {task.value_len}, this script assumes 2")
    batch = task.batch(length, samples, seed=0, split="test")
    with torch.no_grad():
        pred = model(batch.input_ids, attention_mask=batch.attention_mask).argmax(-1)
    labelled = batch.labels != IGNORE_INDEX
    right = (pred == batch.labels)[labelled]      # row-major: v1, v2, v1, v2, ...
    return {"run": run, "checkpoint": which, "step": extra.get("step"), "length": length, "samples": samples,
            "v1_acc": right[0::2].float().mean().item(), "v2_acc": right[1::2].float().mean().item()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("runs", nargs="+", help="RUN or RUN:best / RUN:last (default last)")
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--samples", type=int, default=200)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for spec in a.runs:
        run, _, which = spec.partition(":")
        r = value_token_acc(run, which or "last", a.length, a.samples)
        print(f"{r['run']} ({r['checkpoint']}, step {r['step']}) L={a.length}: "
              f"v1 {r['v1_acc']:.3f}  v2 {r['v2_acc']:.3f}")
        rows.append(r)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
