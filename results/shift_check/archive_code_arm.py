"""Shift check, arm C: train and evaluate the headline's softmax seed 1 with the code that trained the archive.

Run with the archive-era tree first on the path (commit cccaf1e, the commit that recorded the archive's softmax
seed-1 result; its study runner predates study-file test streams, so this calls its own train/evaluate functions
the way its `reproduce` did), one thread:

    OMP_NUM_THREADS=1 PYTHONPATH=<cccaf1e tree>/src python results/shift_check/archive_code_arm.py OUT_DIR

Resumable: training resumes from the last checkpoint, an evaluation already in OUT_DIR/eval is skipped.
Protocol: docs/reports/2026-11-27-shift-check.md.
"""

import json
import sys
from pathlib import Path

from longsparse.evaluate import evaluate_run
from longsparse.train import build_config, train

# The headline recipe as the archive-era synthetic.toml gave it (study mqmtar_inline_3l_lr4e-3_4k).
SETS = [
    "model.n_layers=3",
    "model.d_model=64",
    "model.d_ff=128",
    "train.steps=4000",
    "train.lr=4e-3",
    "train.warmup_steps=100",
    "train.batch_size=64",
    "train.val_lengths=[48, 64]",
    "train.val_samples=64",
    "train.val_every=250",
    "train.ckpt_every=250",
    "train.log_every=100",
]
# (test seed, samples, lengths): the archive's stream and spec, then the pre-registered stream at 1x-64x.
EVALS = [
    (0, 1000, [64]),
    (0, 200, [128, 256, 512, 1024]),
    (0, 50, [2048, 4096]),
    (20261126, 1000, [64]),
    (20261126, 200, [1024, 4096]),
]


def done(run: Path) -> set:
    out = set()
    for f in sorted((run / "eval").glob("*.json")) if (run / "eval").is_dir() else []:
        try:
            d = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if d.get("checkpoint") == "last":
            out.update((d.get("seed"), d.get("samples"), int(r["length"])) for r in d.get("results", []))
    return out


def main(out: str) -> None:
    run = Path(out) / "shift_headline" / "softmax-nape-s1"
    cfg = build_config("mqmtar_inline", preset="cpu", method="softmax", positions="nape", seed=1, sets=SETS)
    res = train(cfg, str(run), progress=False, printer=lambda s: None)
    print(f"trained to step {res['step']}, loss {res['first_loss']:.3f} -> {res['last_loss']:.3f}", flush=True)
    for seed, n, lengths in EVALS:
        todo = [L for L in lengths if (seed, n, L) not in done(run)]
        if todo:
            evaluate_run(run, todo, samples=n, checkpoint="last", seed=seed)


if __name__ == "__main__":
    main(sys.argv[1])
