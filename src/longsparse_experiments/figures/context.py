"""What the analyses share: the α values compared, the trained models of figures 3b, 4 and 5 (trained here and
cached when no runs are given), the ``Context`` every analysis gets and the ``Figure`` it returns."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional

from longsparse.io import read_jsonl
from longsparse.train.config import attention_of

ALPHAS = (1.25, 1.5, 2.0)


class Figure(NamedTuple):
    """What an analysis returns: its file stem (``figN_name``), its numbers (written as JSON), the function that
    plots them (``plot(data, png_path)``), the summary the driver prints and indexes, and extra index entries."""

    stem: str
    data: dict
    plot: Callable[[dict, Path], None]
    summary: dict
    extra: Optional[dict] = None


@dataclass
class Context:
    """What every analysis gets: the output folder, whether it is a --quick run and the trained models
    (``models``: per run {"dir", "label", "cfg", "model" in eval mode, "checkpoint", "val"}; ``meta``: what the
    JSON files say about them; ``train_lengths``: the first run's training length range)."""

    out: Path
    quick: bool
    models: List[dict] = field(default_factory=list)
    meta: List[dict] = field(default_factory=list)
    train_lengths: Optional[list] = None


# ---- trained models --------------------------------------------------------------------------------------
#: The models trained when no --runs are given: flip-flop (docs/method.md §5, write prob 0.1), the library's cpu
#: preset (src/longsparse/configs/flip_flop/cpu.toml: 2 layers, d_model 64, 4 heads × 16, GeGLU 128, AdamW lr 1e-3,
#: 400 steps, 40 warm-up, batch 32, train lengths U[32, 64], seed 0, 1 thread) with one validation at the end.
DEFAULT_RUNS = (
    ("softmax-nape", "softmax", "nape"),
    ("entmax-nape", "entmax", "nape"),
    ("asentmax-nape", "asentmax", "nape"),
    ("softmax-nope", "softmax", "nope"),
    ("entmax-nope", "entmax", "nope"),
    ("asentmax-nope", "asentmax", "nope"),
    ("entmax-alibi", "entmax", "alibi"),
    ("entmax-rope", "entmax", "rope"),
)
DEFAULT_TASK = "flip_flop"
DEFAULT_OVERRIDES = {"train": {"val_every": 0, "val_lengths": [64, 256], "val_samples": 64}}
QUICK_STEPS = 8
QUICK_OVERRIDES = {"train": {"val_lengths": [64], "val_samples": 8, "warmup_steps": QUICK_STEPS}}


def default_run_configs(quick: bool = False) -> Dict[str, dict]:
    """The resolved run config of each of the DEFAULT_RUNS by name (``quick``: QUICK_STEPS steps, QUICK_OVERRIDES
    merged over DEFAULT_OVERRIDES)."""
    from longsparse.train import build_config
    from longsparse.train.config import deep_merge

    overrides = deep_merge(DEFAULT_OVERRIDES, QUICK_OVERRIDES) if quick else DEFAULT_OVERRIDES
    return {
        name: build_config(
            DEFAULT_TASK,
            preset="cpu",
            method=method,
            positions=positions,
            seed=0,
            steps=QUICK_STEPS if quick else None,
            overrides=overrides,
        )
        for name, method, positions in DEFAULT_RUNS
    }


def ensure_default_runs(cache: Path, quick: bool = False, log: Callable[[str], None] = print) -> List[Path]:
    """Train (or find complete) the DEFAULT_RUNS under ``cache``; returns their run directories."""
    from longsparse.train import train

    dirs = []
    for name, cfg in default_run_configs(quick).items():
        d = Path(cache) / name
        t0 = time.perf_counter()
        res = train(cfg, str(d), printer=lambda s: None, progress=False)
        state = "found complete" if res.get("resumed") else "trained"
        log(f"  run {d}: {state} in {time.perf_counter() - t0:.0f} s (step {res['step']})")
        dirs.append(d)
    return dirs


def load_run(run: Path):
    """(model in eval mode, config dict, checkpoint name, validation record) of a run directory."""
    from longsparse.models import load_checkpoint
    from longsparse.train import checkpoint_path, read_config

    cfg = read_config(run)
    which = "best" if checkpoint_path(run, "best").exists() else "last"
    model, extra = load_checkpoint(str(checkpoint_path(run, which)))
    model.eval()
    val = extra.get("val")
    if val is None:
        mpath = Path(run) / "metrics.jsonl"
        if mpath.exists():
            recs = read_jsonl(mpath)  # tolerates a line torn by a killed training
            vals = [r["val"] for r in recs if "val" in r]
            val = vals[-1] if vals else None
    return model, cfg, which, val


def run_label(cfg: Mapping) -> str:
    m = attention_of(cfg)
    lab = f"{m['method']}/{m['positions']}"
    if m["method"] in ("entmax", "asentmax") and float(m.get("alpha", 1.5)) != 1.5:
        lab += f" (α={m['alpha']})"
    return lab


def long_example(cfg: Mapping, length: int, batch_size: int = 1, seed: int = 0, batch: bool = False):
    """Test-split example(s) of the run's task at ``length``: the input ids, or the whole Batch."""
    from longsparse.train import make_task

    task = make_task(cfg["task"])
    b = task.batch(length, batch_size=batch_size, seed=seed, split="test")
    return b if batch else b.input_ids


def load_models(ctx: Context, runs: Optional[Iterable[str | Path]], log: Callable[[str], None] = print) -> None:
    """Fill ``ctx`` with the models of ``runs`` (run directories), or without runs with the DEFAULT_RUNS trained
    (or found complete) in ``ctx.out/runs`` (``--quick``: ``ctx.out/runs/quick``)."""
    if runs:
        run_dirs = [Path(r) for r in runs]
    else:
        cache = ctx.out / "runs" / "quick" if ctx.quick else ctx.out / "runs"
        log(
            f"training/loading the default models in {cache} ({DEFAULT_TASK}, cpu preset"
            f"{', quick' if ctx.quick else ''})"
        )
        run_dirs = ensure_default_runs(cache, quick=ctx.quick, log=log)
    for r in run_dirs:
        model, cfg, which, val = load_run(r)
        ctx.models.append(
            {"dir": str(r), "label": run_label(cfg), "cfg": cfg, "model": model, "checkpoint": which, "val": val}
        )
    ctx.meta = [
        {
            "run": m["dir"],
            "label": m["label"],
            "checkpoint": m["checkpoint"],
            "validation": m["val"],
            "task": m["cfg"]["task"]["name"],
            "model": m["cfg"]["model"],
            "train": {k: m["cfg"]["train"][k] for k in ("steps", "batch_size", "lr", "seed", "train_lengths")},
        }
        for m in ctx.models
    ]
    ctx.train_lengths = ctx.models[0]["cfg"]["train"]["train_lengths"] if ctx.models else None
