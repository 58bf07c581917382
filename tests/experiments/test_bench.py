"""The benchmark harness: honest JSON (ratios to softmax/SDPA from the same run) and its markdown."""

import argparse
import json

import pytest
from helpers.benchmarks import benchmark_script
from helpers.paths import BENCHMARKS, REPO_ROOT

from longsparse_experiments import bench
from longsparse_experiments.cli import build_parser
from longsparse_experiments.cli import main as longsparse


def test_mapping_benchmark_writes_ratios_and_never_overwrites(tmp_path):
    rows = bench.bench_mapping([64, 128], repeats=1, total_elements=2048)
    assert {r["mapping"] for r in rows} == {"entmax15", "entmax_alpha1.3", "sparsemax"}
    for r in rows:
        assert r["fwd_vs_softmax"] == pytest.approx(r["ours_fwd_s"] / r["softmax_fwd_s"])
        assert r["speedup_vs_package_fwd"] == pytest.approx(r["package_fwd_s"] / r["ours_fwd_s_with_package"])
    path = bench.write_result("mapping", rows, str(tmp_path / "m.json"), {"lengths": [64, 128]})
    data = json.loads(path.read_text())
    assert data["benchmark"] == "mapping" and len(data["rows"]) == 6 and data["env"]["torch"]
    table = bench.markdown(str(path))
    assert table.count("\n| 64 |") == 3 and "entmax15" in table
    with pytest.raises(FileExistsError):
        bench.write_result("mapping", rows, str(path), {})


def test_bench_is_an_experiments_command_with_its_flags(tmp_path, capsys):
    args = build_parser().parse_args(["bench", "mapping", "--lengths", "64", "--repeats", "1", "--threads", "1"])
    assert (args.what, args.lengths, args.repeats, args.threads) == ("mapping", "64", 1, 1)
    assert args.func is bench.main
    path = bench.write_result(
        "short",
        [{"n": 16, "mapping": "entmax", "auto_s": 0.002, "chunked_s": 0.004, "auto_vs_chunked": 0.5}],
        str(tmp_path / "s.json"),
        {"lengths": [16]},
    )
    assert longsparse(["bench", "table", "--out", str(path)]) == 0
    assert "| 16 | entmax | 2.0 | 4.0 | 0.50 |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # a count flag rejects 0 in one usage line
        build_parser().parse_args(["bench", "mapping", "--repeats", "0"])
    assert e.value.code == 2 and "--repeats: must be a positive integer, got 0" in capsys.readouterr().err


def test_attention_worker_measures_time_and_memory():
    r = bench.attention_worker("ours_entmax15", n=64, heads=2, dim=8, backward=True, repeats=1)
    assert r["seconds"] > 0 and r["extra_peak_bytes"] >= 0 and "time_vs_sdpa_interleaved" not in r
    r = bench.attention_worker("ours_entmax15", n=64, heads=2, dim=8, backward=False, repeats=2, interleave_sdpa=True)
    assert r["time_vs_sdpa_interleaved"] > 0
    with pytest.raises(ValueError, match="unknown attention method"):
        bench.attention_worker("nope", n=64, heads=2, dim=8, backward=False, repeats=1)


def test_short_benchmark_compares_auto_and_chunked_paths(tmp_path):
    rows = bench.bench_short([16, 32], repeats=1, batch=2, heads=2, dim=4)
    assert {(r["n"], r["mapping"]) for r in rows} == {
        (n, m) for n in (16, 32) for m in ("entmax", "adatemp", "sparsemax")
    }
    for r in rows:
        assert r["auto_vs_chunked"] == pytest.approx(r["auto_s"] / r["chunked_s"])
    path = bench.write_result("short", rows, str(tmp_path / "s.json"), {"lengths": [16, 32]})
    table = bench.markdown(str(path))
    assert table.count("\n| 16 |") == 3 and "auto / chunked" in table


# ----------------------------------------------------------------------------- training steps, runs, evaluation

TINY = ["model.d_model=16", "model.d_ff=32", "model.n_heads=2", "train.batch_size=4"]


def test_train_step_worker_measures_the_steps_peak_memory():
    r = bench.train_step_worker("mqmtar_inline", "cpu", "asentmax", "nape", length=32, steps=2, threads=1, sets=TINY)
    assert r["peak_rss_bytes"] > r["extra_peak_bytes"] > 0


def test_train_step_is_the_loops_update():
    """The benchmark times `train_step`, the loop's own update: one step of it from the run's start equals the
    first logged loss of `train` (same model init, same first batch)."""
    from longsparse.train import build_config, train

    cfg, task, model, opt = bench.training._train_setup("mqmtar_inline", "cpu", "asentmax", "nape", TINY)
    batch = task.batch(
        tuple(cfg["train"]["train_lengths"]), cfg["train"]["batch_size"], rng=task.rng(cfg["train"]["seed"], "train")
    )
    n_target = int((batch.labels != -100).sum())
    loss_sum, _ = bench.training._step_fn(cfg, model, opt, batch)()
    res = train(
        build_config(
            "mqmtar_inline",
            method="asentmax",
            positions="nape",
            steps=1,
            sets=TINY + ["train.val_every=0", "train.val_samples=1", "train.val_lengths=[32]"],
        ),
        None,
        printer=lambda s: None,
        progress=False,
    )
    assert float(loss_sum) / n_target == pytest.approx(res["first_loss"], rel=1e-6)


@pytest.mark.slow
def test_train_step_benchmark_times_methods_and_measures_memory(tmp_path):
    rows = bench.bench_train_step([32], repeats=1, sets=TINY)
    assert [r["method"] for r in rows] == ["softmax", "asentmax"]
    base, other = rows
    assert base["wall_vs_base"] == 1 and other["cpu_vs_base"] == pytest.approx(other["cpu_s"] / base["cpu_s"])
    assert other["peak_vs_base"] == pytest.approx(other["peak_rss_bytes"] / base["peak_rss_bytes"])
    path = bench.write_result("train-step", rows, str(tmp_path / "t.json"), {"lengths": [32]})
    assert bench.markdown(str(path)).count("| 32 (") == 2


@pytest.mark.slow
def test_train_run_benchmark_runs_the_command(tmp_path):
    rows = bench.bench_train_run(2, repeats=1, sets=TINY, workdir=str(tmp_path / "runs"))
    assert [r["method"] for r in rows] == ["softmax", "asentmax"]
    for r in rows:
        assert r["wall_s"] >= r["runs"][0]["val_s"] > 0 and r["peak_rss_bytes"] > 0 and r["steps"] == 2
        assert (tmp_path / "runs" / f"{r['method']}-nape-r0" / "checkpoints").is_dir()
    path = bench.write_result("train-run", rows, str(tmp_path / "r.json"), {})
    assert "| asentmax | 2 |" in bench.markdown(str(path))


def test_eval_benchmark_scores_the_same_examples_with_each_model(tmp_path):
    import torch

    threads = torch.get_num_threads()
    rows = bench.bench_eval([32, 64], repeats=2, samples=2, train_steps=1, sets=TINY)
    assert torch.get_num_threads() == threads
    assert [(r["length"], r["model"].split()[0]) for r in rows] == [
        (n, m) for n in (32, 64) for m in ("softmax/nape", "asentmax/nape")
    ]
    for r in rows:
        assert r["examples_per_s"] == pytest.approx(2 / r["seconds"]) and len(r["exact_match"]) == 2
    assert {r["backend"] for r in rows} == {"sdpa", "fused_cpu"}
    path = bench.write_result("eval", rows, str(tmp_path / "e.json"), {})
    assert bench.markdown(str(path)).count("| 64 (") == 2


def test_sdpa_blocks_benchmark_writes_its_table_and_never_overwrites(tmp_path, monkeypatch):
    """benchmarks/sdpa_blocks.py at a tiny size, with auto's SDPA limit lowered so that the sdpa backend
    really runs in query blocks: every backend timed, outputs equal, the table renders, no overwrite."""

    from longsparse.attention import flex as flex_backend
    from longsparse.attention.backends import sdpa as sdpa_backend

    mod = benchmark_script("sdpa_blocks")
    monkeypatch.setattr(sdpa_backend, "SDPA_MAX_ELEMENTS", 4 * 48)  # one bias row of 4 heads × 48 keys per block
    out = tmp_path / "b.json"
    args = ["--out", str(out), "--n", "48", "--heads", "4", "--dim", "8", "--repeats", "1"]
    assert mod.main(args) == 0
    data = json.loads(out.read_text())
    flex = [] if flex_backend.build_reason("cpu") else ["flex"]  # where torch's CPU FlexAttention runs
    assert [r["backend"] for r in data["rows"]] == ["sdpa", "chunked", *flex, "fused_cpu"]
    assert all(r["median_s"] > 0 and r["max_abs_diff"] < 1e-5 for r in data["rows"])
    assert bench.markdown(str(out)).count("| 48 |") == len(data["rows"])
    with pytest.raises(SystemExit):
        mod.main(args)


def test_alibi_band_benchmark_times_nape_nope_and_sdpa_and_never_overwrites(tmp_path):
    """benchmarks/alibi_band.py at a tiny size on this tree's source: the three calls timed in a worker process,
    ratios from the same run, the table renders, no overwrite."""

    root = REPO_ROOT
    mod = benchmark_script("alibi_band")
    out = tmp_path / "a.json"
    args = ["--src", f"here={root / 'src'}", "--lengths", "128", "--repeats", "1", "--out", str(out)]
    assert mod.main(args) == 0
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["src"] == "here" and row["n"] == 128 and set(row["median_wall_s"]) == {"nape", "nope", "sdpa"}
    assert row["nape_vs_nope_wall_s"] == row["median_wall_s"]["nape"] / row["median_wall_s"]["nope"]
    assert "| 128 | here |" in bench.markdown(str(out))
    with pytest.raises(SystemExit, match="exists"):
        mod.main(args)


# kinds whose tables their own scripts print (benchmarks/gpu_check.py --rescore, benchmarks/kernel_counts.py --table,
# benchmarks/solver_emulator.py --table: tests/experiments/test_solver_emulator.py renders its committed results)
SCRIPT_TABLES = {"gpu_check", "kernel_counts", "solver_emulator"}


def test_every_committed_result_has_a_table():
    """Each benchmark JSON under benchmarks/results is of a registered kind whose table renders it, or of a
    kind whose script prints its own."""
    root = BENCHMARKS / "results"
    files = sorted(root.rglob("*.json"))
    assert len(files) > 20
    for f in files:
        kind = json.loads(f.read_text())["benchmark"]
        if kind in SCRIPT_TABLES:
            continue
        assert kind in bench.BENCHES, f"{f}: kind {kind!r} has no registered table"
        assert str(f) in bench.markdown(str(f))


def test_a_kind_is_one_registration(tmp_path):
    """register_bench adds a kind to `markdown` and, with a run, to the command's choices; an unregistered
    kind is refused before anything is written, and a name is registered once."""
    with pytest.raises(ValueError, match="not registered"):
        bench.write_result("no-such-kind", [], str(tmp_path / "x.json"), {})
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(ValueError, match="already registered"):
        bench.register_bench(bench.Bench("mapping", lambda rows: []))
    probe = bench.Bench("probe-kind", lambda rows: [f"| {r['v']} |" for r in rows], lambda a, lengths, c: [{"v": 1}])
    bench.register_bench(probe)
    try:
        path = bench.write_result("probe-kind", [{"v": 7}], str(tmp_path / "p.json"), {})
        assert "| 7 |" in bench.markdown(str(path))
        assert json.loads(path.read_text())["env"]["commit"]  # the checkout's commit is recorded
        parser = argparse.ArgumentParser()
        bench.add_cli(parser.add_subparsers())
        assert parser.parse_args(["bench", "probe-kind"]).what == "probe-kind"
    finally:
        del bench.BENCHES["probe-kind"]
    path.write_text(json.dumps({"benchmark": "probe-kind", "rows": [], "env": {}}))
    with pytest.raises(ValueError, match="has no table"):
        bench.markdown(str(path))


def test_decode_host_benchmark_counts_launches_and_restores_the_kernels(tmp_path):
    """benchmarks/decode_host.py at a tiny size: the decode path launches its five kernels (scores, filter, solve,
    output, combine) and runs no torch operation between them but allocations; the real kernels are back after
    it (the stubs never leak into the process); the table renders; a stored result is never overwritten."""
    mod = benchmark_script("decode_host")
    from longsparse.attention import triton_ops

    triton_ops._kernels()
    before = triton_ops._dec_combine_kernel
    out = tmp_path / "dh.json"
    assert mod.main(["--out", str(out), "--keys", "2048", "--heads", "4", "--calls", "2", "--repeats", "1"]) == 0
    assert triton_ops._dec_combine_kernel is before
    (row,) = json.loads(out.read_text())["rows"]
    assert row["triton_launches"] == 5 and set(row["ops"]) == {"empty"}
    assert row["H"] == 4 and row["Nk"] == 2048 and row["us_per_call"] > 0
    assert "| current | 1 × 4 × 1 × 2048 × 64 | 5 |" in bench.markdown(str(out))
    with pytest.raises(SystemExit):
        mod.main(["--out", str(out), "--keys", "2048"])
