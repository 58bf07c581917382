"""Compare a trial run's config.json with the configuration a study cell would train.

usage: python results/synthetic_trials/scripts/compare_config.py STUDY METHOD SEED TRIAL_RUN_DIR [POSITIONS]

Prints every differing field (empty output = identical), so that a trial can be adopted as a study cell
(copy its folder, without eval/, to runs/reproduce/STUDY/METHOD-POSITIONS-sSEED) only when nothing differs.
"""
import json
import sys
from pathlib import Path

from longsparse.train import build_config
from longsparse_experiments.reproduce import cells, load_study


def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def main(study_name, method, seed, trial_dir, positions="nape"):
    study = next((s for s in load_study()["studies"] if s["name"] == study_name), None)
    if study is None:
        sys.exit(f"no study {study_name!r} in the study file")
    cell = next((c for c in cells(study) if (c["method"], c["positions"], c["seed"]) == (method, positions, int(seed))),
                None)
    if cell is None:
        sys.exit(f"study {study_name!r} has no cell {method}/{positions}/seed {seed}")
    want = flat(build_config(study["task"], preset=study["preset"], method=method, positions=positions,
                             seed=int(seed), overrides=cell["overrides"]))
    have = flat(json.loads((Path(trial_dir) / "config.json").read_text()))
    diff = [(k, want.get(k, "<missing>"), have.get(k, "<missing>")) for k in sorted(set(want) | set(have))
            if want.get(k) != have.get(k)]
    for k, w, h in diff:
        print(f"{k}: study {w!r}  trial {h!r}")
    print(f"{len(diff)} differing field(s); cell run folder: {cell['run']}")


if __name__ == "__main__":
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    main(*sys.argv[1:])
