"""The figures' numbers (longsparse_experiments.figures, one module per analysis) on small inputs, and the
`figures` command."""

import json
import math

import pytest
import torch

import longsparse as ls
from longsparse_experiments.figures import context
from longsparse_experiments.figures import dispersion as DISP
from longsparse_experiments.figures import p0_grid as P0
from longsparse_experiments.figures import profiles as PROF
from longsparse_experiments.figures import scales as SC
from longsparse_experiments.figures import threshold as TH
from longsparse_experiments.figures import zero_crossing as ZC

pytest.importorskip("matplotlib")


# ---- 1. zero crossings ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [1.25, 1.5, 1.75, 2.0, 3.0])
@pytest.mark.parametrize("z", [ZC.Z_DEMO, (0.3, -1.0, 2.5, 0.9, 0.0, 1.1)])
def test_zero_crossing_closed_form_matches_bisection(alpha, z):
    closed = ZC.zero_crossing_inv_temperature(z, alpha)
    zt = torch.tensor(z, dtype=torch.float64)
    for j, t in enumerate(closed):
        if z[j] == max(z):
            assert t is None
            continue
        bf = ZC.zero_crossing_bisection(z, alpha, j)
        # α > 2: the solver's τ is bisection-accurate only (~1e-9), which p = [·]^(1/(α−1)) magnifies near 0
        assert bf == pytest.approx(t, rel=1e-9 if alpha <= 2 else 1e-6)
        assert ls.entmax(zt * t * (1 - 1e-6), alpha)[j] > 0  # alive just before
        assert ls.entmax(zt * t * (1 + 1e-6), alpha)[j] == 0  # exactly zero just after ...
        assert ls.entmax(zt * t * 3, alpha)[j] == 0  # ... and for every larger 1/θ


def test_zero_crossing_known_values():
    sp = ZC.zero_crossing_inv_temperature(ZC.Z_DEMO, 2.0)  # sparsemax: t_j = 1 / Σ_{i<j} (z_i − z_j)
    assert sp[0] is None
    assert sp[1:] == pytest.approx([5.0, 1 / 0.6, 1 / 1.2, 0.5])
    assert ZC.zero_crossing_inv_temperature(ZC.Z_DEMO, 1.5)[1] == pytest.approx(10.0)  # 1/(0.5·0.2)
    assert ZC.zero_crossing_inv_temperature(ZC.Z_DEMO, 1.0) == [None] * 5


def test_zero_crossing_data_probabilities_are_entmax():
    d = ZC.zero_crossing_data(points=9)
    ts = torch.tensor(d["inv_temperature"], dtype=torch.float64)
    for pan in d["panels"]:
        p = ls.entmax(ts[:, None] * torch.tensor(d["z"], dtype=torch.float64), pan["alpha"])
        assert torch.allclose(torch.tensor(pan["probabilities"], dtype=torch.float64).T, p, atol=1e-6)
        for c in pan["zero_crossings"]:
            assert c["rel_error"] is None or c["rel_error"] < 1e-9


# ---- 2. p0 grid ----------------------------------------------------------------------------------------------
def test_p0_grid_matches_entmax():
    d = P0.p0_grid_data(lim=2.0, points=5)
    ax = d["axis"]
    by = {p["label"]: p for p in d["panels"]}
    assert set(by) == {"softmax", "1.25-entmax", "1.5-entmax", "2-entmax", "top-2 softmax"}
    for pan in d["panels"]:
        for i, z2 in enumerate(ax):
            for j, z1 in enumerate(ax):
                z = torch.tensor([0.0, z1, z2], dtype=torch.float64)
                if pan["alpha"] is None:
                    keep = z >= z.topk(2).values[-1]
                    ref = torch.softmax(z.masked_fill(~keep, -math.inf), -1)[0]
                else:
                    ref = ls.entmax(z, pan["alpha"])[0]
                assert pan["p0"][i][j] == pytest.approx(float(ref), abs=1e-4)
    mid = len(ax) // 2  # z = [0, 0, 0]
    for lab in ("softmax", "1.5-entmax", "2-entmax"):
        assert by[lab]["p0"][mid][mid] == pytest.approx(1 / 3, abs=1e-4)
    # sparsemax: p0 = 0 exactly when z1 ≥ 1 or z2 ≥ 1 ... (and softmax never)
    assert by["2-entmax"]["p0"][0][-1] == 0 and by["softmax"]["frac_exact_zero"] == 0
    d = P0.p0_grid_data(lim=3.0, points=31)  # sparsemax: p0 = 0 iff z1 ≥ 1 or z2 ≥ 1 or z1 + z2 ≥ 1
    sp = next(p for p in d["panels"] if p["label"] == "2-entmax")["p0"]
    for i, z2 in enumerate(d["axis"]):
        for j, z1 in enumerate(d["axis"]):
            margin = max(z1 - 1, z2 - 1, z1 + z2 - 1)
            if abs(margin) > 1e-9:
                assert (sp[i][j] == 0) == (margin > 0)
    assert (
        by["2-entmax"]["frac_exact_zero"] >= by["1.5-entmax"]["frac_exact_zero"] >= by["1.25-entmax"]["frac_exact_zero"]
    )


# ---- 3. dispersion -------------------------------------------------------------------------------------------
def test_synthetic_dispersion_trends():
    d = DISP.synthetic_dispersion_data(ns=(8, 64, 512, 4096), draws=4)
    sm, em = d["series"]["softmax"], d["series"]["1.5-entmax"]
    asm = d["series"]["1.5-entmax(z·log n) (ASEntmax-style)"]
    assert all(a < b for a, b in zip(sm["entropy"], sm["entropy"][1:]))  # softmax disperses ...
    assert sm["entropy"][-1] > 0.8 and sm["support"] == [8, 64, 512, 4096]  # ... towards 1, full support
    assert em["support"][-1] > em["support"][0]  # entmax support grows ...
    assert em["support"][-1] < 0.05 * 4096 and em["entropy"][-1] < 0.5  # ... slowly, entropy bounded
    assert asm["support"][-1] <= em["support"][-1] and asm["signal_weight"][-1] > 0.9
    assert all(0 <= x <= 1 for s in d["series"].values() for x in s["entropy"])


def test_entropy_support_helper():
    p = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    h, s = DISP._entropy_support(p)
    assert h.tolist() == pytest.approx([1.0, 0.0]) and s.tolist() == [4, 1]


# ---- 4. scale fits -------------------------------------------------------------------------------------------
def test_fits_recover_known_parameters():
    n = [float(i + 2) for i in range(2000)]
    gen = torch.Generator().manual_seed(0)
    noise = (torch.randn(len(n), generator=gen, dtype=torch.float64) * 1e-3).tolist()
    s = [1.0 + 0.3 * math.log(x) ** 1.7 + e for x, e in zip(n, noise)]
    f = SC.fit_scale_curves(n, s)
    pl = f["power_log"]
    assert pl["gamma"] == pytest.approx(1.7, abs=0.01)
    assert pl["beta"] == pytest.approx(0.3, abs=0.01) and pl["delta"] == pytest.approx(1.0, abs=0.02)
    assert pl["r2"] > 0.9999 and pl["rmse"] < 2e-3
    assert f["log"]["r2"] < pl["r2"] and f["linear"]["r2"] < f["log"]["r2"]
    exact = SC.fit_scale_curves(n, [2.0 + 0.5 * math.log(x) for x in n])
    assert exact["log"]["delta"] == pytest.approx(2.0) and exact["log"]["beta"] == pytest.approx(0.5)
    assert exact["log"]["rmse"] < 1e-9 and exact["power_log"]["gamma"] == pytest.approx(1.0, abs=1e-3)
    lin = SC.fit_scale_curves(n, [0.01 * x for x in n])
    assert lin["linear"]["beta"] == pytest.approx(0.01) and lin["linear"]["r2"] == pytest.approx(1.0)


# ---- 5. distance profiles ------------------------------------------------------------------------------------
def test_distance_profile_window():
    N, w = 40, 5  # uniform attention over the last w keys (a hard window)
    a = torch.zeros(1, 2, N, N)
    for i in range(N):
        lo = max(0, i - w + 1)
        a[0, 0, i, lo : i + 1] = 1.0 / (i + 1 - lo)
        a[0, 1, i, : i + 1] = 1.0 / (i + 1)  # head 1: uniform over everything
    a[0, 1, :, :] *= (torch.arange(N)[:, None] - torch.arange(N)[None, :] != 3).float()  # dead distance 3
    prof = PROF.distance_profile(a)
    h0, h1 = prof["heads"]
    assert h0["reach"] == w - 1 and h0["dead_distances_within_reach"] == 0
    assert h1["reach"] == N - 1 and h1["dead_distances_within_reach"] == 1
    assert h0["nonzero_frac"][:w] == [1.0] * w and h0["nonzero_frac"][w] == 0.0
    assert h0["mean_weight"][0] == pytest.approx(float(torch.diagonal(a[0, 0]).mean()))


# ---- 6. threshold property -----------------------------------------------------------------------------------
def test_threshold_property():
    d = TH.threshold_data(n=12, appended=(1, 50, 2000), gaps=(1e-3, 1.0), seed=3)
    ent = [r for r in d["rows"] if r["mapping"] != "softmax"]
    soft = [r for r in d["rows"] if r["mapping"] == "softmax"]
    assert ent and soft
    for r in ent:
        assert r["leaked_mass"] == 0.0 and r["support_after"] == r["support_before"]
        # the kernel's τ sums the support in vector lanes, so appended entries below the threshold change the
        # existing weights by float64 rounding at most (in exact arithmetic by nothing)
        assert r["max_abs_change"] <= 1e-15
    for r in soft:
        assert r["leaked_mass"] > 0 and r["max_abs_change"] > 0
    leak = {(r["gap"], r["appended"]): r["leaked_mass"] for r in soft}
    assert leak[(1.0, 2000)] > leak[(1.0, 50)] > leak[(1.0, 1)]
    assert "0 (exact)" in TH.threshold_markdown(d)


def test_entmax_logit_threshold():
    z = torch.tensor([1.0, 0.5, -2.0], dtype=torch.float64)
    thr = TH.entmax_logit_threshold(z, 2.0)  # sparsemax: p = [0.75, 0.25, 0], τ = 0.25
    assert thr == pytest.approx(0.25)


# ---- the command ---------------------------------------------------------------------------------------------
def test_cli_writes_figures_analytic(tmp_path):
    from longsparse_experiments.cli import main

    assert main(["figures", "--out", str(tmp_path), "--quick", "--only", "1,2,6"]) == 0
    for stem in ("fig1_zero_crossing", "fig2_p0_grid", "fig6_threshold"):
        assert (tmp_path / f"{stem}.png").stat().st_size > 1000
        data = json.loads((tmp_path / f"{stem}.json").read_text())
        assert data["quick"] is True and "summary" in data
    assert (tmp_path / "fig6_threshold.md").exists()
    idx = json.loads((tmp_path / "figures.json").read_text())
    assert set(idx["figures"]) == {"zero_crossing", "p0_grid", "threshold"}
    assert main(["figures", "--out", str(tmp_path), "--only", "7"]) == 2  # usage error, not a traceback
    with pytest.raises(SystemExit):
        main(["figures", "--bogus"])


def test_cli_trained_figures_quick(tmp_path, monkeypatch):
    """The model figures end to end on 8-step models (shrunk further here to keep the test fast)."""
    from longsparse_experiments.cli import main

    monkeypatch.setattr(
        context,
        "DEFAULT_RUNS",
        (("entmax-nope", "entmax", "nope"), ("asentmax-nope", "asentmax", "nope"), ("entmax-alibi", "entmax", "alibi")),
    )
    monkeypatch.setattr(context, "QUICK_STEPS", 2)
    assert main(["figures", "--out", str(tmp_path), "--quick", "--only", "dispersion,scales,profiles"]) == 0
    disp = json.loads((tmp_path / "fig3_dispersion.json").read_text())
    assert [r["label"] for r in disp["measured"]["runs"]] == ["entmax/nope", "asentmax/nope", "entmax/alibi"]
    for r in disp["measured"]["runs"]:
        assert all(0 <= e <= 1 for e in r["mean_entropy"]) and all(s >= 1 for s in r["mean_support"])
    sc = json.loads((tmp_path / "fig4_scales.json").read_text())
    heads = [h for r in sc["runs"] for hs in r["layers"].values() for h in hs]
    assert heads and all(h["scaled"] and set(h["fits"]) == {"linear", "log", "power_log"} for h in heads)
    prof = json.loads((tmp_path / "fig5_profiles.json").read_text())
    assert [r["label"] for r in prof["runs"]] == ["entmax/nope", "entmax/alibi"]
    for stem in ("fig3_dispersion", "fig4_scales", "fig5_profiles"):
        assert (tmp_path / f"{stem}.png").stat().st_size > 1000
    # a rerun finds the cached runs complete (no retraining) and can use them via --runs
    runs = sorted(str(p) for p in (tmp_path / "runs" / "quick").iterdir())
    assert main(["figures", "--out", str(tmp_path / "again"), "--quick", "--only", "5", "--runs", *runs]) == 0
    assert json.loads((tmp_path / "again" / "fig5_profiles.json").read_text())["runs"]
