"""The GPU-scale study (benchmarks/gpu_scale.py, a thin wrapper over `longsparse reproduce`; docs/gpu.md) on the
CPU: its study files, the dry-run study, the wrapper's job on a small study and its summary, and (slow) the whole
dry run of benchmarks/gpu_scale.sh twice, the second job resumed from the first one's bundles, against one call."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers.benchmarks import benchmark_script
from helpers.paths import REPO_ROOT

from longsparse.report import store as result_store
from longsparse_experiments.presets import presets_dir
from longsparse_experiments.study import load_study

REPO = REPO_ROOT
pytestmark = pytest.mark.usefixtures("one_thread")


def _module():
    return benchmark_script("gpu_scale")


gs = _module()


def _mini_study(tmp: Path, seeds=(200,), methods=("softmax",)) -> Path:
    """The gpu_scale study reduced to a few cells with the dry run's tiny model."""
    p = tmp / "mini.toml"
    p.write_text(
        f"""[[study]]
name = "mini"
task = "mqmtar"
preset = "paper"
methods = {json.dumps(list(methods))}
positions = ["nape"]
seeds = {json.dumps(list(seeds))}
checkpoints = ["last"]
test_seed = 7
lengths = [64, 256]
id_samples = 4
samples = 5
long_from = 256
"""
        + "\n".join(gs.toml_table("study.overrides", gs.DRY_OVERRIDES))
        + "\n"
    )
    return p


def test_study_file_is_the_gpu_scale_design():
    spec = load_study(path=str(presets_dir() / "reproduce" / "gpu_scale.toml"))
    (s,) = spec.studies
    assert s.task == "mqmtar" and s.preset == "paper"  # the paper's format and vocabulary
    assert s.methods == ("softmax", "asentmax") and s.positions == ("nape",)
    assert len(s.seeds) == 3 and not set(s.seeds) & (set(range(7)) | set(range(100, 106)))
    assert s.checkpoints == ("last",) and s.test_seed not in (0, 20261126)
    assert s.lengths == tuple(64 * k for k in (1, 4, 16, 64, 256, 1024))
    assert min(s.samples_for(L) for L in s.lengths) >= 100 and s.samples_for(64) > s.samples_for(256)
    for c in s.cells():
        cfg = s.cell_config(c)
        m, tr = cfg["model"], cfg["train"]
        assert m["d_model"] >= 256 and m["n_layers"] == 4 and m["n_heads"] * m["head_dim"] == m["d_model"]
        assert tr["device"] == "cuda" and tr["batch_size"] == 128
    assert len(s.cells()) == 6


def _used_seeds() -> tuple[set, set]:
    """Training seeds and test-stream seeds of every study file and results store in the repository."""
    from longsparse.io import read_jsonl

    train_seeds, test_seeds = set(), set()
    files = [*(presets_dir() / "reproduce").glob("*.toml"), *(REPO / "results").rglob("*.toml")]
    for f in files:
        if f.name == "gpu_scale_inline.toml":
            continue
        for s in load_study(path=str(f)).studies:
            train_seeds |= set(s.seeds)
            test_seeds.add(s.test_seed)
    for f in (REPO / "results").rglob("records.jsonl"):
        for r in read_jsonl(f):
            train_seeds.add(r.get("seed"))
            train_seeds.add(((r.get("config") or {}).get("train") or {}).get("seed"))
            test_seeds.add(r.get("test_seed"))
    for f in (REPO / "results").rglob("results.json"):
        for study in json.loads(f.read_text()).get("studies", {}).values():
            test_seeds.add(study.get("test_seed"))
            for by_ck in study.get("series", {}).values():
                for by_len in by_ck.values():
                    for r in by_len.values():
                        train_seeds |= {int(x) for x in r.get("per_seed", {})}
    return train_seeds - {None}, test_seeds - {None}


def test_inline_study_file_is_the_preregistered_gpu_design():
    """gpu_scale_inline.toml is what its protocol (docs/reports/2026-11-27-gpu-scale-inline.md) fixes: the
    pre-registered task, the GPU-scale model, fresh seeds and test stream, no decay to zero, 1x-256x."""
    (s,) = load_study(path=str(presets_dir() / "reproduce" / "gpu_scale_inline.toml")).studies
    (cpu,) = [x for x in load_study(path=str(presets_dir() / "reproduce" / "prereg_mqmtar.toml")).studies[:1]]
    assert s.task == cpu.task == "mqmtar_inline" and s.positions == ("nape",)
    assert s.methods == ("softmax", "asentmax") and len(s.seeds) == 3 and len(s.cells()) == 6
    train_seeds, test_seeds = _used_seeds()
    assert not set(s.seeds) & train_seeds and s.test_seed not in test_seeds
    assert s.checkpoints == ("last",) and s.lengths == (64, 1024, 4096, 16384) and s.long_from == 16384
    assert [s.samples_for(L) for L in s.lengths] == [1000, 200, 200, 100]
    for c in s.cells():
        m, tr = s.cell_config(c)["model"], s.cell_config(c)["train"]
        assert (m["n_layers"], m["d_model"], m["n_heads"], m["head_dim"], m["d_ff"]) == (4, 256, 8, 32, 512)
        assert tr["device"] == "cuda" and tr["steps"] == 2500 and tr["min_lr_ratio"] > 0
        assert tr["train_lengths"] == cpu.cell_config(cpu.cells()[0])["train"]["train_lengths"]


def test_run_refuses_a_missing_study_file(tmp_path):
    with pytest.raises(SystemExit, match="no such file"):
        gs.main(["run", "--out", str(tmp_path / "out"), "--device", "cpu", "--study", str(tmp_path / "no.toml")])
    assert not (tmp_path / "out").exists()


def test_first_call_is_frozen_and_summarised(capsys):
    """The first GPU call's study is kept frozen beside its records (the study file has moved on), and
    `gpu_scale.py summary` renders its summary.json: one row per cell, results and seconds per example."""
    store = REPO / "results" / "gpu_scale"
    (frozen,) = load_study(path=str(store / "gpu_scale-2026-11-27.toml")).studies
    (now,) = load_study(path=str(presets_dir() / "reproduce" / "gpu_scale.toml")).studies
    assert frozen.name == now.name and [c.run for c in frozen.cells()] == [c.run for c in now.cells()]
    assert frozen.cell_config(frozen.cells()[0])["train"]["steps"] == 1200
    assert now.cell_config(now.cells()[0])["train"]["steps"] > 1200
    assert gs.main(["summary", str(store / "call-2026-11-27" / "summary.json")]) == 0
    out = capsys.readouterr().out
    assert out.count("| softmax-nape-s2") == 6 and out.count("| asentmax-nape-s2") == 6
    assert "| asentmax-nape-s200 | 1200/1200 | 12.89 |" in out and "Seconds per evaluated example" in out
    assert gs.main(["summary", str(store / "results.json")]) == 2  # not a summary: one line, no traceback
    assert "not a job summary" in capsys.readouterr().err


def test_dry_study_keeps_the_cells_and_shrinks_the_rest(tmp_path):
    p = gs.dry_study(gs.study_path(), tmp_path / "dry.toml")
    (d,) = load_study(path=str(p)).studies
    (g,) = load_study(path=str(gs.study_path())).studies
    assert [(c.method, c.seed) for c in d.cells()] == [(c.method, c.seed) for c in g.cells()]
    assert d.test_seed == g.test_seed and d.name == "gpu_scale_cpu_dry"
    cfg = d.cell_config(d.cells()[0])
    assert cfg["train"]["device"] == "cpu" and cfg["model"]["d_model"] == 32 and cfg["train"]["steps"] == 6


def test_dry_study_of_the_inline_study(tmp_path):
    src = presets_dir() / "reproduce" / "gpu_scale_inline.toml"
    (d,) = load_study(path=str(gs.dry_study(src, tmp_path / "dry.toml"))).studies
    (g,) = load_study(path=str(src)).studies
    assert d.name == "gpu_scale_inline_cpu_dry" and d.task == "mqmtar_inline" and d.test_seed == g.test_seed
    assert [(c.method, c.seed) for c in d.cells()] == [(c.method, c.seed) for c in g.cells()]
    assert d.cell_config(d.cells()[0])["train"]["device"] == "cpu"


def test_run_without_cuda_is_refused_in_one_line(tmp_path):
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit, match="CUDA is not available"):
        gs.main(["run", "--out", str(tmp_path / "out"), "--device", "cuda"])
    assert not (tmp_path / "out").exists()


def test_wrapper_runs_reproduce_as_a_job_and_summarises_it(tmp_path, monkeypatch, capsys):
    """`gpu_scale.py run --device cpu` on a one-cell study (the dry run's version of it): `longsparse reproduce`
    with a time budget, a worker process and a bundle folder. The first job evaluates 2 examples per length
    (partial, bundled), the second, on a fresh run root given the first one's folder, finishes them; `summary`
    renders the manifest."""
    monkeypatch.chdir(REPO)  # the wrapper works from the repository root
    monkeypatch.setenv("LONGSPARSE_KERNEL", "0")
    study = _mini_study(tmp_path)
    common = ["--device", "cpu", "--study", str(study), "--seconds", "120"]
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    assert gs.main(["run", "--out", str(out1), "--runs", str(tmp_path / "r1"), "--max-examples", "2", *common]) == 0
    printed = capsys.readouterr().out
    assert "--time-budget" in printed and "--workers 1" in printed and "--bundle-files 8" in printed
    m1 = json.loads((out1 / "manifest.json").read_text())
    assert len(m1["bundles"]) == 1 and (tmp_path / "r1" / "env.txt").is_file()
    with tarfile.open(out1 / "records.tar.gz") as tf:
        names = tf.getnames()
    assert "runs/env.txt" in names and not any(n.endswith(".pt") for n in names)
    assert any("/eval_partial/" in n for n in names)
    assert gs.main(["run", "--out", str(out2), "--runs", str(tmp_path / "r2"), "--resume", str(out1), *common]) == 0
    capsys.readouterr()
    assert json.loads((out2 / "manifest.json").read_text())["bundles"] == []
    recs = result_store.read_records(tmp_path / "r2" / "report")
    got = {(r["run"], x["length"]): x["n"] for r in recs for x in r["results"]}
    dry = {(64, 8), (256, 4), (1024, 3)}  # the dry run's lengths and sample counts
    assert got == {(f"mini_cpu_dry/softmax-nape-s{s}", L): n for s in (200,) for L, n in dry}
    assert gs.main(["summary", str(out2 / "manifest.json")]) == 0
    table = capsys.readouterr().out
    assert "| softmax-nape-s200 | 6/6 |" in table and "(n=3)" in table and "Seconds per evaluated example" in table


def _view(store: Path) -> dict:
    """Per run and length of a store: (n, exact match, token accuracy) of the latest result."""
    out = {}
    for (_, run), recs in result_store.by_run(result_store.read_records(store)).items():
        for (ck, L), r in result_store.merge_results(recs).items():
            out[(run, ck, L)] = (r["n"], r["exact_match"], r["token_accuracy"])
    return out


@pytest.mark.slow
def test_dry_run_end_to_end_and_resume(tmp_path):
    """The dry run of benchmarks/gpu_scale.sh: job 1 evaluates 2 examples per length and bundles every cell; job
    2, given job 1's folder on a fresh run root, trains nothing and finishes; its numbers equal one plain
    `longsparse reproduce` call on the same dry study."""
    script = REPO / "benchmarks" / "gpu_scale.sh"
    env = {**os.environ, "DEVICE": "cpu", "MAX_EXAMPLES": "2", "GPU_SCALE_RUNS": str(tmp_path / "runs1")}
    r1 = subprocess.run(
        ["bash", str(script), str(tmp_path / "out1"), "200"], env=env, capture_output=True, text=True, timeout=400
    )
    assert r1.returncode == 0, r1.stdout + r1.stderr
    m1 = json.loads((tmp_path / "out1" / "manifest.json").read_text())
    assert len(m1["bundles"]) == 6 and all(b["checkpoint"].startswith("last.pt without") for b in m1["bundles"])
    env2 = {**env, "GPU_SCALE_RUNS": str(tmp_path / "runs2")}
    env2.pop("MAX_EXAMPLES")
    r2 = subprocess.run(
        ["bash", str(script), str(tmp_path / "out2"), "200", str(tmp_path / "out1")],
        env=env2,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert "trained to step" not in r2.stdout
    assert json.loads((tmp_path / "out2" / "manifest.json").read_text())["bundles"] == []
    for a, b in zip(
        sorted((tmp_path / "runs1").rglob("metrics.jsonl")), sorted((tmp_path / "runs2").rglob("metrics.jsonl"))
    ):
        assert a.read_bytes() == b.read_bytes()
    runs3 = tmp_path / "runs3"
    shutil.copyfile(tmp_path / "runs1" / "study-cpu-dry.toml", tmp_path / "dry.toml")
    r3 = subprocess.run(
        [sys.executable, "-m", "longsparse_experiments.cli", "reproduce", "synthetic"]
        + ["--config", str(tmp_path / "dry.toml"), "--out", str(runs3)],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), "LONGSPARSE_KERNEL": "0", "OMP_NUM_THREADS": "1"},
    )
    assert r3.returncode == 0, r3.stdout + r3.stderr
    want = _view(runs3 / "report")
    assert len(want) == 18 and _view(tmp_path / "runs2" / "report") == want
