"""Where the attention of mqmtar_inline runs goes (docs/results.md, section 1: the RoPE recipe search).

The direct lookup answers v1 at the query's `<kv>` by attending to the context v1 of the queried pair, and v2 at
the query's v1 by attending to that pair's context v2. On test examples (seed 0), per layer, averaged over heads:
  on_answer       attention of the query `<kv>` positions on the queried pair's context v1, and of the query v1
                  positions on its context v2 (the direct lookup)
  by_key_class    the attention mass of those query positions on each class of key position: BOS, the query
                  blocks, and in the context `<kv>`, key tokens, v1, v2, the `_` right after a pair's v2 and any
                  other `_`
usage: python results/synthetic_trials/scripts/rope_attention.py OUT.json RUN[:best|last] ... [--length 64 --samples 32]
"""
import argparse
import json

import torch

from longsparse.evaluate.sweep import load_run_model
from longsparse.nn.introspect import capture
from longsparse.train.config import make_task


def key_class(task, x: list[int], s: int, start: int, length: int) -> str:
    if s < start:
        return "BOS"
    if s >= start + length:
        return "query blocks"
    if x[s] == task.space_id:
        after_v2 = s - 3 >= start and x[s - 1] != task.space_id and x[s - 3] == task.kv_id
        return "_ after v2" if after_v2 else "_ other"
    if x[s] == task.kv_id:
        return "<kv>"
    if x[s - 1] == task.kv_id:
        return "v1"
    return "v2" if x[s - 2] == task.kv_id else "key"


def attention_profile(run: str, which: str, length: int, samples: int) -> dict:
    model, cfg, extra = load_run_model(run, which)
    model.eval()
    task = make_task(cfg["task"])
    if task.name != "mqmtar_inline" or task.key_len != 2 or task.value_len != 2:
        raise SystemExit(f"{run}: needs mqmtar_inline with 2-token keys and values")
    batch = task.batch(length, samples, seed=0, split="test")
    with torch.no_grad(), capture(model, what=("attn",)) as cap:
        model(batch.input_ids, attention_mask=batch.attention_mask)
    queries = []                         # (example, query <kv> position, its pair's context v1 position)
    classes = []                         # per example, the key class of every position
    for b in range(samples):
        x = batch.input_ids[b].tolist()
        start = x.index(task.query_id) - length           # the context: the L tokens before the first <Q>
        v1_at = {(x[t - 2], x[t - 1]): t + 1 for t in range(start, start + length) if x[t] == task.kv_id}
        queries += [(b, t, v1_at[(x[t - 2], x[t - 1])])
                    for t in range(start + length, len(x)) if x[t] == task.kv_id]
        classes.append([key_class(task, x, s, start, length) for s in range(len(x))])
    out = {"run": run, "checkpoint": which, "step": extra.get("step"), "length": length, "samples": samples,
           "queries": len(queries), "layers": []}
    for layer in cap.layers:
        p = cap[layer]["attn"].mean(1).tolist()            # (B, N, N), averaged over heads
        row = {}
        for name, shift in (("query <kv> -> v1", 0), ("query v1 -> v2", 1)):
            mass: dict[str, float] = {}
            on_answer = 0.0
            for b, t, a in queries:
                q = t + shift
                on_answer += p[b][q][a + shift]
                for c, w in zip(classes[b][:q + 1], p[b][q]):
                    mass[c] = mass.get(c, 0.0) + w
            row[name] = {"on_answer": round(on_answer / len(queries), 4),
                         "by_key_class": {c: round(m / len(queries), 4) for c, m in sorted(mass.items())}}
        out["layers"].append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("runs", nargs="+", help="RUN or RUN:best / RUN:last (default last)")
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--samples", type=int, default=32)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for spec in a.runs:
        run, _, which = spec.partition(":")
        r = attention_profile(run, which or "last", a.length, a.samples)
        print(f"{r['run']} ({r['checkpoint']}, step {r['step']}), L={a.length}, {r['queries']} queries")
        for i, layer in enumerate(r["layers"]):
            for name, v in layer.items():
                print(f"  layer {i} {name}: on the answer {v['on_answer']:.3f}; by key class {v['by_key_class']}")
        rows.append(r)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
