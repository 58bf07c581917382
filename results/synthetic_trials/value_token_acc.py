"""Which value tokens of mqmtar_inline runs are wrong (docs/results.md, section 1).

Teacher-forced on the test split (seed 0). Reports the accuracy on the first and the second value token — v1
is predicted at `<kv>` (the query's key matched against the context: a lookup two tokens back), v2 at v1 (find
v1 in the context, copy the token after it) — and puts every labelled token into one class, counting how many
there are and how many are wrong:
  v1, key collision   another key of the context has the same first or the same second token (not both)
  v1, other           any other first value token
  v2, v1 collision    another value of the context starts with the same token as the queried value, so
                      "find v1 after <kv>, copy the next token" is ambiguous and only the key decides
  v2, v1 elsewhere    v1's token occurs elsewhere in the context (not right after <kv>)
  v2, other           any other second value token
usage: python results/synthetic_trials/value_token_acc.py OUT.json RUN[:best|last] ... [--length 64 --samples 200]
"""

import argparse
import json

import torch

from longsparse.evaluate.sweep import load_run_model
from longsparse.tasks.base import IGNORE_INDEX
from longsparse.train.config import make_task


def token_class(task, x: list[int], t: int, length: int) -> str:
    """The class of the value token predicted at position t of example x (context = its first `length` tokens)."""
    ctx = x[:length]
    if x[t] == task.kv_id:  # the logits at <kv> predict v1
        k1, k2 = x[t - 2], x[t - 1]
        keys = [(ctx[j - 2], ctx[j - 1]) for j in range(2, length) if ctx[j] == task.kv_id]
        return "v1, key collision" if any((a == k1) != (b == k2) for a, b in keys) else "v1, other"
    v1 = x[t]  # the logits at v1 predict v2
    if sum(ctx[j] == v1 and ctx[j - 1] == task.kv_id for j in range(1, length)) > 1:
        return "v2, v1 collision"
    return "v2, v1 elsewhere" if ctx.count(v1) > 1 else "v2, other"


def value_token_acc(run: str, which: str, length: int, samples: int) -> dict:
    model, cfg, extra = load_run_model(run, which)
    model.eval()
    task = make_task(cfg["task"])
    if task.name != "mqmtar_inline" or task.key_len != 2 or task.value_len != 2:
        raise SystemExit(f"{run}: needs mqmtar_inline with 2-token keys and values")
    batch = task.batch(length, samples, seed=0, split="test")
    with torch.no_grad():
        pred = model(batch.input_ids, attention_mask=batch.attention_mask).argmax(-1)
    labelled = batch.labels != IGNORE_INDEX
    right = (pred == batch.labels)[labelled]  # row-major: v1, v2, v1, v2, ...
    wrong, total = {}, {}
    for i in range(samples):
        x = batch.input_ids[i].tolist()
        for t in labelled[i].nonzero().flatten().tolist():
            c = token_class(task, x, t, length)
            total[c] = total.get(c, 0) + 1
            if pred[i, t] != batch.labels[i, t]:
                wrong[c] = wrong.get(c, 0) + 1
    return {
        "run": run,
        "checkpoint": which,
        "step": extra.get("step"),
        "length": length,
        "samples": samples,
        "v1_acc": right[0::2].float().mean().item(),
        "v2_acc": right[1::2].float().mean().item(),
        "examples_wrong": int(((pred != batch.labels) & labelled).any(1).sum()),
        "wrong_tokens": dict(sorted(wrong.items())),
        "all_tokens": dict(sorted(total.items())),
    }


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
        print(
            f"{r['run']} ({r['checkpoint']}, step {r['step']}) L={a.length}: v1 {r['v1_acc']:.3f}  "
            f"v2 {r['v2_acc']:.3f}  examples wrong {r['examples_wrong']}/{a.samples}  wrong tokens "
            f"{r['wrong_tokens']}"
        )
        rows.append(r)
    if rows:
        print(f"labelled tokens per class: {rows[-1]['all_tokens']}")
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
