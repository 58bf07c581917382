"""The per-measurement workers of bench_attention and bench_train_step, each a fresh process:
``python -m longsparse_experiments.bench --attention-worker ...`` / ``--train-step-worker JSON``."""

from __future__ import annotations

import json
import sys

import torch

from longsparse_experiments.bench.kernels import attention_worker
from longsparse_experiments.bench.training import train_step_worker

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--train-step-worker":
        print(json.dumps(train_step_worker(**json.loads(sys.argv[2]))))
    elif len(sys.argv) == 10 and sys.argv[1] == "--attention-worker":
        _, _, method, n, heads, dim, backward, reps, threads, interleave = sys.argv
        torch.set_num_threads(int(threads))
        print(
            json.dumps(
                attention_worker(
                    method, int(n), int(heads), int(dim), bool(int(backward)), int(reps), bool(int(interleave))
                )
            )
        )
    else:
        raise SystemExit(
            "usage: python -m longsparse_experiments.bench --attention-worker METHOD N H D BACKWARD "
            "REPEATS THREADS INTERLEAVE_SDPA"
        )
