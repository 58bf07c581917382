"""Training-step time per method at a study's shape, all methods in one process, one after another.

One thread; 5 warm-up steps, then the mean of 20 steps (forward, loss, backward, AdamW step) on batches drawn
like the training loop's. Ratios to softmax are what to read: the machine's load moves absolute times.
usage: python results/synthetic_trials/scripts/step_time.py STUDY [METHOD ...]     (default: the study's methods)
"""
import random
import sys
import time

import torch
import torch.nn.functional as F

from longsparse.tasks.base import IGNORE_INDEX
from longsparse.train import build_config
from longsparse_experiments.reproduce import cells, load_study
from longsparse.train.config import build_model, make_task, resolve


def step_ms(study: dict, method: str, steps: int = 20) -> float:
    overrides = next(c["overrides"] for c in cells(study) if c["method"] == method)
    cfg = resolve(build_config(study["task"], preset=study["preset"], method=method,
                               positions=study["positions"][0], seed=0, overrides=overrides))
    task = make_task(cfg["task"])
    model = build_model(cfg["model"], task.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng, lengths, bs = random.Random(0), cfg["train"]["train_lengths"], cfg["train"]["batch_size"]

    def step():
        b = task.batch(lengths, bs, rng=rng)
        logits = model(b.input_ids)
        F.cross_entropy(logits.float().flatten(0, 1), b.labels.flatten(), ignore_index=IGNORE_INDEX).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1000


def main(name: str, methods: list[str]) -> None:
    torch.set_num_threads(1)
    study = next((s for s in load_study()["studies"] if s["name"] == name), None)
    if study is None:
        sys.exit(f"no study {name!r} in the study file")
    times = {m: step_ms(study, m) for m in methods or study["methods"]}
    base = times.get("softmax")
    for m, t in times.items():
        print(f"{name} {m:<9} {t:7.0f} ms/step" + (f"  {t / base:.2f}x softmax" if base else ""))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
