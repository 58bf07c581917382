"""The GPU rows of the compiled training step and the flex backend (longsparse_experiments.bench_gpu_train): its
model is the GPU-scale study's, a budget it cannot meet leaves every row marked as skipped (JSON-able), and a dry
run on the CPU goes through every part (slow: it compiles FlexAttention on the CPU)."""

import json
from importlib import resources

import pytest

from longsparse.train.config import load_toml
from longsparse_experiments import bench_gpu_train as bench


def test_the_model_is_the_gpu_scale_study_model():
    path = resources.files("longsparse_experiments") / "configs" / "reproduce" / "gpu_scale.toml"
    overrides = load_toml(str(path))["study"][0]["overrides"]
    flat = {f"{section}.{k}": v for section, table in overrides.items() for k, v in table.items()}
    assert {k: flat[k] for k in bench.GPU_SCALE_SETS} == bench.GPU_SCALE_SETS


def test_a_spent_budget_skips_every_row_and_stays_json():
    out = bench.gpu_train_rows(0.0, device="cpu", dry=True, start=0.0)
    json.dumps(out)
    assert out["rows"] and all(r.get("skipped") == "budget" for r in out["rows"])
    assert {r["part"] for r in out["rows"]} == {"forward", "train", "eval"}


def test_unknown_parts_are_refused():
    with pytest.raises(ValueError, match="unknown parts"):
        bench.gpu_train_rows(1.0, device="cpu", parts=("forward", "speed"))


@pytest.mark.slow
def test_dry_run_on_the_cpu_fills_every_row():
    out = bench.gpu_train_rows(900.0, device="cpu", dry=True)
    json.dumps(out)
    rows = out["rows"]
    assert not [r for r in rows if "error" in r or "skipped" in r]
    train = [r for r in rows if r["part"] == "train"]
    assert len(train) == 2 and all(r["compiled_vs_eager"] > 0 for r in train)
    # same initial weights and data stream: the compiled step's losses are the eager step's
    for r in train:
        assert r["compiled_warmup_losses"] == pytest.approx(r["eager_warmup_losses"], rel=1e-4)
    fwd = [r for r in rows if r["part"] == "forward" and r["method"] == "flex"]
    assert fwd and all(r["max_abs_diff_vs_sdpa_blocks"] < 1e-4 for r in fwd)
    assert all(r["seconds_per_example"] > 0 for r in rows if r["part"] == "eval")
