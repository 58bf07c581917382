"""benchmarks/solver_emulator.py: an exact emulator of the Triton forward's α = 1.5 threshold solve, used to
compare solve strategies on the CPU. Its `two_point` and `anchored` strategies must count what the instrumented
kernel counted in Triton's interpreter before and after the solve changed (the committed
benchmarks/results/kernel-counts-cpu-2026-11-2{7,8}.json), and every strategy must return the exact τ."""

import json
import math
import os

# the interpreted-kernel test: Triton's interpreter must be on before triton is first imported
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers.benchmarks import benchmark_script  # noqa: E402
from helpers.paths import REPO_ROOT  # noqa: E402

ROOT = REPO_ROOT
emulator = benchmark_script("solver_emulator")


@pytest.mark.parametrize(
    "strategy, stored, keys",
    [
        # the forward before its solve changed: every count, uncertified rows included
        ("two_point", "kernel-counts-cpu-2026-11-27.json", ("uncertified_rows",)),
        # the forward as it is; which rows end uncertified (at a bracket rounding could not move) depends on
        # the logits' last bits, which the interpreter's dot rounds in its own order: 3 there, 2 here
        ("anchored", "kernel-counts-cpu-2026-11-28.json", ()),
    ],
)
def test_the_emulator_counts_what_the_interpreted_kernel_counted(strategy, stored, keys):
    rows = json.loads((ROOT / "benchmarks/results" / stored).read_text())["rows"]
    want = next(r for r in rows if r["source"] == "random" and r["N"] == 1024 and r["heads"] == "nope")
    got = emulator.count(emulator.random_logits(1024), strategy, check=False)
    for key in ("qk_passes_mean", "qk_passes_max", "sweeps_mean", "sweeps_max", "blocks", *keys):
        assert got[key] == want[key], key


@pytest.mark.parametrize("strategy", emulator.STRATEGIES)
@pytest.mark.parametrize("temperature", [0.3, 1.0, 8.0])
def test_every_strategy_returns_the_exact_threshold(strategy, temperature):
    """Flat (0.3), random (1) and peaked (8) logits over 256 keys: τ within float32 rounding of the float64 τ."""
    got = emulator.count(emulator.random_logits(256, seed=7, temperature=temperature), strategy, check=True)
    assert got["max_tau_error"] < 5e-7
    assert got["sweeps_max"] < emulator.MAX_SWEEPS


@pytest.mark.parametrize("base_strategy, strategy, fold_from", [("anchored", "folded", 2), ("top", "top_folded", 1)])
def test_folding_the_output_saves_the_output_pass_and_nothing_else(base_strategy, strategy, fold_from):
    """`folded` solves every block as `anchored` does, and `top_folded` as `top` (same τ, same sweeps), and, on the
    blocks whose sweep from FOLD_FROM on certified every row, skips the output pass: one QKᵀ pass fewer, paid in
    P·V passes."""
    z = emulator.random_logits(512, seed=3)[0]
    saved = 0
    for b in range(512 // emulator.TILE):
        rows = slice(b * emulator.TILE, (b + 1) * emulator.TILE)
        nkeys = torch.arange(b * emulator.TILE + 1, (b + 1) * emulator.TILE + 1)
        block = z[rows, : (b + 1) * emulator.TILE]
        base = emulator.solve_block(block, nkeys, base_strategy)
        fold = emulator.solve_block(block, nkeys, strategy, fold_from=fold_from)
        assert torch.equal(fold["tau"], base["tau"]) and fold["sweeps"] == base["sweeps"]
        assert base["pv_passes"] <= 1.0
        if fold["passes"] < base["passes"]:
            saved += 1
            assert fold["sweeps"] > fold_from
            assert fold["passes"] == pytest.approx(base["passes"] - base["pv_passes"])
        else:
            assert fold["passes"] == base["passes"] and fold["pv_passes"] >= base["pv_passes"]
    assert saved > 0


def test_the_float64_threshold_solves_its_equation():
    """The oracle's oracle: Σ (x − τ)₊² = 1 for α = 1.5, on rows with masked entries and ties."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(6, 50, generator=g)
    X[0, 10:] = -math.inf
    X[1] = 0.25
    X[2, :2] = 3.0
    tau = emulator.exact_tau(X)
    f = ((X.double() - tau[:, None]).clamp(min=0) ** 2).sum(-1)
    torch.testing.assert_close(f, torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lengths", "100"], "multiple of the tile"),
        (["--run", "no/such/run"], "not a run folder"),
        (["--strategies", "bisection"], "choose from"),
        (["--top-scores", "24"], "a power of two"),
        (["--fold-from", "-1"], "0 or later"),
    ],
)
def test_the_script_refuses_bad_input_in_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        emulator.main(["--out", str(tmp_path / "new.json"), *argv])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "new.json").exists()


def test_the_script_does_not_overwrite_a_stored_result(tmp_path, capsys):
    stored = tmp_path / "stored.json"
    stored.write_text("{}")
    with pytest.raises(SystemExit):
        emulator.main(["--out", str(stored), "--lengths", "64"])
    assert "exists" in capsys.readouterr().err
    assert stored.read_text() == "{}"


def test_the_committed_results_render_as_tables():
    """Every stored emulator result prints one table row per record (`--table`)."""
    files = sorted((ROOT / "benchmarks/results").glob("solver-emulator-*.json"))
    assert files
    for f in files:
        rows = json.loads(f.read_text())["rows"]
        lines = emulator.table(str(f)).splitlines()
        assert len(lines) == 2 + len(rows)
        assert all(f"| {r['strategy']} |" in line for r, line in zip(rows, lines[2:]))


@pytest.mark.slow
def test_top_counts_what_the_interpreted_kernel_counts(monkeypatch):
    """`top` against the kernel with TOP_SCORES = 16, run in Triton's interpreter with CUDA's 64 × 64 tiles on
    one NoPE head of the random input (the interpreter's sorts make longer rows take hours): the same sweeps
    and QKᵀ passes, block for block, and every row certified."""
    from longsparse.attention import triton_entmax as te
    from longsparse.attention import triton_ops as ops

    if not te._interpreter_mode():
        pytest.skip("the kernels were built for a GPU in this process; the counts take CPU tensors")
    monkeypatch.setattr(ops, "INTERPRETER_BLOCK", emulator.TILE)
    monkeypatch.setattr(ops, "TOP_SCORES", emulator.TOP_SCORES)
    N, head = 256, 4  # random_logits' first NoPE head
    g = torch.Generator().manual_seed(N)
    q, k, v = (torch.randn(1, 8, N, 64, generator=g)[:, head : head + 1].contiguous() for _ in range(3))
    counts = te.solver_counts(q, k, v, alpha=1.5, is_causal=True)
    z = emulator.random_logits(N)[0]
    for b in range(N // emulator.TILE):
        rows = slice(b * emulator.TILE, (b + 1) * emulator.TILE)
        nkeys = torch.arange(b * emulator.TILE + 1, (b + 1) * emulator.TILE + 1)
        got = emulator.solve_block(z[rows, : (b + 1) * emulator.TILE], nkeys, "top")
        assert got["sweeps"] == int(counts["sweeps"][0, 0, b])
        assert got["passes"] == int(counts["tiles_visited"][0, 0, b]) / int(counts["causal_tiles"][0, 0, b])
    assert int(counts["uncertified"].sum()) == 0
