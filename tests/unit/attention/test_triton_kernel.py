"""The Triton α-entmax attention kernels (longsparse.attention.triton_entmax) against the reference path.

Without a GPU the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, set before the kernels
are first built); shapes stay tiny because the interpreter costs milliseconds per tile operation.
Everything is compared with ``ls.attention(..., backend="reference")`` in float64: outputs and the
gradients w.r.t. q, k, v (and q_scale, which reaches the kernel folded into q). One test compiles the
kernels for sm_90 (H100) through Triton's full pipeline, which the interpreter does not exercise.
"""

import importlib.util
import inspect
import json
import math
import os
import shutil
import subprocess
import sys

from helpers.paths import REPO_ROOT

os.environ["TRITON_INTERPRET"] = "1"  # before the first kernel is built (triton reads it at jit time)

import pytest
import torch
from helpers.benchmarks import benchmark_script

pytest.importorskip("triton", reason="triton is not installed (pip install 'longsparse[gpu]')")

import longsparse as ls
from longsparse.attention import dense_logits
from longsparse.attention import triton_entmax as te
from longsparse.attention import triton_ops as ops
from longsparse_experiments.bench.tables import ctas_per_sm

ROOT = REPO_ROOT
# the reference path: backend="reference" (path= is its older, deprecated spelling)
REF = {"backend": "reference"} if "backend" in inspect.signature(ls.attention).parameters else {"path": "reference"}
TOL = 1e-4  # fp32 kernels against the float64 reference (observed ≤ 1e-5)


def _inputs(B=1, H=2, Hkv=None, Nq=77, Nk=77, D=16, dtype=torch.float32, q_scale=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    Hkv = H if Hkv is None else Hkv
    q = torch.randn(B, H, Nq, D, generator=g)
    k = torch.randn(B, Hkv, Nk, D, generator=g)
    v = torch.randn(B, Hkv, Nk, D, generator=g)
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    if q_scale:
        leaves.append((torch.rand(B, H, Nq, 1, generator=g) + 0.5).requires_grad_())
    up = torch.randn(B, H, Nq, D, generator=g)
    return leaves, up


def _range_mask(key_start, key_end, B, Nk):
    """The dense (B, 1, 1, Nk) bool mask of per-row key ranges [start, end) (the reference's oracle)."""
    if key_start is None and key_end is None:
        return None
    j = torch.arange(Nk)[None, :]
    start = torch.zeros(B, dtype=torch.long) if key_start is None else key_start
    end = torch.full((B,), Nk) if key_end is None else key_end
    return ((j >= start[:, None]) & (j < end[:, None])).view(B, 1, 1, Nk)


def _reference_mask(slopes, is_causal, key_start, key_end, B, Nq, Nk, dtype):
    """The reference's mask: the key ranges as a dense bool mask, and for non-causal ALiBi the symmetric bias
    −m·|i + Nk − Nq − j| written out as an additive float mask (an oracle independent of the library's own
    ALiBi), with the key ranges as −inf in it."""
    ranges = _range_mask(key_start, key_end, B, Nk)
    if slopes is None or is_causal:
        return ranges
    i = torch.arange(Nq, dtype=dtype)[:, None] + (Nk - Nq)
    j = torch.arange(Nk, dtype=dtype)[None, :]
    bias = -slopes.to(dtype)[None, :, None, None] * (i - j).abs()  # (1, H, Nq, Nk)
    if ranges is not None:
        bias = bias.masked_fill(~ranges, float("-inf"))
    return bias


def _compare(
    leaves,
    up,
    *,
    alpha,
    is_causal,
    slopes=None,
    key_start=None,
    key_end=None,
    decode=False,
    tol=TOL,
    ref_dtype=torch.float64,
):
    """Kernel vs reference (key ranges as a dense mask): output and gradients of <out, up> w.r.t. every leaf;
    returns the kernel output."""
    q, k, v = leaves[:3]
    q_scale = leaves[3] if len(leaves) > 3 else None
    out = te.entmax_attention_triton(
        q,
        k,
        v,
        alpha=alpha,
        is_causal=is_causal,
        alibi_slopes=slopes,
        q_scale=q_scale,
        key_start=key_start,
        key_end=key_end,
        decode=decode,
    )
    assert out.shape == q.shape and out.dtype == q.dtype
    grads = torch.autograd.grad((out.float() * up).sum(), leaves)
    ref_leaves = [t.detach().to(ref_dtype).requires_grad_() for t in leaves]
    rq, rk, rv = ref_leaves[:3]
    ref = ls.attention(
        rq,
        rk,
        rv,
        mapping="entmax",
        alpha=alpha.to(ref_dtype) if isinstance(alpha, torch.Tensor) else alpha,
        is_causal=is_causal,
        q_scale=ref_leaves[3].squeeze(-1) if q_scale is not None else None,
        attn_mask=_reference_mask(slopes, is_causal, key_start, key_end, q.shape[0], q.shape[2], k.shape[2], ref_dtype),
        alibi_slopes=None if slopes is None or not is_causal else slopes.to(ref_dtype),
        **REF,
    )
    ref_grads = torch.autograd.grad((ref * up.to(ref_dtype)).sum(), ref_leaves)
    torch.testing.assert_close(out.to(ref_dtype), ref, atol=tol, rtol=tol)
    for name, a, b in zip(["q", "k", "v", "q_scale"], grads, ref_grads):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.to(ref_dtype), b, atol=tol, rtol=tol, msg=lambda m, n=name: f"d{n}: {m}")
    return out


NAPE2 = torch.tensor([0.5, 0.0])  # NAPE on two heads: one ALiBi head, one NoPE head
NAPE4 = torch.tensor([1.0, 0.5, 0.0, 0.0])


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("nape_and_q_scale", [False, True], ids=["plain", "nape+qscale"])
def test_matches_reference(alpha, is_causal, nape_and_q_scale):
    """N = 77 (no power of two), three query blocks × three key tiles, fp32, values and gradients."""
    leaves, up = _inputs(q_scale=nape_and_q_scale)
    _compare(leaves, up, alpha=alpha, is_causal=is_causal, slopes=NAPE2 if nape_and_q_scale else None)


@pytest.mark.parametrize("is_causal", [True, False])
def test_gqa_key_lengths_and_fully_masked_rows(is_causal):
    """H = 4 query heads on 2 kv heads; batch 0 padded to 50 keys, batch 1 has no keys: its rows are zero
    (and so are their gradients), never NaN."""
    leaves, up = _inputs(B=2, H=4, Hkv=2)
    lengths = torch.tensor([50, 0])
    out = _compare(leaves, up, alpha=1.5, is_causal=is_causal, slopes=NAPE4, key_end=lengths)
    assert out[1].abs().max() == 0


@pytest.mark.parametrize("Nq", [1, 5])
@pytest.mark.parametrize("decode", [False, True], ids=["block", "decode"])
def test_decoding_offsets(Nq, decode):
    """Nq < Nk: queries at the last Nq positions (bottom-right causal), through the block kernel and the
    split-K decode path (several splits of the 77 keys), gradients included."""
    leaves, up = _inputs(Nq=Nq, Nk=77, q_scale=True)
    _compare(leaves, up, alpha=1.5, is_causal=True, slopes=NAPE2, decode=decode)


def test_decode_path_gqa_lengths_per_head_alpha():
    """The decode path with 4 query heads per kv head in one program, padding, per-head α, non-causal."""
    leaves, up = _inputs(B=2, H=4, Hkv=1, Nq=3, Nk=77, seed=1)
    _compare(
        leaves,
        up,
        alpha=torch.tensor([1.25, 1.5, 1.75, 2.0]),
        is_causal=False,
        slopes=NAPE4,
        key_end=torch.tensor([77, 31]),
        decode=True,
    )


@pytest.mark.parametrize("divisor", [4, 10**9], ids=["candidates", "overflow"])
def test_decode_candidates_and_their_overflow(divisor, monkeypatch):
    """The decode solve reads each split's candidates (X > −1); a row with a split holding more than the cap
    (split / divisor, at least 16) solves over all its logits instead. Both give the reference, for α = 1.5
    (exact finish) and 1.25 (general), with left padding and four splits of 96 keys."""
    monkeypatch.setattr(ops, "_n_sm", lambda device: 8)
    monkeypatch.setattr(ops, "DECODE_CANDIDATE_DIVISOR", divisor)
    leaves, up = _inputs(B=2, H=2, Nq=3, Nk=300, seed=12)
    for alpha in (1.5, 1.25):
        _compare(leaves, up, alpha=alpha, is_causal=True, slopes=NAPE2, decode=True, key_start=torch.tensor([0, 37]))


def test_decode_combine_over_more_splits_than_one_read(monkeypatch):
    """The combine kernel reads a row's splits 16 at a time: with as many SMs as a large GPU, one query row of
    330 keys takes one split per 16-key tile (21 splits), so the sum runs over two reads, the second partly
    masked. A left-padded row, whose leading splits hold no key, and GQA; the result is the reference."""
    monkeypatch.setattr(ops, "_n_sm", lambda device: 132)
    monkeypatch.setattr(ops, "INTERPRETER_BLOCK", 16)
    ops._kernels()
    combine, splits = ops._dec_combine_kernel, []

    class Spy:
        def __getitem__(self, grid):
            def launch(opart, lpart, out, stats, n_split, **kw):
                splits.append(n_split)
                return combine[grid](opart, lpart, out, stats, n_split, **kw)

            return launch

    monkeypatch.setattr(ops, "_dec_combine_kernel", Spy())
    leaves, up = _inputs(B=2, H=2, Hkv=1, Nq=1, Nk=330, q_scale=True, seed=13)
    _compare(leaves, up, alpha=1.5, is_causal=True, slopes=NAPE2, decode=True, key_start=torch.tensor([0, 70]))
    assert splits and all(n == 21 for n in splits)


@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("decode", [False, True], ids=["block", "decode"])
def test_key_ranges_left_and_right_padding(is_causal, decode):
    """Per-row key ranges [start, end) with 32-key tiles: no padding, left padding starting inside the first
    key tile, both sides with the range inside the second tile, and an empty range (start > end: zeros);
    GQA, NAPE, q-scales; through the block kernels (Nq = Nk, so the left pads' own query rows see nothing
    under causal masking) and the split-K decode path (Nq = 3)."""
    Nq = 3 if decode else 45
    leaves, up = _inputs(B=4, H=4, Hkv=2, Nq=Nq, Nk=45, q_scale=True, seed=8)
    out = _compare(
        leaves,
        up,
        alpha=1.5,
        is_causal=is_causal,
        slopes=NAPE4,
        decode=decode,
        key_start=torch.tensor([0, 13, 33, 30]),
        key_end=torch.tensor([45, 45, 44, 25]),
    )
    assert out[3].abs().max() == 0


@pytest.mark.parametrize("start", [20, 40])
def test_decode_splits_with_unaligned_left_padding(start, monkeypatch):
    """The split-K decode path when a row's first key is not a multiple of the key tile: 77 keys in three
    splits ([0, 32), [32, 64), [64, 77)) of 32-key tiles, so the split holding the first key starts its
    tiles there and its last tile reaches into the next split, whose keys it must leave to that split
    (each key counted once, in Σp as in Σp·v). Row 0 is left-padded, row 1 is not."""
    monkeypatch.setattr(ops, "_n_sm", lambda device: 8)  # as many splits as a GPU would make (CPU: 2 SMs)
    leaves, up = _inputs(B=2, H=2, Nq=1, Nk=77, q_scale=True, seed=11)
    _compare(
        leaves,
        up,
        alpha=1.5,
        is_causal=True,
        slopes=NAPE2,
        decode=True,
        key_start=torch.tensor([start, 0]),
    )


def test_left_padded_batch_equals_each_row_alone():
    """A batch whose rows are left-padded by different amounts gives, at every real position, what each
    row gives alone without padding (ALiBi distances and causality are key-index differences, which pads
    before the row do not change); gradients of the real q, k, v rows too, zero for the pads' k, v."""
    leaves, up = _inputs(B=2, H=2, Nq=40, Nk=40, seed=9)
    pads = [7, 35]  # the second row starts in the second key tile
    start = torch.tensor(pads)
    out = te.entmax_attention_triton(*leaves, alpha=1.5, is_causal=True, alibi_slopes=NAPE2, key_start=start)
    grads = torch.autograd.grad((out * up).sum(), leaves)
    for b, s in enumerate(pads):
        alone = [t.detach()[b : b + 1, :, s:].requires_grad_() for t in leaves]
        ref = te.entmax_attention_triton(*alone, alpha=1.5, is_causal=True, alibi_slopes=NAPE2)
        ref_grads = torch.autograd.grad((ref * up[b : b + 1, :, s:]).sum(), alone)
        torch.testing.assert_close(out[b : b + 1, :, s:], ref, atol=1e-6, rtol=1e-5)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g[b : b + 1, :, s:], r, atol=1e-6, rtol=1e-5)
        assert (grads[1][b, :, :s] == 0).all() and (grads[2][b, :, :s] == 0).all()


@pytest.mark.parametrize("D", [32, 64, 128])
def test_head_dims(D):
    """The head dims of the papers' models (the other tests use 16 to stay fast in the interpreter)."""
    leaves, up = _inputs(H=2, Nq=20, Nk=20, D=D, q_scale=True, seed=10)
    _compare(leaves, up, alpha=1.5, is_causal=True, slopes=NAPE2, key_start=torch.tensor([3]))


def test_per_head_alpha():
    leaves, up = _inputs(H=4, Hkv=2, seed=2)
    _compare(leaves, up, alpha=torch.tensor([1.25, 1.5, 1.75, 2.0]), is_causal=True, slopes=NAPE4)


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_exact_finish_sums_to_one_before_renormalising(alpha):
    """α = 1.5 and 2 finish τ in closed form on the certified support: Σp = 1 up to fp32 summation
    round-off before the output pass divides by it (general α stop at a Newton step below 1e-6)."""
    leaves, _ = _inputs(H=2, seed=3)
    q, k, v = (t.detach() * 2 for t in leaves[:3])  # sharper rows: small supports
    out, stats, _ = te.threshold_stats(q, k, v, alpha=alpha, is_causal=True, decode=False)
    assert (stats[2] - 1).abs().max() < 1e-6
    ref = ls.attention(q.double(), k.double(), v.double(), mapping="entmax", alpha=alpha, is_causal=True, **REF)
    assert (out.double() - ref).abs().max() < 2e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    """16-bit inputs, fp32 accumulation: compared with the float32 reference on the same rounded inputs."""
    leaves, up = _inputs(H=2, Nq=40, Nk=40, dtype=dtype, seed=4)
    tol = 2e-2 if dtype == torch.float16 else 6e-2
    _compare(leaves, up, alpha=1.5, is_causal=True, slopes=NAPE2, tol=tol, ref_dtype=torch.float32)


def test_dead_tiles_are_skipped_and_exact(monkeypatch):
    """16×16 tiles and steep ALiBi: most key tiles die (no p > 0). The tile mask marks exactly the tiles
    holding some support, and outputs/gradients computed while skipping the others still match."""
    monkeypatch.setattr(ops, "INTERPRETER_BLOCK", 16)
    leaves, up = _inputs(H=2, seed=5)
    slopes = torch.tensor([2.0, 1.0])
    _compare(leaves, up, alpha=1.5, is_causal=True, slopes=slopes)
    q, k, v = (t.detach() for t in leaves[:3])
    _, _, mask = te.threshold_stats(q, k, v, alpha=1.5, is_causal=True, alibi_slopes=slopes, decode=False)
    z = dense_logits(q.double(), k.double(), scale=0.25, alibi_slopes=slopes.double(), is_causal=True)
    p = ls.entmax(z, 1.5)
    n_qb = mask.shape[-2]
    n_live = n_visited = 0
    for a in range(n_qb):
        for b in range(a + 1):  # causal with Nq = Nk: tiles above the diagonal are never visited
            live = (p[..., a * 16 : (a + 1) * 16, b * 16 : (b + 1) * 16] > 0).flatten(-2).any(-1)
            assert torch.equal(mask[..., a, b].bool(), live), (a, b)
            n_live += int(live.sum())
            n_visited += live.numel()
    assert n_live < n_visited / 2


@pytest.mark.parametrize("is_causal", [True, False])
def test_alibi_band_is_exact_and_skips_tiles(is_causal, monkeypatch):
    """Every pass of the block forward visits only the band of attention/band.py on ALiBi heads (forced on
    at 77 keys in 16-key tiles): steep, gentle and tiny slopes, q-scales above 1, left padding, and a key of
    huge norm far back that a looser bound would drop. Outputs and gradients equal the reference, and the
    steep head visits fewer tiles than a dense pass."""
    monkeypatch.setattr(ops, "BAND_MIN_KEYS", 0)
    monkeypatch.setattr(ops, "INTERPRETER_BLOCK", 16)
    leaves, up = _inputs(H=4, q_scale=True, seed=13)
    with torch.no_grad():
        leaves[1][0, 2, 3] *= 40  # a far-back key that wins head 2's rows despite the bias
    slopes = torch.tensor([2.0, 0.25, 1e-4, 0.0])
    _compare(leaves, up, alpha=1.5, is_causal=is_causal, slopes=slopes, key_start=torch.tensor([5]))
    q, k, v = (t.detach() for t in leaves[:3])
    counts = te.solver_counts(q * leaves[3].detach(), k, v, alpha=1.5, is_causal=is_causal, alibi_slopes=slopes)
    per_pass = counts["tiles_visited"] / (counts["sweeps"] + 2)
    assert (per_pass[0, 0] < counts["causal_tiles"][0, 0]).any()
    assert (counts["uncertified"] == 0).all() and (counts["sweeps"] < te._MAX_SWEEPS_EXACT).all()


@pytest.mark.parametrize(
    "bm, bn, alpha",
    [
        (16, 32, 1.5),
        pytest.param(32, 16, 2.0, marks=pytest.mark.slow),
        pytest.param(16, 32, 1.25, marks=pytest.mark.slow),
    ],
)
def test_query_and_key_tiles_of_different_sizes(bm, bn, alpha, monkeypatch):
    """Query tiles of another size than key tiles (CUDA's float32 tiles at D = 128 are 16 × 32): the causal
    diagonal, the ALiBi band (forced on), dead tiles, key ranges, GQA and q-scales still give the reference's
    outputs and gradients, and decode does too."""
    base = ops._config
    monkeypatch.setattr(ops, "_config", lambda D, dtype, device: dict(base(D, dtype, device), BM=bm, BN=bn))
    monkeypatch.setattr(ops, "BAND_MIN_KEYS", 0)
    leaves, up = _inputs(B=2, H=4, Hkv=2, Nq=77, Nk=77, q_scale=True, seed=21)
    slopes = torch.tensor([2.0, 0.25, 0.0, 0.0])
    _compare(leaves, up, alpha=alpha, is_causal=True, slopes=slopes, key_start=torch.tensor([0, 7]))
    _compare(leaves, up, alpha=alpha, is_causal=False, slopes=slopes, key_end=torch.tensor([77, 50]))
    leaves, up = _inputs(B=2, H=4, Hkv=2, Nq=3, Nk=77, seed=22)
    _compare(leaves, up, alpha=alpha, is_causal=True, slopes=slopes, decode=True)


def _output_and_grads(leaves, up, **kw):
    """The kernel's output and the gradients of <out, up> w.r.t. every leaf (q, k, v, q-scale), in float32."""
    q, k, v, qs = leaves
    out = te.entmax_attention_triton(q, k, v, q_scale=qs, **kw)
    return [out.float(), *(g.float() for g in torch.autograd.grad((out.float() * up).sum(), leaves))]


def _solve_with(monkeypatch, constants: dict, q, k, v, qs, **kw):
    """(output, stats, tile mask, solver counts) of the forward with the triton_ops ``constants`` set (they stay
    set for the rest of the test)."""
    for name, value in constants.items():
        monkeypatch.setattr(ops, name, value)
    out, stats, mask = te.threshold_stats(q, k, v, q_scale=qs, **kw)
    return out, stats, mask, te.solver_counts(q, k, v, q_scale=qs, **kw)


@pytest.mark.parametrize(
    "dtype, fold_from",
    [
        (torch.float32, 0),
        (torch.bfloat16, 1),
        pytest.param(torch.float32, 1, marks=pytest.mark.slow),
        pytest.param(torch.bfloat16, 0, marks=pytest.mark.slow),
    ],
)
def test_folded_output_equals_the_output_pass(dtype, fold_from, monkeypatch):
    """FOLD_FROM: sweeps that also accumulate P·V, and a sweep certifying its whole block that is the output
    pass too. τ, the row max and the tile mask equal those of the kernel with an output pass, and 1/Σp and the
    output agree to rounding, over causal and bidirectional rows, GQA, q-scales, key ranges and the ALiBi band;
    some blocks visit fewer tiles, with the same sweeps. Outputs and gradients: float32 equals the reference;
    bfloat16 (rounded operands in the P·V dots) errs against the float32 reference at most twice as much as the
    kernel with an output pass."""
    monkeypatch.setattr(ops, "INTERPRETER_BLOCK", 16)
    monkeypatch.setattr(ops, "BAND_MIN_KEYS", 0)
    leaves, up = _inputs(B=1, H=2, Hkv=1, Nq=77, Nk=77, q_scale=True, dtype=dtype, seed=23)
    slopes = NAPE2
    q, k, v, qs = (t.detach() for t in leaves)
    for is_causal, ranges in ((True, {"key_start": torch.tensor([9])}), (False, {"key_end": torch.tensor([60])})):
        kw = dict(alpha=1.5, is_causal=is_causal, alibi_slopes=slopes, **ranges)
        *base, base_counts = _solve_with(monkeypatch, {"FOLD_FROM": -1}, q, k, v, qs, **kw)
        base_grads = _output_and_grads(leaves, up, **kw)
        # the float32 kernel (equal to the float64 reference: test_matches_reference) on the same rounded inputs
        want = _output_and_grads([t.float().detach().requires_grad_() for t in leaves], up, **kw)
        out, stats, mask, counts = _solve_with(monkeypatch, {"FOLD_FROM": fold_from}, q, k, v, qs, **kw)
        assert torch.equal(mask, base[2])
        assert torch.equal(stats[:2], base[1][:2])  # row max and τ: the same solve
        assert torch.allclose(stats[2], base[1][2], rtol=1e-5, atol=0)
        assert (out.float() - base[0].float()).abs().max() <= (1e-5 if dtype == torch.float32 else 2e-2)
        assert torch.equal(counts["sweeps"], base_counts["sweeps"])
        saved = base_counts["tiles_visited"] - counts["tiles_visited"]
        assert (saved >= 0).all() and (saved > 0).any()
        if dtype == torch.float32:
            _compare(leaves, up, alpha=1.5, is_causal=is_causal, slopes=slopes, **ranges)
            continue
        for name, a, b, ref in zip(
            ["out", "dq", "dk", "dv", "dq_scale"], _output_and_grads(leaves, up, **kw), base_grads, want
        ):
            assert (a - ref).abs().max() <= 2 * (b - ref).abs().max() + 1e-3, name


@pytest.mark.parametrize(
    "dtype, is_causal",
    [
        (torch.float32, True),
        pytest.param(torch.float32, False, marks=pytest.mark.slow),
        pytest.param(torch.bfloat16, True, marks=pytest.mark.slow),
    ],
)
def test_top_scores_certify_rows_before_any_sweep(dtype, is_causal, monkeypatch):
    """TOP_SCORES: the max pass keeps each row's largest scores, certifies τ of every row whose support is
    smaller and brackets the others'. Against the default kernel on the same inputs (GQA, q-scales, key ranges,
    the ALiBi band): the row max and the tile mask are equal and τ and the output agree to rounding; no block
    takes more sweeps, blocks whose rows all have at most TOP_SCORES keys take none, fewer tiles are visited and
    every row is certified. float32 outputs and gradients equal the float64 reference."""
    monkeypatch.setattr(ops, "INTERPRETER_BLOCK", 16)
    monkeypatch.setattr(ops, "BAND_MIN_KEYS", 0)
    leaves, up = _inputs(B=1, H=2, Hkv=1, Nq=77, Nk=77, q_scale=True, dtype=dtype, seed=23)
    q, k, v, qs = (t.detach() for t in leaves)
    ranges = {"key_start": torch.tensor([9])} if is_causal else {"key_end": torch.tensor([60])}
    kw = dict(alpha=1.5, is_causal=is_causal, alibi_slopes=NAPE2, **ranges)
    *base, base_counts = _solve_with(monkeypatch, {"TOP_SCORES": 0}, q, k, v, qs, **kw)
    out, stats, mask, counts = _solve_with(monkeypatch, {"TOP_SCORES": 16}, q, k, v, qs, **kw)
    assert torch.equal(mask, base[2])
    assert torch.equal(stats[0], base[1][0])
    assert (stats[1] - base[1][1]).abs().max() <= 1e-6
    assert (out.float() - base[0].float()).abs().max() <= (1e-5 if dtype == torch.float32 else 2e-2)
    assert (counts["uncertified"] == 0).all()
    assert (counts["sweeps"] <= base_counts["sweeps"]).all()
    if is_causal:  # query block 0 (rows 0-15, keys from 9): every row has at most 16 keys
        assert (counts["sweeps"][..., 0] == 0).all() and (base_counts["sweeps"][..., 0] > 0).any()
    saved = base_counts["tiles_visited"] - counts["tiles_visited"]
    assert (saved >= 0).all() and (saved > 0).any()
    if dtype == torch.float32:
        _compare(leaves, up, alpha=1.5, is_causal=is_causal, slopes=NAPE2, **ranges)


@pytest.mark.slow  # two minutes in the interpreter (its tl.topk costs seconds a tile)
def test_top_scores_and_folding_compose(monkeypatch):
    """TOP_SCORES with FOLD_FROM: the certifying later sweep is the output pass of a block the largest scores
    left open. Against TOP_SCORES alone on the same inputs (bidirectional rows over a key range, GQA, q-scales,
    the ALiBi band): the same solve (row max, τ, sweeps, tile mask), the output to rounding, fewer tiles visited
    where a sweep folds; float32 outputs and gradients equal the float64 reference. FOLD_FROM = 1, the first
    sweep after the one at P0 points, so that these small blocks fold (the causal blocks of these inputs certify
    before it)."""
    monkeypatch.setattr(ops, "INTERPRETER_BLOCK", 16)
    monkeypatch.setattr(ops, "BAND_MIN_KEYS", 0)
    leaves, up = _inputs(B=1, H=2, Hkv=1, Nq=77, Nk=77, q_scale=True, seed=23)
    q, k, v, qs = (t.detach() for t in leaves)
    ranges = {"key_end": torch.tensor([60])}
    kw = dict(alpha=1.5, is_causal=False, alibi_slopes=NAPE2, **ranges)
    *base, base_counts = _solve_with(monkeypatch, {"TOP_SCORES": 16}, q, k, v, qs, **kw)
    out, stats, mask, counts = _solve_with(monkeypatch, {"FOLD_FROM": 1}, q, k, v, qs, **kw)
    assert torch.equal(mask, base[2])
    assert torch.equal(stats[:2], base[1][:2])
    assert torch.allclose(stats[2], base[1][2], rtol=1e-5, atol=0)
    assert (out - base[0]).abs().max() <= 1e-5
    assert torch.equal(counts["sweeps"], base_counts["sweeps"])
    assert (counts["uncertified"] == 0).all()
    saved = base_counts["tiles_visited"] - counts["tiles_visited"]
    assert (saved >= 0).all() and (saved > 0).any()
    _compare(leaves, up, alpha=1.5, is_causal=False, slopes=NAPE2, **ranges)


def test_solver_counts_bound_the_passes():
    """On random logits the block forward certifies every row exactly, within a few sweeps: the QKᵀ passes
    per block are the max pass, the sweeps and the output pass."""
    q, k, v = (t.detach() for t in _inputs(H=2, Nq=77, Nk=77, seed=14)[0][:3])
    counts = te.solver_counts(q, k, v, alpha=1.5, is_causal=True)
    assert (counts["uncertified"] == 0).all()
    assert (counts["tiles_visited"] == (counts["sweeps"] + 2) * counts["causal_tiles"]).all()
    assert counts["sweeps"].max() <= 4, counts["sweeps"]


def _tolerance_oracle(q, k, v, alpha, slopes, inv, up):
    """What the tolerance mode promises, from float64 autograd: the output is α-entmax of the logits times
    c = S^{1−α} per row (S = the unnormalised Σp the kernel stopped at, 1/stats[2]), and the backward is
    α-entmax's at that output (the logits' gradient taken as if c·z were z: c carries no gradient).
    Returns (out, grads of <out, up> w.r.t. q, k, v, the exact α-entmax output)."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    rq, rk, rv = leaves
    group = q.shape[1] // k.shape[1]
    rk_h, rv_h = rk.repeat_interleave(group, 1), rv.repeat_interleave(group, 1)
    sl = None if slopes is None else slopes.double()
    z = dense_logits(rq, rk_h, scale=q.shape[-1] ** -0.5, alibi_slopes=sl, is_causal=True)
    if isinstance(alpha, torch.Tensor):  # per-head (H,)
        am1, a = (alpha.double() - 1.0).view(1, -1, 1), alpha.double().view(1, -1, 1, 1)
    else:
        am1, a = alpha - 1.0, alpha
    c = (1.0 / inv.double()) ** (-am1)  # (B, H, Nq)
    zc = torch.where(torch.isfinite(z), z * c[..., None], z)
    zc = zc.detach() + (z - z.detach()).masked_fill(~torch.isfinite(z), 0.0)  # value c·z, gradient of z
    out = ls.entmax(zc, a) @ rv_h
    grads = torch.autograd.grad((out * up.double()).sum(), leaves)
    exact = ls.entmax(z.detach(), a) @ rv_h.detach()
    return out.detach(), grads, exact


@pytest.mark.parametrize(
    "alpha,decode",
    [(1.5, False), (2.0, False), (1.25, False), ("per-head", False), (1.5, True)],
    ids=["1.5", "2", "1.25", "per-head", "1.5-decode"],
)
def test_tolerance_mode_is_entmax_of_rescaled_logits(alpha, decode, tolerance=0.05):
    """The opt-in tolerance mode stops a row at some τ̂ with |S − 1| ≤ ε (S = Σp(τ̂)) and renormalises:
    the result is exactly α-entmax of the logits scaled by S^{1−α}, within 2ε·max‖v‖ of the exact output,
    and its gradients are α-entmax's at that output. It never takes more sweeps than the exact solve."""
    H = 4 if alpha == "per-head" else 2
    alpha = torch.tensor([1.25, 1.5, 1.75, 2.0]) if alpha == "per-head" else alpha
    slopes = NAPE4 if H == 4 else NAPE2
    Nq = 3 if decode else 77
    leaves, up = _inputs(H=H, Nq=Nq, Nk=77, seed=21)
    q, k, v = leaves
    kw = dict(alpha=alpha, is_causal=True, alibi_slopes=slopes, decode=decode)
    out = te.entmax_attention_triton(q, k, v, tolerance=tolerance, **kw)
    grads = torch.autograd.grad((out * up).sum(), (q, k, v))
    _, stats, _ = te.threshold_stats(q.detach(), k.detach(), v.detach(), tolerance=tolerance, **kw)
    S = 1.0 / stats[2]
    assert (S - 1).abs().max() <= tolerance + 1e-5
    ref, ref_grads, exact = _tolerance_oracle(q, k, v, alpha, slopes, stats[2], up)
    torch.testing.assert_close(out.double(), ref, atol=TOL, rtol=TOL)
    for name, a, b in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(a.double(), b, atol=TOL, rtol=TOL, msg=lambda m, n=name: f"d{n}: {m}")
    bound = 2 * (S.double() - 1).abs() * v.detach().double().norm(dim=-1).max() + 1e-5
    assert ((out.double() - exact).norm(dim=-1) <= bound).all()
    if not decode:
        fast = te.solver_counts(q.detach(), k.detach(), v.detach(), tolerance=tolerance, **kw)
        exact_counts = te.solver_counts(q.detach(), k.detach(), v.detach(), **kw)
        assert (fast["sweeps"] <= exact_counts["sweeps"]).all()


def test_tolerance_mode_saves_sweeps_for_general_alpha():
    """General α (no closed form) stops at a Newton step below 1e-6 when exact; a tolerance of 0.05 on Σp
    ends rows sweeps earlier."""
    q, k, v = (t.detach() for t in _inputs(H=2, Nq=77, Nk=77, seed=22)[0])
    exact = te.solver_counts(q, k, v, alpha=1.25, is_causal=True)
    fast = te.solver_counts(q, k, v, alpha=1.25, is_causal=True, tolerance=0.05)
    assert fast["sweeps"].sum() < exact["sweeps"].sum()


def test_tolerance_none_is_the_exact_solve():
    q, k, v = (t.detach() for t in _inputs(H=2, Nq=40, Nk=40, seed=23)[0])
    a = te.entmax_attention_triton(q, k, v, alpha=1.5, is_causal=True)
    b = te.entmax_attention_triton(q, k, v, alpha=1.5, is_causal=True, tolerance=None)
    assert torch.equal(a, b)


@pytest.mark.parametrize("bad", [0.0, -0.1, 0.6, float("nan"), True, "0.1"])
def test_tolerance_bad_values_are_refused(bad):
    q, k, v = (t.detach() for t in _inputs(Nq=8, Nk=8)[0])
    assert "tolerance" in te.supports(q, k, v, tolerance=bad)
    with pytest.raises(ValueError, match="tolerance"):
        ls.attention(q, k, v, tolerance=bad, backend="triton")
    with pytest.raises(ValueError, match="tolerance"):
        ls.attention(q, k, v, tolerance=bad, **REF)


def test_tolerance_through_attention_and_exact_backends():
    """ls.attention passes the tolerance to the Triton kernels; backends that solve exactly meet it as is;
    mappings that are not α-entmax refuse it."""
    q, k, v = (t.detach() for t in _inputs(H=2, Nq=40, Nk=40, seed=24)[0])
    via = ls.attention(q, k, v, alpha=1.25, tolerance=0.1, backend="triton")
    direct = te.entmax_attention_triton(q, k, v, alpha=1.25, is_causal=True, tolerance=0.1)
    assert torch.equal(via, direct)
    exact = ls.attention(q, k, v, alpha=1.25, **REF)
    assert torch.equal(ls.attention(q, k, v, alpha=1.25, tolerance=0.1, **REF), exact)
    with pytest.raises(ValueError, match="α-entmax"):
        ls.attention(q, k, v, mapping="topk", tolerance=0.1)


def test_kernel_counts_script_refuses_what_it_would_overwrite(tmp_path, capsys):
    """benchmarks/kernel_counts.py: an existing --out, α outside (1, 2], a bad tolerance, a bad --fold-from and
    a bad --top-scores stop it before any work; its table names α and the solve (exact, folded, largest scores
    kept, or the tolerance)."""
    kernel_counts = benchmark_script("kernel_counts")

    existing = tmp_path / "counts.json"
    existing.write_text("{}")
    for argv, needle in (
        (["--out", str(existing)], "exists"),
        (["--out", str(tmp_path / "a.json"), "--alpha", "2.5"], "outside (1, 2]"),
        (["--out", str(tmp_path / "b.json"), "--tolerance", "0"], "tolerance"),
        (["--out", str(tmp_path / "c.json"), "--fold-from", "-2"], "--fold-from"),
        (["--out", str(tmp_path / "d.json"), "--fold-from", "2", "--alpha", "2"], "α = 1.5 solve only"),
        (["--out", str(tmp_path / "e.json"), "--top-scores", "24"], "a power of two"),
        (["--out", str(tmp_path / "f.json"), "--top-scores", "16", "--tolerance", "0.01"], "α = 1.5 solve only"),
    ):
        with pytest.raises(SystemExit):
            kernel_counts.main(argv)
        assert needle in capsys.readouterr().err
    assert existing.read_text() == "{}" and not (tmp_path / "a.json").exists()
    row = dict(source="random", N=64, heads="nope", qk_passes_mean=4.5, qk_passes_max=6, sweeps_mean=2.5)
    row.update(sweeps_max=4, blocks_at_cap=0, uncertified_rows=0)
    rows = [row, {**row, "alpha": 1.25, "tolerance": 0.01}, {**row, "fold_from": 2}, {**row, "top_scores": 16}]
    existing.write_text(json.dumps({"rows": rows}))
    text = kernel_counts.table(str(existing))
    assert "| random | 1.5 | exact, output folded from sweep 2 | 64 | - | nope |" in text
    assert "| random | 1.5 | exact, 16 largest scores kept | 64 | - | nope |" in text
    assert "| random | 1.5 | exact | 64 | - | nope | 4.50 / 6 |" in text
    assert "| random | 1.25 | 0.01 | 64 | - | nope |" in text


def test_supports_names_what_it_refuses(monkeypatch):
    q, k, v = (t.detach() for t in _inputs(Nq=8, Nk=8)[0])
    assert te.supports(q, k, v, alpha=1.5, is_causal=True) is None
    assert te.supports(q, k, v, mapping="sparsemax") is None
    assert te.supports(q, k, v, alpha=torch.tensor([1.5, 2.0])) is None
    refusals = {
        "dtype": te.supports(q.double(), k.double(), v.double()),
        "head dim": te.supports(q[..., :8], k[..., :8], v[..., :8]),
        "(1, 2]": te.supports(q, k, v, alpha=2.5),
        "requires grad": te.supports(q, k, v, alpha=torch.tensor(1.5, requires_grad=True)),
        "attn_mask": te.supports(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool)),
        "alibi_slopes requires grad": te.supports(q, k, v, alibi_slopes=torch.ones(2, requires_grad=True)),
        "more queries": te.supports(q, k[:, :, :4], v[:, :, :4]),
        "not α-entmax": te.supports(q, k, v, mapping="softmax"),
        "multiple": te.supports(torch.randn(1, 3, 8, 16), k, v),
        "key_start": te.supports(q, k, v, key_start=torch.tensor([1.0])),
        "key_end must be an integer tensor of shape (1,)": te.supports(q, k, v, key_end=torch.tensor([1, 2])),
        "unsupported argument": te.supports(q, k, v, window=4),
        "alpha tensor of shape": te.supports(q, k, v, alpha=torch.tensor([1.5, 1.5, 1.5])),
    }
    for needle, reason in refusals.items():
        assert reason is not None and needle in reason, (needle, reason)
    monkeypatch.setattr(te, "_interpreter_mode", lambda: False)
    assert "CUDA" in te.supports(q, k, v)
    with pytest.raises(ValueError, match="CUDA"):
        te.entmax_attention_triton(q, k, v)


def test_the_backend_checks_a_validated_call_with_the_reasons_of_supports():
    """The triton backend checks the `AttentionCall` (`supports_call`: only what the kernels add to make_call's
    validation) and answers as `supports` does for the same arguments: the calls it takes, and the kernels'
    refusals (mapping, α, dtype, head dims, mask, slopes with a gradient) with the same reason."""
    from longsparse.attention.backends import BACKENDS
    from longsparse.attention.call import make_call

    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    taken = {
        "entmax": ((q, k, v), {}),
        "sparsemax": ((q, k, v), dict(mapping="sparsemax")),
        "per-head alpha": ((q, k, v), dict(alpha=torch.tensor([1.25, 2.0]))),
        "slopes, q-scale, key ranges, tolerance": (
            (q, k, v),
            dict(
                alibi_slopes=torch.tensor([0.5, 0.0]),
                q_scale=torch.ones(1, 2, 8),
                key_start=torch.tensor([2]),
                key_end=torch.tensor([7]),
                tolerance=0.01,
            ),
        ),
    }
    refused = {
        "softmax": ((q, k, v), dict(mapping="softmax")),
        "top-k": ((q, k, v), dict(mapping="topk")),
        "alpha 2.5": ((q, k, v), dict(alpha=2.5)),
        "per-head alpha 3": ((q, k, v), dict(alpha=torch.tensor([1.5, 3.0]))),
        "alpha with a gradient": ((q, k, v), dict(alpha=torch.tensor([1.5, 1.5], requires_grad=True))),
        "float64": (tuple(t.double() for t in (q, k, v)), {}),
        "head dim 24": (tuple(torch.randn(1, 2, 8, 24) for _ in range(3)), {}),
        "value head dim": ((q, k, torch.randn(1, 2, 8, 32)), {}),
        "mask": ((q, k, v), dict(attn_mask=torch.ones(8, 8, dtype=torch.bool))),
        "slopes with a gradient": ((q, k, v), dict(alibi_slopes=torch.tensor([0.5, 0.0], requires_grad=True))),
    }
    for name, (qkv, kw) in {**taken, **refused}.items():
        call = make_call(*qkv, is_causal=True, **kw)
        reason = te.supports(*qkv, is_causal=True, **kw)
        assert (reason is None) == (name in taken), (name, reason)
        assert te.supports_call(call) == reason == BACKENDS["triton"].supports(call), name


def test_torch_compile_traces_the_custom_op():
    """fullgraph tracing through the custom op (fake implementation + registered autograd)."""
    leaves, up = _inputs(H=2, Nq=20, Nk=20, q_scale=True, seed=6)

    def f(q, k, v, s):
        return te.entmax_attention_triton(q, k, v, alpha=1.5, is_causal=True, alibi_slopes=NAPE2, q_scale=s)

    eager = f(*leaves)
    eager_grads = torch.autograd.grad((eager * up).sum(), leaves)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    out = compiled(*leaves)
    grads = torch.autograd.grad((out * up).sum(), leaves)
    torch.testing.assert_close(out, eager)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b)


def test_custom_op_registration_opcheck():
    """Schema, autograd registration and fake implementations (shapes, dtypes and strides of the outputs)
    of the forward and backward ops, also for a q laid out as a model's (B, N, H, D) projection transposed."""
    q_plain, k, v = _inputs(H=2, Nq=6, Nk=6, seed=7)[0]
    q_model_layout = q_plain.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    for q in (q_plain, q_model_layout):
        args = (
            q,
            k,
            v,
            1.5,
            None,
            torch.tensor([0.5, 0.0]),
            torch.tensor([1], dtype=torch.int32),
            torch.tensor([5], dtype=torch.int32),
            0.25,
            True,
            False,
            True,
            0.05,  # tolerance (0: exact)
        )
        torch.library.opcheck(
            te._attention_op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor")
        )
        _, stats, mask, uv = te._attention_op(*args)
        backward_args = (torch.randn(q.shape), q.detach(), k.detach(), v.detach(), stats, mask, uv, *args[3:-3])
        torch.library.opcheck(ops._attention_backward_op, backward_args, test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_traces_a_model_that_calls_it():
    """A model on the triton backend (ASEntmax, NAPE) compiles with fullgraph=True; logits and parameter
    gradients equal eager mode."""
    from longsparse.nn import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(
        ModelConfig.from_dict(
            dict(
                vocab_size=23,
                d_model=32,
                n_layers=1,
                n_heads=2,
                d_ff=64,
                attention=dict(method="asentmax", positions="nape", attn_backend="triton"),
            )
        )
    )
    ids = torch.randint(0, 23, (2, 20))

    def logits_and_grads(f):
        model.zero_grad()
        out = f(ids)
        out.pow(2).sum().backward()
        return [out.detach()] + [p.grad.clone() for p in model.parameters()]

    eager = logits_and_grads(model)
    compiled = logits_and_grads(torch.compile(model, backend="aot_eager", fullgraph=True))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b)


def test_gpu_check_script_dry_run(tmp_path):
    """benchmarks/gpu_check.py runs end to end on CPU: the interpreter, tiny shapes, four checks (the
    kernel tests above cover the rest; left padding on the decode path and in a model's cached generation
    among them) through its worker pool, the kernel's own counts, its timing code once beside a baseline
    kernel (a copy of the attention folder; times unused), the model-level decode rows, the profile and the
    converted Hugging Face model (the training rows' dry run is tests/experiments/test_bench_gpu_train.py)."""
    out = tmp_path / "gpu_check.json"
    baseline = tmp_path / "baseline_attention"  # a copy of a version's attention folder, as from git archive
    shutil.copytree(ROOT / "src" / "longsparse" / "attention", baseline, ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, TRITON_INTERPRET="1")
    cases = ["alpha1.25_causal", "gqa_lengths_masked_rows", "decode_left_padding", "model_generate_left_padded"]
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--dry-run",
            "--out",
            str(out),
            "--workers",
            "1",
            "--baseline",
            str(baseline),
            "--skip-training",  # its rows' dry run: tests/experiments/test_bench_gpu_train.py
            "--cases",
            *cases,
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    checks = data["checks"]
    assert len(checks) == len(cases) and all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
    assert data["dry_run"] is True
    counts = data["solver_counts"]
    assert {r["heads"] for r in counts} == {"alibi", "nope"}
    assert all(r["qk_passes_mean"] >= 2 and r["blocks_at_cap"] == 0 for r in counts), counts
    # the timing code ran once at tiny sizes: every method gave a time, none an error
    rows = data["timings"] + data["decode"]
    assert {r["method"] for r in data["decode"]} == {
        "sdpa",
        "triton_entmax15_decode",
        "triton_entmax15_nape_decode",
        "prev_entmax15_decode",
        "prev_entmax15_nape_decode",
    }
    assert {(r["direction"], r["method"]) for r in data["timings"]} >= {
        (d, f"{family}_{m}")
        for d in ("fwd", "fwd+bwd")
        for family in ("triton", "prev")
        for m in ("entmax15", "entmax15_nape")
    } | {("fwd", "sdpa_flash"), ("fwd+bwd", "sdpa_flash"), ("fwd", "sdpa_softmax_nape")}
    assert all("error" not in r and r["median_s"] > 0 for r in rows), rows
    assert data["profile"]["ms_by_kernel"]
    generation = next(c for c in checks if c["case"] == "model_generate_left_padded")
    assert generation["tokens_equal"] and set(generation["backends"]) == {"triton"}
    assert generation["static_tokens_equal"] == {"static": True} and generation["errors"]["static_logits"] <= 1e-4
    # the model-level decode rows: the dynamic and the static cache (a CUDA graph needs CUDA), the same tokens
    assert {r["mode"] for r in data["model_decode"]} == {"dynamic_eager", "static_eager"}
    assert all(r["tokens_per_s"] > 0 and r["tokens_equal_dynamic"] for r in data["model_decode"]), data["model_decode"]
    # (e) the converted Hugging Face Llama: a training step's and cached generation's attention calls all take the
    # Triton kernels (named here: a dense mask would make it raise), and its steps/s beside transformers' sdpa
    hf = data["hf_model"]
    if importlib.util.find_spec("transformers") is None:
        assert "not installed" in hf["skipped"]
    else:
        assert hf["ok"], hf
        assert set(hf["expected_calls"]) == {"train_step", "generate_dynamic", "generate_static"}
        assert hf["backends"] == {k: {"triton": n} for k, n in hf["expected_calls"].items()}
        assert hf["steps_per_s"]["longsparse"] > 0 and hf["steps_per_s"]["sdpa"] > 0
    assert data["training"] == []
    # --rescore: float32 rows carry the float32 reference's own error; a stored file without it (as the
    # first GPU call wrote) has it recomputed on the CPU, and an error far beyond it fails
    fp32_rows = [c for c in checks if "ref32_errors" in c]
    assert {c["case"] for c in fp32_rows} == {
        "alpha1.25_causal_nape_qscale",
        "gqa_lengths_masked_rows",
        "decode_left_padding",
    }
    row = fp32_rows[0]
    del row["ref32_errors"]
    row["errors"]["dk"] = 1e-2  # far beyond both the fixed bound and 2x the float32 reference's error
    out.write_text(json.dumps(data))
    table = _rescore(out)
    assert len(table) == len(cases) and table["model_generate_left_padded"][-1] == "passes"
    assert table[row["case"]][-1] == "FAILS" and table[row["case"]][0] == "1.0e-02 (dk)"
    assert all(cells[-1] == "passes" for name, cells in table.items() if name != row["case"])


def _rescore(path) -> dict:
    """`gpu_check.py --rescore` on a stored file: its checks table as {check: [cells after the name]}."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--rescore", str(path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    checks = proc.stdout.split("\n\n")[0]  # the checks table; the timing tables follow
    rows = [line.strip("|").split("|") for line in checks.splitlines()[2:]]
    assert "| decode: keys |" in proc.stdout and "| training (GPU-scale model) |" in proc.stdout
    assert "| counts: N |" in proc.stdout and "| converted HF Llama |" in proc.stdout
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_fp32_verdict_bounds_by_float32_arithmetic():
    """A float32 error passes within max(1e-4, 2x the float32 reference's own error), per quantity."""
    fp32_verdict = benchmark_script("gpu_check").fp32_verdict

    assert fp32_verdict({"out": 3e-4, "dk": 5e-5}, {"out": 2e-4, "dk": 1e-6})
    assert not fp32_verdict({"out": 5e-4}, {"out": 2e-4})
    assert not fp32_verdict({"out": 2e-4}, {"out": 1e-6})  # the fixed bound still holds for small errors
    assert not fp32_verdict({"out": math.inf}, {"out": 1e-3})


def test_gpu_check_timing_tables_of_a_call_cut_short(tmp_path):
    """A call whose time ran out before SDPA was timed stores no ratio: its tables show '-' there; the ratio
    to the baseline kernel pairs triton_X with prev_X of the same group."""
    timing_tables = benchmark_script("gpu_check").timing_tables

    data = {
        "timings": [
            {"direction": "fwd", "N": 1024, "D": 64, "method": "triton_entmax15", "median_s": 2e-3, "calls": 9},
            {"direction": "fwd", "N": 1024, "D": 64, "method": "prev_entmax15", "median_s": 4e-3, "calls": 9},
            {"direction": "fwd", "N": 1024, "D": 64, "method": "sdpa_flash", "skipped": "budget"},
        ],
        "decode": [{"Nk": 32768, "method": "triton_entmax15_decode", "replay": "graph", "median_s": 1e-4}],
        "training": [{"part": "train", "method": "softmax", "skipped": "time budget"}],
    }
    path = tmp_path / "call.json"
    path.write_text(json.dumps(data))
    text = timing_tables(str(path))
    assert "| fwd | 1024 | 64 | triton_entmax15 | 2.000 | 9 | - | - | 0.50 | - |" in text
    assert "| fwd | 1024 | 64 | sdpa_flash | budget |" in text
    assert "| 32768 | triton_entmax15_decode | graph | 0.100 | - |" in text and "| softmax | time budget |" in text


def _compile_for_sm90(variants, overrides=None):
    sm90 = benchmark_script("sm90_compile")
    try:
        return sm90.compile_for_sm90(variants, overrides)
    except sm90.PtxasMissing:
        pytest.skip("Triton's bundled ptxas is not available")


PIPELINED = ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel", "_bwd_prep_kernel")  # loops over K / V tiles


def _check_compiled(results):
    for r in results:
        assert r["ptxas_rc"] == 0, r
        assert r["shared"] <= 227 * 1024, r  # H100: 227 KiB of shared memory per block
        limit = 4096 if r["dtype"] == "float32" else 64  # 16-bit: at most a few spilled registers
        assert r["spill_bytes"] <= limit, r
        if r["kernel"] in PIPELINED and r["dtype"] != "float32":  # software-pipelined K / V loads
            assert r["async_copies"] > 0, r


def test_kernels_compile_for_h100():
    """Every kernel through Triton's full compiler (TTIR → PTX → ptxas cubin) for sm_90 with the launch
    configuration used on CUDA: the interpreter never checks types, layouts, shared memory or spills."""
    _check_compiled(_compile_for_sm90([[64, "bfloat16", 1]]))


@pytest.mark.slow
def test_d128_bn32_candidate_compiles_without_spills_at_two_ctas_per_sm():
    """gpu_check's `d128_bn32` launch configuration for D = 128 (16-bit key tiles of 32, the forward at 4 warps):
    no forward or backward kernel spills (the default spills a few bytes in dk/dv and with FOLD_FROM), and the
    exact forward fits two CTAs per SM (the default's 8-warp forward at 255 registers fits one)."""
    overrides = benchmark_script("gpu_check").KERNEL_VARIANTS["d128_bn32"][1]
    results = _compile_for_sm90([[128, "bfloat16", 1], [128, "float16", 1], [128, "bfloat16", 0]], overrides)
    _check_compiled(results)
    spilled = [r for r in results if r["kernel"] in PIPELINED and r["spill_bytes"]]  # the kernels BN and warps set
    assert not spilled, spilled
    exact = [r for r in results if r["kernel"] == "_fwd_kernel" and r["mode"] == 1 and r["consts"]["FOLD_FROM"] < 0]
    assert exact and all(ctas_per_sm(r) >= 2 for r in exact), exact


def test_autotune_off_cuda_launches_the_default_configuration(monkeypatch):
    """AUTOTUNE on and the kernels interpreted (CPU tensors): the launches take `_config`'s warps and stages,
    the outputs and gradients equal the default launch's bit for bit, and no autotuner is built."""
    (q, k, v), up = _inputs(Nq=40, Nk=40)
    slopes = torch.tensor([0.5, 0.0])

    def run():
        out = te.entmax_attention_triton(q, k, v, alpha=1.5, is_causal=True, alibi_slopes=slopes)
        return (out, *torch.autograd.grad(out, (q, k, v), up))

    ref = run()
    monkeypatch.setattr(ops, "AUTOTUNE", True)
    monkeypatch.setattr(ops, "_TUNED", {})
    for got, want in zip(run(), ref):
        assert torch.equal(got, want)
    assert ops._TUNED == {}


def test_autotune_launcher_on_cuda(monkeypatch):
    """As compiled for CUDA (no GPU needed to build the wrappers): AUTOTUNE off gives the kernel with `_config`'s
    options; on, each tuned kernel gets one `triton.autotune` wrapper over TUNE_CONFIGS whose key names are
    kernel arguments (the wrapper's constructor rejects others); instrumented launches, CUDA-graph capture and
    CPU devices keep the default configuration."""
    ops._kernels()
    monkeypatch.setattr(ops, "_BUILT", False)
    monkeypatch.setattr(ops, "_TUNED", {})
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    cuda = torch.device("cuda")
    kernels = (ops._fwd_kernel, ops._bwd_dkdv_kernel, ops._bwd_dq_kernel)
    monkeypatch.setattr(ops, "AUTOTUNE", False)
    assert ops._launcher(ops._fwd_kernel, cuda, 8, 3) == (ops._fwd_kernel, {"num_warps": 8, "num_stages": 3})
    monkeypatch.setattr(ops, "AUTOTUNE", True)
    for kernel in kernels:
        tuned, options = ops._launcher(kernel, cuda, 4, 2)
        assert options == {} and tuned.fn is kernel
        assert [(c.num_warps, c.num_stages) for c in tuned.configs] == list(ops.TUNE_CONFIGS)
        assert tuned.keys == list(ops._TUNE_KEYS[kernel.fn.__name__])
        assert ops._launcher(kernel, cuda, 4, 2)[0] is tuned  # built once
    assert sorted(ops._TUNED) == sorted(ops._TUNE_KEYS)
    dkdv, fwd = ops._TUNED["_bwd_dkdv_kernel"], ops._TUNED["_fwd_kernel"]
    consts = {"D": 128, "MODE": 1, "FOLD_FROM": -1}
    assert {c.num_warps for c in dkdv.early_config_prune(dkdv.configs, {}, **consts)} == {8}  # 4 spills at D = 128
    assert len(fwd.early_config_prune(fwd.configs, {}, **consts)) == len(ops.TUNE_CONFIGS)
    assert ops._launcher(ops._fwd_kernel, cuda, 4, 2, tune=False)[0] is ops._fwd_kernel
    assert ops._launcher(ops._fwd_kernel, torch.device("cpu"), 4, 2)[0] is ops._fwd_kernel
    capturing[0] = True
    assert ops._launcher(ops._fwd_kernel, cuda, 4, 2) == (ops._fwd_kernel, {"num_warps": 4, "num_stages": 2})
    ops._TUNED["_bwd_dq_kernel"].cache[(12, 1, 64, 1, "torch.bfloat16")] = ops.triton.Config(
        {}, num_warps=8, num_stages=3
    )
    assert ops.autotune_choices() == [
        {"kernel": "_bwd_dq_kernel", "key": ["12", "1", "64", "1", "torch.bfloat16"], "num_warps": 8, "num_stages": 3}
    ]


TUNE_SPACE_RECORDS = (  # benchmarks/sm90_compile.py --tune-space: α = 1.5, then general α
    "benchmarks/results/sm90-compile-cpu-2026-11-28-tune-space.json",
    "benchmarks/results/sm90-compile-cpu-2026-11-28-tune-space-general-alpha.json",
)


def test_autotuned_configurations_that_time_are_those_the_compile_record_shows_spill_free():
    """Every (kernel, options, warps, stages) of the stored sm_90 compiles of the tuning space that `tune_spills`
    lets the autotuner time spills at most 64 bytes (16-bit inputs), and the records cover every configuration of
    TUNE_CONFIGS for every tuned kernel, for α = 1.5 and general α."""
    rows = [r for f in TUNE_SPACE_RECORDS for r in json.loads((ROOT / f).read_text())["rows"]]
    seen = {(r["kernel"], r["mode"], r["D"], r["warps"], r["stages"]) for r in rows}
    assert seen == {
        (k, mode, D, w, st) for k in ops._TUNE_KEYS for mode in (0, 1) for D in (64, 128) for w, st in ops.TUNE_CONFIGS
    }
    timed = [
        r
        for r in rows
        if not ops.tune_spills(
            r["kernel"], r["warps"], {"D": r["D"], "MODE": r["mode"], "FOLD_FROM": r["consts"].get("FOLD_FROM", -1)}
        )
    ]
    assert timed and all(r["spill_bytes"] <= 64 and r["ptxas_rc"] == 0 for r in timed), [
        r for r in timed if r["spill_bytes"] > 64
    ]


@pytest.mark.parametrize("n_keys, expected", [(1, 0), (2, 1), (3, 2), (1024, 10), (1025, 11), (4096, 12)])
def test_length_class_is_the_ceiling_of_log2(n_keys, expected):
    """The autotuner's length key: one class per power of two of the key count."""
    assert ops._len_class(n_keys) == expected


ALL_VARIANTS = [(d, dt, 1) for d in (16, 32, 64, 128) for dt in ("bfloat16", "float16", "float32")]
ALL_VARIANTS += [(d, dt, mode) for d in (64, 128) for dt in ("bfloat16", "float32") for mode in (0, 2)]


@pytest.mark.slow
@pytest.mark.parametrize("D, dtype, mode", ALL_VARIANTS)
def test_kernels_compile_for_h100_all_variants(D, dtype, mode):
    """Every head dim and dtype (α = 1.5), and the general and sparsemax variants at D = 64 and 128: one
    compile each, so a slow machine meets each variant's time limit."""
    _check_compiled(_compile_for_sm90([[D, dtype, mode]]))
