"""The C++ kernel's fast paths against their references, at the sizes where its tiling shows: fused_cpu attention
with key tiles and query blocks small enough that rows span many tiles, candidates get pruned and blocks cut
the causal diagonal (the backend grid of tests/unit/attention/test_backends.py runs at N = 37, one tile); the
α-entmax rows of the mapping longer than one segment, with wide supports (pruning) and near-uniform rows."""

from __future__ import annotations

import pytest
import torch
from helpers.mappings import kernel_available, ref_entmax, solver_path

import longsparse as ls
from longsparse import cpu_kernel
from longsparse.attention import chunked

pytestmark = pytest.mark.skipif(not kernel_available(), reason="fused CPU kernel not available")

B, H, D = 2, 4, 16

MAPPINGS = {
    "softmax": dict(mapping="softmax"),
    "entmax15": dict(mapping="entmax", alpha=1.5),
    "entmax13": dict(mapping="entmax", alpha=1.3),
    "sparsemax": dict(mapping="sparsemax"),
    "per_head": dict(mapping="entmax", alpha=torch.tensor([1.0, 1.5, 2.0, 1.2])),
    "entmax3": dict(mapping="entmax", alpha=3.0),
}


@pytest.fixture
def small_tiles(monkeypatch):
    """Key tiles of 8 and blocks of 6 query rows: a row of N keys crosses N / 8 tiles; causal ALiBi calls take
    a band of live keys from one query row on (decoding included)."""
    monkeypatch.setattr(chunked, "FUSED_KEY_TILE", 8)
    monkeypatch.setattr(chunked, "FUSED_BLOCK_ROWS", 6)
    monkeypatch.setattr(chunked, "BAND_MIN_ROWS", 1)


def _qkv(nq, nk, q_mult, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, nq, D, generator=g, dtype=dtype) * q_mult
    return q, torch.randn(B, H, nk, D, generator=g, dtype=dtype), torch.randn(B, H, nk, D, generator=g, dtype=dtype)


def _out_and_grads(q, k, v, backend, q_scale=None, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    if q_scale is not None:
        leaves.append(q_scale.detach().clone().requires_grad_())
        kw["q_scale"] = leaves[-1]
    out = ls.attention(*leaves[:3], backend=backend, **kw)
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    (out * up).sum().backward()
    return [out.detach()] + [t.grad for t in leaves]


def _assert_equal_to_reference(got, want, mapping):
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        if mapping == "entmax3":
            # p^(2−α) is unbounded as p → 0, and the reference solves α > 2 in float64: in fp32 the q-scale
            # gradient of sharp rows differs by up to 3.4e-4 in relative norm (the PyTorch chunked backend by
            # as much); the float64 test below holds the kernel to round-off
            assert (a - b).norm() / b.norm().clamp_min(1e-30) < 1e-3
        else:
            torch.testing.assert_close(a, b, atol=2e-5 * max(1.0, b.abs().max().item()), rtol=2e-5)


# sharp rows (small supports), ordinary rows, near-uniform rows (supports of most keys: pruning, dense gathers)
@pytest.mark.parametrize("q_mult", [4.0, 1.0, 0.02])
@pytest.mark.parametrize("mapping", sorted(MAPPINGS))
@pytest.mark.parametrize("rows", ["causal", "decode", "non_causal"])
def test_fused_attention_over_many_tiles_equals_the_reference(small_tiles, mapping, rows, q_mult):
    nq, nk = (11, 150) if rows == "decode" else (150, 150)
    q, k, v = _qkv(nq, nk, q_mult)
    kw = dict(
        MAPPINGS[mapping],
        is_causal=rows != "non_causal",
        alibi_slopes=torch.tensor([0.5, 0.0, 0.1, 0.02]),
        q_scale=torch.rand(B, H, nq, generator=torch.Generator().manual_seed(3)) + 0.5,
    )
    got = _out_and_grads(q, k, v, "fused_cpu", **kw)
    want = _out_and_grads(q, k, v, "reference", **kw)
    _assert_equal_to_reference(got, want, mapping)


@pytest.mark.parametrize("mapping", ["softmax", "entmax15", "entmax13", "entmax3"])
def test_fused_attention_in_float64_is_exact_to_round_off(small_tiles, mapping):
    q, k, v = _qkv(70, 70, 4.0, dtype=torch.float64)
    got = _out_and_grads(q, k, v, "fused_cpu", **MAPPINGS[mapping])
    want = _out_and_grads(q, k, v, "reference", **MAPPINGS[mapping])
    for a, b in zip(got, want):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_attention_takes_half_precision_inputs(small_tiles, dtype):
    q, k, v = _qkv(40, 40, 1.0)
    got = _out_and_grads(q.to(dtype), k.to(dtype), v.to(dtype), "fused_cpu")
    want = _out_and_grads(q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(), "reference")
    for a, b in zip(got, want):
        assert a.dtype == dtype
        torch.testing.assert_close(a.float(), b, atol=2e-2, rtol=2e-2)


def test_fused_attention_refuses_overflowing_logits():
    q, k, v = _qkv(20, 20, 1.0)
    q[0, 1, 5] = 1e30  # finite inputs whose q·kᵀ overflows to ±inf
    k[0, 1] = 1e30
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        ls.attention(q, k, v, backend="fused_cpu")


def test_fused_attention_on_long_rows_matches_the_reference_at_default_tiles():
    """Default tiles (FUSED_KEY_TILE keys) at a length that spans several, the benchmark's head shape."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 1100, 64, generator=g) for _ in range(3))
    for kw in (dict(mapping="entmax"), dict(mapping="softmax", alibi_slopes=torch.tensor([0.25, 0.0]))):
        got = _out_and_grads(q, k, v, "fused_cpu", **kw)
        want = _out_and_grads(q, k, v, "reference", **kw)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=2e-5 * max(1.0, b.abs().max().item()), rtol=2e-5)


def test_kernel_key_ranges_equal_a_key_mask():
    """attention_forward / _backward with per-batch-row key ranges: the reference with the same keys masked
    (rows that see no key: zeros)."""
    q, k, v = _qkv(30, 30, 1.0)
    lo, hi = torch.tensor([3, 0]), torch.tensor([30, 12])
    keep = (torch.arange(30) >= lo[:, None]) & (torch.arange(30) < hi[:, None])
    for alpha in ([1.5, 1.5, 1.3, 2.0], [1.0, 1.0, 1.0, 1.0]):
        a = torch.tensor(alpha, dtype=torch.float64)
        none = torch.empty(0, dtype=torch.int32)
        args = (a, D**-0.5, True, torch.empty(0, dtype=torch.float64), lo, hi, none, none, 4, 5)
        out, stats, bad = cpu_kernel.get().attention_forward(q, k, v, *args)
        up = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        dq, dk, dv = cpu_kernel.get().attention_backward(q, k, v, up, out, stats, *args)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = ls.attention(
            *leaves, mapping="entmax", alpha=torch.tensor(alpha), attn_mask=keep[:, None, None, :], backend="reference"
        )
        (ref * up).sum().backward()
        assert bad == 0 and (out[:, :, :3][0] == 0).all()  # batch row 0: queries 0-2 see no key
        for a_, b_ in zip((out, dq, dk, dv), [ref.detach()] + [t.grad for t in leaves]):
            torch.testing.assert_close(a_, b_, atol=2e-5, rtol=2e-5)


# ----------------------------------------------------------------------------- ALiBi bands (attention/band.py)


def _recorded_bands(monkeypatch):
    """Records the (band_lo, band_hi) that every fused_cpu forward hands to the kernel."""
    seen = []
    find_band = chunked.FusedSpec.find_band

    def spy(self, qs, k):
        find_band(self, qs, k)
        seen.append((self.band_lo, self.band_hi))

    monkeypatch.setattr(chunked.FusedSpec, "find_band", spy)
    return seen


def test_fused_attention_reads_only_the_band_of_causal_alibi_heads(small_tiles, monkeypatch):
    """A causal ALiBi call gets a band narrower than the visible keys on its ALiBi heads (all keys on the
    slope-0 head), and its outputs and gradients equal the same kernel walking every key and the reference."""
    q, k, v = _qkv(150, 150, 1.0)
    kw = dict(mapping="entmax", alpha=1.5, is_causal=True, alibi_slopes=torch.tensor([1.0, 0.0, 0.5, 0.25]))
    seen = _recorded_bands(monkeypatch)
    got = _out_and_grads(q, k, v, "fused_cpu", **kw)
    assert len(seen) == 1
    lo, hi = seen[0]
    visible = torch.arange(1, 151)
    assert (lo[:, 1] == 0).all() and (hi[:, 1] >= visible).all()
    width = torch.minimum(hi, visible) - lo
    assert (width[:, [0, 2, 3], 40:].amax() < 60) and width[:, [0, 2, 3]].sum() < 0.3 * 3 * B * visible.sum()
    monkeypatch.setattr(chunked.FusedSpec, "find_band", lambda self, qs, k: None)  # every key
    every_key = _out_and_grads(q, k, v, "fused_cpu", **kw)
    for a, b in zip(got, every_key):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    _assert_equal_to_reference(got, _out_and_grads(q, k, v, "reference", **kw), "entmax15")


def test_kernel_skips_the_keys_outside_the_band_it_is_given():
    """attention_forward / _backward read nothing outside [band_lo, band_hi): given a band that leaves out live
    keys, the output is the reference's with those keys masked, and they may hold anything (NaN here)."""
    q, k, v = _qkv(30, 30, 1.0)
    a = torch.full((H,), 1.5, dtype=torch.float64)
    no_slopes, no_ranges = torch.empty(0, dtype=torch.float64), torch.empty(0, dtype=torch.int64)
    lo = torch.full((B, H, 30), 10, dtype=torch.int32)
    hi = torch.full((B, H, 30), 30, dtype=torch.int32)
    args = (a, D**-0.5, False, no_slopes, no_ranges, no_ranges)
    out_band, stats, _ = cpu_kernel.get().attention_forward(q, k, v, *args, lo, hi, 4, 5)
    k_masked = k.clone()
    k_masked[:, :, :10] = float("nan")  # never read
    out_nan, _, bad = cpu_kernel.get().attention_forward(q, k_masked, v, *args, lo, hi, 4, 5)
    assert bad == 0 and torch.equal(out_band, out_nan)
    keep = (torch.arange(30) >= 10)[None, None, None, :]
    ref = ls.attention(q, k, v, mapping="entmax", alpha=1.5, is_causal=False, attn_mask=keep, backend="reference")
    torch.testing.assert_close(out_band, ref, atol=2e-5, rtol=2e-5)
    up = torch.randn(out_band.shape, generator=torch.Generator().manual_seed(1))
    _, dk, dv = cpu_kernel.get().attention_backward(q, k_masked, v, up, out_band, stats, *args, lo, hi, 4, 5)
    assert torch.isfinite(dk).all() and (dk[:, :, :10] == 0).all() and (dv[:, :, :10] == 0).all()
    with pytest.raises(RuntimeError, match="band"):
        cpu_kernel.get().attention_forward(q, k, v, *args, lo.long(), hi.long(), 4, 5)


def _adversarial(case: str, n: int):
    """q, k, v and keyword arguments of a causal NAPE-like call where skipping must not cut the support."""
    q, k, v = _qkv(n, n, 1.0, seed=13)
    kw = dict(mapping="entmax", alpha=torch.tensor([1.5, 1.25, 2.0, 1.5]), is_causal=True)
    kw["alibi_slopes"] = torch.tensor([1.0, 0.5, 0.25, 0.0])
    if case == "huge_key_far_back":  # a key aligned with the last queries, far more than its bias away
        k[:, :, 5] = q[:, :, -1] * 60
    elif case == "tiny_slopes":
        kw["alibi_slopes"] = torch.tensor([1e-3, 1e-5, 2.0**-9, 0.0])
    elif case == "q_scales_above_one":
        kw["q_scale"] = torch.linspace(1.0, 8.0, n).expand(B, H, n).contiguous()
    elif case == "low_diagonal":  # the last keys point away from the last queries: their row max lies far back
        k[:, :, -40:] = -q[:, :, -1:] * 3
        k[:, :, 20] = q[:, :, -1] * 8
    return q, k, v, kw


@pytest.mark.parametrize("case", ["huge_key_far_back", "tiny_slopes", "q_scales_above_one", "low_diagonal"])
def test_fused_attention_with_bands_on_adversarial_inputs_equals_the_reference(small_tiles, case):
    q, k, v, kw = _adversarial(case, 200)
    got = _out_and_grads(q, k, v, "fused_cpu", **kw)
    want = _out_and_grads(q, k, v, "reference", **kw)
    _assert_equal_to_reference(got, want, case)


def test_fused_attention_with_bands_when_decoding_right_padded_rows(small_tiles):
    """Decoding (Nq = 1 and 3) against a cache whose batch rows end before the query's position (key_end) or
    start late (key_start): the band is anchored on the nearest visible keys."""
    for nq in (1, 3):
        q, k, v = _qkv(nq, 120, 2.0, seed=17)
        kw = dict(mapping="entmax", alpha=1.5, is_causal=True, alibi_slopes=torch.tensor([1.0, 0.5, 0.1, 0.0]))
        kw.update(key_start=torch.tensor([0, 30]), key_end=torch.tensor([70, 120]))
        got = _out_and_grads(q, k, v, "fused_cpu", **kw)
        want = _out_and_grads(q, k, v, "reference", **kw)
        _assert_equal_to_reference(got, want, "entmax15")


def test_fused_attention_with_alibi_still_refuses_an_overflowing_logit_far_back(small_tiles):
    q, k, v = _qkv(100, 100, 1.0)
    q[0, 0, -1] = 1e30  # finite inputs whose q·k overflows on a key 96 positions back
    k[0, 0, 3] = 1e30
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        ls.attention(q, k, v, mapping="entmax", alibi_slopes=torch.tensor([1.0, 0.5, 0.25, 0.0]), backend="fused_cpu")


# ----------------------------------------------------------------------------- the mapping's rows


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.3, 1.05, 2.5])
@pytest.mark.parametrize("scale", [0.002, 1.0, 30.0])
def test_long_rows_equal_the_float64_reference(alpha, scale):
    """Rows of 5000 entries: several collection segments, pruning of wide candidate sets (small scale: nearly
    every entry within reach of the max), sharp rows (large scale)."""
    x = torch.randn(3, 5000, generator=torch.Generator().manual_seed(11)) * scale
    x[1, :4000] = float("-inf")
    with solver_path("kernel"):
        p = ls.entmax(x, alpha)
    want = ref_entmax(x.double(), alpha)
    torch.testing.assert_close(p.double(), want, atol=1e-6, rtol=1e-5)
    assert ((p > 0) == (want > 0)).float().mean() > 0.999
