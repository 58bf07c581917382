"""Which value tokens an mqmtar_inline run gets wrong, and whether an ambiguity of the context explains it.

Teacher-forced on the test split (seed 0). Each wrong token is put in one class:
  v1, key collision   the queried key shares exactly one of its tokens with another key of the context
  v1, other           any other wrong first value token
  v2, v1 collision    another value of the context starts with the same token as the queried value, so
                      "find v1 after <kv>, copy the next token" is ambiguous and only the key decides
  v2, v1 elsewhere    v1's token occurs elsewhere in the context (not right after <kv>)
  v2, other           any other wrong second value token
usage: python docs/results/trials/error_kinds.py OUT.json RUN[:best|last] ... [--length 64 --samples 1000]
"""
import argparse
import json

import torch

from longsparse.evaluate.sweep import load_run_model
from longsparse.tasks.base import IGNORE_INDEX
from longsparse.train.config import make_task


def error_kinds(run: str, which: str, length: int, samples: int) -> dict:
    model, cfg, extra = load_run_model(run, which)
    model.eval()
    task = make_task(cfg["task"])
    if task.name != "mqmtar_inline" or task.key_len != 2 or task.value_len != 2:
        raise SystemExit(f"{run}: needs mqmtar_inline with 2-token keys and values")
    batch = task.batch(length, samples, seed=0, split="test")
    with torch.no_grad():
        pred = model(batch.input_ids, attention_mask=batch.attention_mask).argmax(-1)
    kinds: dict[str, int] = {}     # wrong tokens per class
    totals: dict[str, int] = {}    # all labelled tokens per class (how often each ambiguity occurs)
    for i in range(samples):
        x, y = batch.input_ids[i].tolist(), batch.labels[i].tolist()
        ctx = x[:length]
        # (k1, k2) of every pair in the context: the two tokens before each <kv>
        keys = [(ctx[j - 2], ctx[j - 1]) for j in range(2, length) if ctx[j] == task.kv_id]
        for t, label in enumerate(y):
            if label == IGNORE_INDEX:
                continue
            if x[t] == task.kv_id:                       # the logits at <kv> predict v1
                k = (x[t - 2], x[t - 1])
                shared = any((a == k[0]) != (b == k[1]) for a, b in keys)
                kind = "v1, key collision" if shared else "v1, other"
            else:                                        # the logits at v1 predict v2
                v1 = x[t]
                after_kv = sum(ctx[j] == v1 and ctx[j - 1] == task.kv_id for j in range(1, length))
                kind = ("v2, v1 collision" if after_kv > 1 else
                        "v2, v1 elsewhere" if ctx.count(v1) > 1 else "v2, other")
            totals[kind] = totals.get(kind, 0) + 1
            if pred[i, t] != label:
                kinds[kind] = kinds.get(kind, 0) + 1
    wrong = ((pred != batch.labels) & (batch.labels != IGNORE_INDEX)).any(1)
    return {"run": run, "checkpoint": which, "step": extra.get("step"), "length": length, "samples": samples,
            "examples_wrong": int(wrong.sum()), "wrong_tokens": dict(sorted(kinds.items())),
            "all_tokens": dict(sorted(totals.items()))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("runs", nargs="+", help="RUN or RUN:best / RUN:last (default last)")
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--samples", type=int, default=1000)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for spec in a.runs:
        run, _, which = spec.partition(":")
        r = error_kinds(run, which or "last", a.length, a.samples)
        print(f"{r['run']} ({r['checkpoint']}, step {r['step']}) L={a.length}: {r['examples_wrong']}/{a.samples} "
              f"examples wrong; wrong tokens {r['wrong_tokens']}")
        rows.append(r)
    print(f"labelled tokens per class: {rows[-1]['all_tokens']}")
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
