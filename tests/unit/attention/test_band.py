"""`attention.band.alibi_live_keys` against a float64 brute force: every visible key outside the band [first, last)
of a row has probability exactly 0 under α-entmax of the row's logits (checked as X_j = (α−1)(z_j − M) at or below
a proven lower bound of the row's threshold τ), also for logits rounded as a float32 or bfloat16 kernel would
round them; and the band is narrow on typical inputs."""

from __future__ import annotations

import itertools

import pytest
import torch

from longsparse.attention.band import alibi_live_keys
from longsparse.mappings.entmax import entmax


def _positions_and_visibility(B, Nq, Nk, is_causal, key_start, key_end):
    """P (Nq,) and the visible-key mask (B, 1, Nq, Nk)."""
    P = torch.arange(Nk - Nq, Nk)
    j = torch.arange(Nk)
    lo = torch.zeros(B, dtype=torch.int64) if key_start is None else key_start.clamp(0, Nk)
    hi = torch.full((B,), Nk) if key_end is None else key_end.clamp(0, Nk)
    vis = (j >= lo[:, None, None]) & (j < hi[:, None, None])  # (B, 1, Nk)
    vis = vis.expand(B, Nq, Nk)
    if is_causal:
        vis = vis & (j[None, None, :] <= P[None, :, None])
    return P, vis[:, None]


def _logits(q, k, slopes, scale, is_causal, dtype=torch.float64):
    """z (B, H, Nq, Nk) in dtype, the dot products accumulated in dtype, symmetric ALiBi when not causal."""
    B, H, Nq, _ = q.shape
    Nk = k.shape[2]
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    z = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2)) * scale
    dist = (torch.arange(Nk - Nq, Nk)[:, None] - torch.arange(Nk)[None, :]).to(dtype)
    dist = dist if is_causal else dist.abs()
    return z - slopes.to(dtype).view(1, H, 1, 1) * dist


def _threshold_lower_bound(z, vis, alpha):
    """X = (α−1)(z − M) (−inf where not visible) and a proven lower bound of each row's τ (bisection on
    f(τ) = Σ [X − τ]₊^{1/(α−1)} − 1, keeping f(lo) ≥ 0), float64; rows with α ≤ 1 get lo = −inf."""
    a = alpha.view(1, -1, 1, 1)
    zm = z.masked_fill(~vis, float("-inf"))
    M = zm.amax(-1, keepdim=True)
    am1 = (a - 1).clamp_min(1e-12)
    X = am1 * (zm - M.clamp_min(-1e300))
    e = 1.0 / am1
    lo = torch.full(M.shape, -1.0, dtype=torch.float64)
    hi = torch.zeros(M.shape, dtype=torch.float64)
    for _ in range(200):
        mid = (lo + hi) / 2
        f = (X - mid).clamp_min(0).pow(e).sum(-1, keepdim=True) - 1
        lo = torch.where(f >= 0, mid, lo)
        hi = torch.where(f >= 0, hi, mid)
    lo = torch.where(a > 1, lo, torch.full_like(lo, float("-inf")))
    return X, lo


def _check_band(
    q, k, slopes, alpha, scale, is_causal, key_start=None, key_end=None, kernel_q=None, kernel_k=None, device="cpu"
):
    """Runs alibi_live_keys (on `device`, every tensor argument moved there) and checks it against the float64
    oracle; returns (first, last, vis)."""
    B, H, Nq, _ = q.shape
    Nk = k.shape[2]
    alpha_t = torch.as_tensor(alpha, dtype=torch.float64).reshape(-1).expand(H)
    on = (lambda t: None if t is None else t.to(device)) if device != "cpu" else (lambda t: t)
    first, last = alibi_live_keys(
        on(q),
        on(k),
        alibi_slopes=on(slopes),
        alpha=on(alpha) if isinstance(alpha, torch.Tensor) else alpha,
        scale=scale,
        is_causal=is_causal,
        key_start=on(key_start),
        key_end=on(key_end),
    )
    assert first.shape == last.shape == (B, H, Nq) and first.dtype == last.dtype == torch.int32
    assert first.device.type == torch.device(device).type
    first, last = first.cpu().long(), last.cpu().long()
    P, vis = _positions_and_visibility(B, Nq, Nk, is_causal, key_start, key_end)
    j = torch.arange(Nk)
    in_band = (j >= first[..., None]) & (j < last[..., None])
    # the band lies within the visible keys and is empty only where a row sees nothing
    assert not (in_band & ~vis).any()
    sees = vis.any(-1)
    assert torch.equal(last > first, sees.expand(B, H, Nq))
    # heads without a positive slope or with α ≤ 1: the whole visible range
    full = ((slopes <= 0) | (alpha_t <= 1)).view(1, H, 1, 1)
    assert torch.equal((in_band == vis) | ~full, torch.ones_like(in_band))
    # the oracle: every visible key outside the band is at or below a lower bound of τ (float64 logits of q, k
    # as given, and of what a kernel would compute: kernel_q / kernel_k in float32)
    variants = [(q, k, torch.float64)]
    if kernel_q is not None or kernel_k is not None:
        variants.append((q if kernel_q is None else kernel_q, k if kernel_k is None else kernel_k, torch.float32))
    for qv, kv, dt in variants:
        z = _logits(qv, kv, slopes, scale, is_causal, dtype=dt).to(torch.float64)
        X, tau_lo = _threshold_lower_bound(z, vis, alpha_t)
        outside = vis & ~in_band
        assert (X <= tau_lo)[outside].all(), f"a key outside the band may be live ({dt})"
    return first, last, vis


def _inputs(B, H, Hkv, Nq, Nk, D, seed, q_mult=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Nq, D, generator=g, dtype=dtype) * q_mult
    k = torch.randn(B, Hkv, Nk, D, generator=g, dtype=dtype)
    return q, k


SLOPES = torch.tensor([1.0, 0.5, 0.25, 0.0])
TINY = torch.tensor([1e-3, 1e-6, 2.0**-8, 0.0])

GRID = list(
    itertools.product(
        (True, False),  # causal
        (4, 2, 1),  # kv heads (GQA)
        ("none", "ranges"),  # key ranges
        ((40, 40), (7, 40), (1, 40)),  # (Nq, Nk): prefill, chunked prefill, decoding
        (1.25, 1.5, 2.0, "per_head"),
    )
)


@pytest.mark.parametrize("is_causal,hkv,ranges,shape,alpha", GRID)
def test_band_holds_every_live_key(is_causal, hkv, ranges, shape, alpha):
    Nq, Nk = shape
    q, k = _inputs(2, 4, hkv, Nq, Nk, 16, seed=hash((is_causal, hkv, ranges, shape, str(alpha))) % 1000, q_mult=2.0)
    a = torch.tensor([1.5, 1.0, 2.0, 1.25]) if alpha == "per_head" else alpha
    ks = ke = None
    if ranges == "ranges":
        ks, ke = torch.tensor([0, 9]), torch.tensor([33, 40])  # right padding on row 0, left on row 1
    _check_band(q, k, SLOPES, a, 0.25, is_causal, ks, ke)


@pytest.mark.parametrize("is_causal", (True, False))
@pytest.mark.parametrize("alpha", (1.25, 1.5, 2.0))
def test_band_holds_with_tiny_slopes_and_large_q_scales(is_causal, alpha):
    q, k = _inputs(1, 4, 4, 64, 64, 32, seed=3)
    q_scale = torch.linspace(1.0, 6.0, 64).view(1, 1, 64, 1)  # ASEntmax-like scales > 1, grown with position
    _check_band(q * q_scale, k, TINY, alpha, 32**-0.5, is_causal)
    _check_band(q * q_scale, k, SLOPES * 4, alpha, 32**-0.5, is_causal)


@pytest.mark.parametrize("is_causal", (True, False))
def test_band_reaches_a_huge_key_far_back(is_causal):
    """One key far back with a huge norm aligned with a query: it is live and the band must reach it."""
    q, k = _inputs(1, 4, 4, 200, 200, 16, seed=5)
    k[:, :, 3] = q[:, :1, -1] * 100  # aligned with head 0's last query, 100× its norm
    first, last, _ = _check_band(q, k, SLOPES, 1.5, 0.25, is_causal)
    # the oracle shows key 3 live for the last query of head 0 (slope 1): the band must include it
    z = _logits(q, k, SLOPES, 0.25, is_causal)
    p = entmax(z[0, 0, -1:, :], alpha=1.5)
    assert p[0, 3] > 0
    assert first[0, 0, -1] <= 3


@pytest.mark.parametrize("is_causal", (True, False))
def test_band_holds_for_a_query_whose_near_logits_are_very_low(is_causal):
    """A query anti-aligned with the keys next to it: its row max lies far back, LB is very low."""
    q, k = _inputs(1, 4, 4, 100, 100, 16, seed=7)
    k[:, :, 80:] = -q[:, :, -1:].expand(1, 4, 20, 16) * 3  # the last 20 keys point away from the last query
    _check_band(q, k, SLOPES * 0.1, 1.5, 0.5, is_causal)


def test_band_holds_against_float32_and_bfloat16_kernel_logits():
    """The band computed from float32 q·s is wide enough for a kernel that rounds q·s and k to bfloat16 and
    accumulates in float32, on rows engineered so that many keys sit just below the threshold."""
    q, k = _inputs(1, 4, 4, 128, 128, 64, seed=11, q_mult=3.0)
    for is_causal, alpha in itertools.product((True, False), (1.25, 1.5, 2.0)):
        _check_band(
            q,
            k,
            SLOPES,
            alpha,
            0.125,
            is_causal,
            kernel_q=q.to(torch.bfloat16).float(),
            kernel_k=k.to(torch.bfloat16).float(),
        )


def test_rows_that_see_no_key_and_inputs_without_slopes():
    q, k = _inputs(2, 4, 4, 10, 10, 8, seed=1)
    assert alibi_live_keys(q, k, alibi_slopes=None, alpha=1.5, scale=1.0, is_causal=True) is None
    ks, ke = torch.tensor([5, 0]), torch.tensor([10, 0])  # row 1 sees nothing; row 0's first queries neither
    first, last = alibi_live_keys(
        q, k, alibi_slopes=SLOPES, alpha=1.5, scale=1.0, is_causal=True, key_start=ks, key_end=ke
    )
    assert torch.equal(first[1], last[1]) and (first[1] == 0).all()
    assert torch.equal(first[0, :, :5], last[0, :, :5]) and (first[0, :, :5] == 5).all()


def test_bad_arguments_are_refused_with_one_line():
    q, k = _inputs(1, 4, 4, 10, 10, 8, seed=1)
    with pytest.raises(ValueError, match="alibi_slopes must have shape"):
        alibi_live_keys(q, k, alibi_slopes=torch.ones(3), alpha=1.5, scale=1.0, is_causal=True)
    with pytest.raises(ValueError, match="alpha must be"):
        alibi_live_keys(q, k, alibi_slopes=SLOPES, alpha=torch.ones(3), scale=1.0, is_causal=True)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        alibi_live_keys(q, k[:, :3], alibi_slopes=SLOPES, alpha=1.5, scale=1.0, is_causal=True)
    with pytest.raises(ValueError, match="key_start / key_end"):
        alibi_live_keys(q, k, alibi_slopes=SLOPES, alpha=1.5, scale=1.0, is_causal=True, key_start=torch.zeros(2))


def test_band_is_narrow_on_typical_inputs():
    """N = 4096, NAPE slopes 1/h on four of eight heads, D = 64, q, k ~ N(0, 1), scale 1/8, causal 1.5-entmax:
    the band keeps a small fraction of the visible keys on the ALiBi heads (measured: see the assertion)."""
    N, D = 4096, 64
    slopes = torch.tensor([1.0, 1 / 2, 1 / 3, 1 / 4, 0, 0, 0, 0])
    q, k = _inputs(1, 8, 8, N, N, D, seed=0)
    first, last = alibi_live_keys(q, k, alibi_slopes=slopes, alpha=1.5, scale=D**-0.5, is_causal=True)
    width = (last - first).double()
    visible = torch.arange(1, N + 1, dtype=torch.float64)
    live_fraction = width[0, :4].sum() / (4 * visible.sum())
    widest = width[0, :4].amax(-1)
    print(f"live fraction {live_fraction:.5f}; widest band per ALiBi head {widest.tolist()}")
    assert live_fraction < 0.02
    assert (widest <= torch.tensor([40.0, 80, 120, 160])).all()
    assert torch.equal(width[0, 4:], visible.expand(4, N))


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float64))
def test_band_takes_every_floating_dtype(dtype):
    q, k = _inputs(1, 4, 2, 30, 50, 16, seed=2, q_mult=2.0)
    first, last, _ = _check_band(q.to(dtype), k.to(dtype), SLOPES, 1.5, 0.25, True)
    reference = alibi_live_keys(q, k, alibi_slopes=SLOPES, alpha=1.5, scale=0.25, is_causal=True)
    assert first.device == q.device
    assert (last - first).sum() <= (reference[1] - reference[0]).sum() * 1.1 + 30


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_band_on_cuda_holds_without_host_synchronisation_and_in_a_cuda_graph():
    """On CUDA: the oracle holds, no op synchronises with the host (sync debug mode "error"), and a decoding
    step's band captured in a CUDA graph and replayed on new q, k equals the band computed eagerly."""
    q, k = _inputs(2, 4, 2, 40, 40, 16, seed=21, q_mult=2.0)
    ks, ke = torch.tensor([0, 9]), torch.tensor([33, 40])
    alpha = torch.tensor([1.5, 1.0, 2.0, 1.25])
    torch.cuda.set_sync_debug_mode("error")
    try:
        for is_causal, (nq, nk) in itertools.product((True, False), ((40, 40), (1, 40))):
            _check_band(q[:, :, -nq:], k[:, :, :nk], SLOPES, alpha, 0.25, is_causal, ks, ke, device="cuda")
            _check_band(q[:, :, -nq:], k[:, :, :nk], SLOPES, 1.5, 0.25, is_causal, device="cuda")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    dev = torch.device("cuda")
    static = [t.to(dev) for t in _inputs(2, 4, 2, 1, 300, 16, seed=22, q_mult=2.0)]
    kw = dict(
        alibi_slopes=SLOPES.to(dev), alpha=1.5, scale=0.25, is_causal=True, key_end=torch.tensor([250, 300], device=dev)
    )
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        alibi_live_keys(*static, **kw)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = alibi_live_keys(*static, **kw)
    for seed in (23, 24):
        fresh = _inputs(2, 4, 2, 1, 300, 16, seed=seed, q_mult=3.0)
        for s_t, f_t in zip(static, fresh):
            s_t.copy_(f_t.to(dev))
        graph.replay()
        eager = alibi_live_keys(*static, **kw)
        assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1])
