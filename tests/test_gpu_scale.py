"""The GPU-scale run (benchmarks/gpu_scale.py, docs/gpu.md) on the CPU: its study file, the training time guard,
the slimmed checkpoint of a finished run, evaluation cut short and continued, the resume bundles, and (slow) the
whole dry run of benchmarks/gpu_scale.sh twice, resumed from the first call's files, then `reproduce` on them."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from longsparse.evaluate import evaluate_run
from longsparse.train import train
from longsparse_experiments.presets import presets_dir
from longsparse_experiments.study import load_study

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def _module():
    spec = importlib.util.spec_from_file_location("gpu_scale", REPO / "benchmarks" / "gpu_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def test_length_budget_caps_only_long_lengths_that_are_not_the_last():
    assert gs.length_budget(100.0, last=False, long=False) == 100.0  # 1x-64x: evaluated in full
    assert gs.length_budget(100.0, last=True, long=True) == 100.0
    assert gs.length_budget(100.0, last=False, long=True) == gs.LENGTH_SHARE * 100.0


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
    assert "not a gpu_scale summary.json" in capsys.readouterr().err


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


def test_time_guard_stops_training_at_a_resumable_checkpoint(tmp_path):
    (s,) = load_study(path=str(_mini_study(tmp_path))).studies
    cfg = s.cell_config(s.cells()[0])
    cfg["train"].update(steps=100000, val_every=0, ckpt_every=2)  # far more than a few seconds' work
    warm = {**cfg, "train": {**cfg["train"], "steps": 2}}  # lazy imports and first-use set-up, unguarded
    train(warm, None, progress=False, printer=lambda s: None)
    run = tmp_path / "run"
    with pytest.raises(gs.TimeUp):
        with gs.alarm(3.0):
            train(cfg, str(run), progress=False, printer=lambda s: None)
    first = gs.checkpoint_step(run)
    assert first is not None and 0 < first < 100000 and first % 2 == 0
    with pytest.raises(gs.TimeUp):  # the lock was released and the run resumes from that checkpoint
        with gs.alarm(1.0):
            train(cfg, str(run), progress=False, printer=lambda s: None)
    assert gs.checkpoint_step(run) >= first
    assert "resuming" in (run / "train.log").read_text()


def test_slim_checkpoint_of_a_finished_run_resumes_as_complete(tmp_path):
    (s,) = load_study(path=str(_mini_study(tmp_path))).studies
    cfg = s.cell_config(s.cells()[0])
    run = tmp_path / "run"
    train(cfg, str(run), progress=False, printer=lambda s: None)
    last = run / "checkpoints" / "last.pt"
    slim = tmp_path / "slim.pt"
    gs.slim_checkpoint(last, slim)
    assert slim.stat().st_size < 0.5 * last.stat().st_size
    shutil.copyfile(slim, last)
    metrics = (run / "metrics.jsonl").read_text()
    res = train(cfg, str(run), progress=False, printer=lambda s: None)
    assert res["trained_steps"] == 0 and res["step"] == cfg["train"]["steps"]
    assert (run / "metrics.jsonl").read_text() == metrics


def _worker_args(study: Path, runs: Path, state: Path, seconds: float = 120):
    import time

    state.mkdir(parents=True, exist_ok=True)
    return gs.argparse.Namespace(
        study=str(study),
        runs=str(runs),
        state=str(state),
        shard="0/1",
        device="cpu",
        train_until=time.time() + seconds,
        eval_until=time.time() + seconds,
    )


def test_evaluation_cut_short_continues_to_the_one_shot_result(tmp_path, monkeypatch):
    study = _mini_study(tmp_path, methods=("asentmax",))
    runs = tmp_path / "runs"
    monkeypatch.setenv(gs.CAP_ENV, "2")
    gs.Worker(_worker_args(study, runs, tmp_path / "s1")).main()
    (s,) = load_study(path=str(study)).studies
    run = runs / s.cells()[0].run
    part = gs.read_partial(run, 256, 5, 7)
    assert part["done"] == 2 and len(part["pieces"]) == 1
    assert gs.latest_result(run, 7, 256, 5) is None and gs.latest_result(run, 7, 64, 4)["n"] == 4
    monkeypatch.setenv(gs.CAP_ENV, "2")
    gs.Worker(_worker_args(study, runs, tmp_path / "s2")).main()  # 2 more: still partial
    assert gs.read_partial(run, 256, 5, 7)["done"] == 4
    monkeypatch.delenv(gs.CAP_ENV)
    gs.Worker(_worker_args(study, runs, tmp_path / "s3")).main()
    assert gs.read_partial(run, 256, 5, 7) is None
    got = gs.latest_result(run, 7, 256, 5)
    _, ref = evaluate_run(run, [256], samples=5, checkpoint="last", seed=7, device="cpu", printer=None, write=False)
    (want,) = ref["results"]
    for k in ("n", "n_exact", "n_tokens", "n_correct_tokens", "exact_match_ci", "token_accuracy"):
        assert got[k] == want[k], k
    # the file of the 256-token result (the 64-token one may carry the same second in "created")
    files = map(json.loads, (f.read_text() for f in (run / "eval").glob("*.json")))
    (d,) = [d for d in files if [r["length"] for r in d["results"]] == [256]]
    assert [p["examples"] for p in d["pieces"]] == [2, 2, 1] and d["samples"] == 5 and d["seed"] == 7


def test_long_lengths_wait_for_the_other_shards_trainings(tmp_path, capsys):
    """Shard 0 of 2 evaluates its short length at once, and its long length only once shard 1 has marked its
    training ended (a stand-in thread here, a second process on the GPU)."""
    import threading
    import time

    study = _mini_study(tmp_path, methods=("softmax", "asentmax"))
    state = tmp_path / "state"
    args = _worker_args(study, tmp_path / "runs", state, seconds=300)
    args.shard = "0/2"
    marked = []

    def other_shard():
        while '"length": 64' not in (
            (state / "events-0.jsonl").read_text() if (state / "events-0.jsonl").exists() else ""
        ):
            time.sleep(0.2)
        time.sleep(1.0)
        marked.append(time.time())
        (state / "trained-1").touch()

    t = threading.Thread(target=other_shard, daemon=True)
    t.start()
    gs.Worker(args).main()
    t.join(timeout=5)
    events = [json.loads(x) for x in (state / "events-0.jsonl").read_text().splitlines()]
    by = {e.get("length", "train"): e for e in events}
    assert set(by) == {"train", 64, 256} and by["train"]["run"] == "mini/softmax-nape-s200"
    assert by[64]["time"] < marked[0] <= by[256]["time"] < args.train_until
    assert "waited" in capsys.readouterr().out


def test_bundles_split_within_limits_and_restore_whole(tmp_path, monkeypatch):
    (s,) = load_study(path=str(_mini_study(tmp_path))).studies
    c = s.cells()[0]
    runs = tmp_path / "runs"
    train(s.cell_config(c), str(runs / c.run), progress=False, printer=lambda s: None)
    path, size = gs._make_bundle(str(runs / c.run), str(runs), str(tmp_path / gs._bundle_name(c.run)), False)
    with tarfile.open(path) as tf:
        names = tf.getnames()
    assert f"{c.run}/checkpoints/last.pt" in names and not any(n.endswith("best.pt") for n in names)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(gs, "MAX_FILE_BYTES", size // 3)
    man = gs.place_bundles([(c.run, Path(path), size, False)], out, 2, 0, part_bytes=size // 3 + 1)
    assert len(man["bundles"][0]["files"]) == 3 and not man["left_out"]
    assert sum(f.stat().st_size for f in out.iterdir()) == size
    monkeypatch.setattr(gs, "MAX_FILES", 3)  # two files already there: a 3-part bundle no longer fits
    man = gs.place_bundles([(c.run, Path(path), size, False)], tmp_path, 2, 0, part_bytes=size // 3 + 1)
    assert man["left_out"][0]["run"] == c.run
    fresh = tmp_path / "fresh"
    assert gs.restore(out, fresh, fresh / "report", log=lambda s: None) == [c.run]
    for f in ("checkpoints/last.pt", "metrics.jsonl", "config.json"):
        assert (fresh / c.run / f).read_bytes() == (runs / c.run / f).read_bytes()
    assert gs.restore(out, fresh, fresh / "report", log=lambda s: None) == []  # a local copy is kept


@pytest.mark.slow
def test_dry_run_end_to_end_and_resume(tmp_path):
    """Call 1 stops the long length after 2 of 3 examples; call 2, given call 1's files, trains nothing and finishes
    it; `reproduce` on call 1's bundles trains nothing either and evaluates the same examples in one piece."""
    env = {**os.environ, "DEVICE": "cpu", "GPU_SCALE_EVAL_CAP": "2", "GPU_SCALE_RUNS": str(tmp_path / "runs1")}
    script = REPO / "benchmarks" / "gpu_scale.sh"
    r1 = subprocess.run(
        ["bash", str(script), str(tmp_path / "out1"), "200"], env=env, capture_output=True, text=True, timeout=300
    )
    assert r1.returncode == 0, r1.stdout + r1.stderr
    out1 = sorted(p.name for p in (tmp_path / "out1").iterdir())
    assert len(out1) == 8 and "records.tar.gz" in out1 and "results.json" in out1
    assert sum(n.startswith("resume-") for n in out1) == 6
    with tarfile.open(tmp_path / "out1" / "records.tar.gz") as tf:
        names = tf.getnames()
        summary = json.load(tf.extractfile("driver/summary.json"))
    assert not any(n.endswith(".pt") for n in names) and "report/results.json" in names
    assert "driver/reproduce-dry-run.txt" in names and any("/eval_partial/" in n for n in names)
    for c in summary["cells"]:
        assert c["trained"] and c["train_this_call"]["status"] == "complete"
        assert [c["lengths"][k]["status"] for k in ("64", "256", "1024")] == ["complete", "complete", "partial"]
        assert c["lengths"]["1024"]["n"] == 2
    plan = [line for line in summary["reproduce_dry_run"] if line.startswith("gpu_scale_cpu_dry/")]
    assert len(plan) == 6 and all("trained already (6 steps) and would evaluate 1 " in line for line in plan)
    arch = json.loads((tmp_path / "out1" / "results.json").read_text())["studies"]["gpu_scale_cpu_dry"]
    assert all(set(by_ck["last"]) == {"64", "256"} for by_ck in arch["series"].values())

    resume = tmp_path / "resume"
    shutil.copytree(tmp_path / "out1", resume)
    env2 = {**env, "GPU_SCALE_RUNS": str(tmp_path / "runs2")}
    env2.pop("GPU_SCALE_EVAL_CAP")
    r2 = subprocess.run(
        ["bash", str(script), str(tmp_path / "out2"), "200", str(resume)],
        env=env2,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert sorted(p.name for p in (tmp_path / "out2").iterdir()) == ["records.tar.gz", "results.json"]
    with tarfile.open(tmp_path / "out2" / "records.tar.gz") as tf:
        summary2 = json.load(tf.extractfile("driver/summary.json"))
    assert len(summary2["restored"]) == 7  # six run folders and the archive
    for c in summary2["cells"]:
        assert c["train_this_call"]["status"] == "complete before this call"
        assert all(x["status"] == "complete" for x in c["lengths"].values())
        assert c["lengths"]["1024"]["this_call"]["examples"] == 1
    for a, b in zip(
        sorted((tmp_path / "runs1").rglob("metrics.jsonl")), sorted((tmp_path / "runs2").rglob("metrics.jsonl"))
    ):
        assert a.read_bytes() == b.read_bytes()
    arch2 = json.loads((tmp_path / "out2" / "results.json").read_text())["studies"]["gpu_scale_cpu_dry"]

    runs3 = tmp_path / "runs3"
    gs.restore(resume, runs3, runs3 / "report", log=lambda s: None)
    before = {p: p.read_bytes() for p in runs3.rglob("metrics.jsonl")}
    study = tmp_path / "runs1" / "study-cpu-dry.toml"
    r3 = subprocess.run(
        [
            sys.executable,
            "-m",
            "longsparse_experiments.cli",
            "reproduce",
            "synthetic",
            "--config",
            str(study),
            "--out",
            str(runs3),
            "--report",
            str(runs3 / "report"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), "LONGSPARSE_KERNEL": "0"},
    )
    assert r3.returncode == 0, r3.stdout + r3.stderr
    assert "trained to step" not in r3.stdout
    assert {p: p.read_bytes() for p in runs3.rglob("metrics.jsonl")} == before
    arch3 = json.loads((runs3 / "report" / "results.json").read_text())["studies"]["gpu_scale_cpu_dry"]
    for key, by_ck in arch2["series"].items():
        for L, r in by_ck["last"].items():
            for seed, v in r["per_seed"].items():
                w = arch3["series"][key]["last"][L]["per_seed"][seed]
                assert (v["n"], v["exact_match"], v["token_accuracy"]) == (
                    w["n"],
                    w["exact_match"],
                    w["token_accuracy"],
                )
