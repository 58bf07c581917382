"""The benchmark harness: honest JSON (ratios to softmax/SDPA from the same run) and its markdown."""
import json

import pytest

from longsparse import bench


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


def test_attention_worker_measures_time_and_memory():
    r = bench.attention_worker("ours_entmax15", n=64, heads=2, dim=8, backward=True, repeats=1)
    assert r["seconds"] > 0 and r["extra_peak_bytes"] >= 0 and "time_vs_sdpa_interleaved" not in r
    r = bench.attention_worker("ours_entmax15", n=64, heads=2, dim=8, backward=False, repeats=2,
                               interleave_sdpa=True)
    assert r["time_vs_sdpa_interleaved"] > 0
    with pytest.raises(ValueError, match="unknown attention method"):
        bench.attention_worker("nope", n=64, heads=2, dim=8, backward=False, repeats=1)


def test_short_benchmark_compares_auto_and_chunked_paths(tmp_path):
    rows = bench.bench_short([16, 32], repeats=1, batch=2, heads=2, dim=4)
    assert {(r["n"], r["mapping"]) for r in rows} == {(n, m) for n in (16, 32) for m in ("entmax", "adatemp", "sparsemax")}
    for r in rows:
        assert r["auto_vs_chunked"] == pytest.approx(r["auto_s"] / r["chunked_s"])
    path = bench.write_result("short", rows, str(tmp_path / "s.json"), {"lengths": [16, 32]})
    table = bench.markdown(str(path))
    assert table.count("\n| 16 |") == 3 and "auto / chunked" in table
