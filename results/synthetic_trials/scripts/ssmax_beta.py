"""The learned SSMax β (per layer, per scaled head) of run folders' last checkpoints, as JSON.

usage: python results/synthetic_trials/scripts/ssmax_beta.py OUT.json RUN_DIR [RUN_DIR ...]
"""
import json
import sys
from pathlib import Path

from longsparse.nn.checkpoint import read_checkpoint


def betas(run_dir: str) -> list[list[float]]:
    model = read_checkpoint(str(Path(run_dir) / "checkpoints" / "last.pt"))["model"]
    keys = sorted((k for k in model if k.endswith("scaler.beta")), key=lambda k: int(k.split(".")[1]))
    if not keys:
        sys.exit(f"{run_dir}: no SSMax β in its last checkpoint (not an ssmax run?)")
    return [[round(x, 4) for x in model[k].tolist()] for k in keys]   # keys are blocks.<layer>.attn.scaler.beta


def main(out: str, runs: list[str]) -> None:
    result = {run: betas(run) for run in runs}
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    for run, per_layer in result.items():
        print(run, per_layer)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
