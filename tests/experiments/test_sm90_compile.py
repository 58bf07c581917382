"""benchmarks/sm90_compile.py: its stored results render as tables (`longsparse bench table`), the CTA arithmetic,
and bad input refused in one line (the compile itself: tests/unit/attention/test_triton_kernel.py)."""

from __future__ import annotations

import pytest
from helpers.benchmarks import benchmark_script
from helpers.paths import BENCHMARKS

from longsparse_experiments.bench import markdown
from longsparse_experiments.bench.tables import ctas_per_sm

sm90 = benchmark_script("sm90_compile")


def test_ctas_per_sm_from_registers_warps_and_shared_memory():
    # 255 registers round to 256 a thread: 8 warps take the 65,536 registers, 4 warps half
    assert ctas_per_sm({"registers": 255, "warps": 8, "shared": 1024}) == 1
    assert ctas_per_sm({"registers": 255, "warps": 4, "shared": 1024}) == 2
    # 155 registers round to 160 a thread (5,120 a warp): 4 warps fit 3 by registers
    assert ctas_per_sm({"registers": 155, "warps": 4, "shared": 1024}) == 3
    # shared memory can bind first: 100 KiB + 1 KiB reserved, twice, is under 228 KiB
    assert ctas_per_sm({"registers": 32, "warps": 4, "shared": 100 * 1024}) == 2


@pytest.mark.parametrize("path", sorted(BENCHMARKS.glob("results/sm90-compile-*.json")), ids=lambda p: p.name)
def test_the_committed_results_render_as_tables(path):
    text = markdown(str(path))
    assert text.count("| 128 |") >= 10 and "CTAs/SM" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--variants", "128:bfloat16"], "give D:dtype:mode"),
        (["--variants", "128:int8:1"], "dtype is bfloat16"),
        (["--launch-variant", "top16"], "choose one of"),
    ],
)
def test_bad_input_is_refused_in_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        sm90.main(["--out", str(tmp_path / "new.json"), *argv])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "new.json").exists()


def test_a_stored_result_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "old.json").write_text("{}")
    with pytest.raises(SystemExit):
        sm90.main(["--out", str(tmp_path / "old.json")])
    assert "exists" in capsys.readouterr().err and (tmp_path / "old.json").read_text() == "{}"
