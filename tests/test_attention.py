"""ls.attention: the chunked path equals the dense reference, the reference equals a float64
brute-force formula, and the edge cases (masks, decoding, GQA, dtypes) behave."""
import math

import pytest
import torch
import torch.nn.functional as F

import longsparse as ls
from longsparse.attention import ADATEMP_POLY

B, H, N, D = 2, 4, 37, 8


def _qkv(nq=N, nk=N, hkv=H, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, nq, D, generator=g, dtype=dtype)
    k = torch.randn(B, hkv, nk, D, generator=g, dtype=dtype)
    v = torch.randn(B, hkv, nk, D, generator=g, dtype=dtype)
    return q, k, v


def _run(path, q, k, v, q_scale=None, **kw):
    """Output and gradients of q, k, v (and q_scale) under a fixed upstream gradient."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    qs = None if q_scale is None else q_scale.detach().clone().requires_grad_()
    out = ls.attention(*leaves, q_scale=qs, path=path, **kw)
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    (out * up).sum().backward()
    return [out] + [t.grad for t in leaves] + ([qs.grad] if qs is not None else [])


def brute_force(q, k, v, *, mapping, alpha=1.5, is_causal=True, alibi_slopes=None, q_scale=None,
                attn_mask=None, topk=32, adatemp_order="original"):
    """Float64 loops over (b, h, i): the formulas of SPEC §2 written out row by row."""
    q, k, v = q.double(), k.double(), v.double()
    nq, nk = q.shape[2], k.shape[2]
    rep = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(nq):
                pos = nk - nq + i
                qi = q[b, h, i] * (1.0 if q_scale is None else float(q_scale[b, h, i]))
                z = torch.empty(nk, dtype=torch.float64)
                for j in range(nk):
                    z[j] = qi @ k[b, h // rep, j] / math.sqrt(q.shape[-1])
                    if alibi_slopes is not None:
                        z[j] -= float(alibi_slopes[h]) * (pos - j)
                    if attn_mask is not None:
                        m = attn_mask.expand(q.shape[0], q.shape[1], nq, nk)[b, h, i, j]
                        if attn_mask.dtype == torch.bool:
                            z[j] = z[j] if m else -math.inf
                        else:
                            z[j] += float(m)
                    if is_causal and j > pos:
                        z[j] = -math.inf
                if torch.isinf(z).all():
                    continue            # nothing to attend to: zero output
                if mapping == "softmax":
                    p = torch.softmax(z, 0)
                elif mapping == "entmax":
                    a = alpha if not torch.is_tensor(alpha) else float(alpha[h])
                    p = _entmax_bisect64(z, a)
                elif mapping == "topk":
                    kth = torch.sort(z, descending=True).values[min(topk, nk) - 1]
                    p = torch.softmax(torch.where(z >= kth, z, torch.tensor(-math.inf, dtype=z.dtype)), 0)
                elif mapping == "adatemp":
                    p0 = torch.softmax(z, 0)
                    ent = -(p0[p0 > 0] * torch.log(p0[p0 > 0])).sum().item()
                    c = ADATEMP_POLY[adatemp_order]
                    poly = sum(ci * ent ** (4 - n) for n, ci in enumerate(c))
                    theta = max(1.0, poly) if ent > 0.5 else 1.0
                    p = torch.softmax(theta * z, 0)
                else:
                    raise AssertionError(mapping)
                out[b, h, i] = p @ v[b, h // rep]
    return out


def _entmax_bisect64(z, alpha, iters=200):
    """Float64 bisection on τ: Σ [(α−1) z − τ]₊^{1/(α−1)} = 1."""
    x = (alpha - 1) * (z - z.max())
    lo, hi = -1.0, 0.0
    for _ in range(iters):
        tau = (lo + hi) / 2
        s = torch.clamp(x - tau, min=0).pow(1 / (alpha - 1)).sum().item()
        lo, hi = (tau, hi) if s > 1 else (lo, tau)
    p = torch.clamp(x - (lo + hi) / 2, min=0).pow(1 / (alpha - 1))
    return p / p.sum()


CASES = {
    "softmax": dict(mapping="softmax"),
    "entmax15": dict(mapping="entmax"),
    "entmax13": dict(mapping="entmax", alpha=1.3),
    "sparsemax": dict(mapping="sparsemax"),
    # α ≤ 2 here: for α > 2 the Jacobian carries p^{2−α}, unbounded as p → 0, so fp32 gradients of two
    # correct paths differ by more than 1e-5 near the support boundary (α > 2 values are checked below)
    "per_head_alpha": dict(mapping="entmax", alpha=torch.tensor([1.2, 1.5, 2.0, 1.75])),
    "entmax3": dict(mapping="entmax", alpha=3.0),
    "topk": dict(mapping="topk", topk=5),
    "adatemp": dict(mapping="adatemp"),
    "adatemp_reversed": dict(mapping="adatemp", adatemp_order="reversed"),
    "alibi": dict(mapping="entmax", alibi_slopes=torch.tensor([1.0, 0.5, 0.25, 0.0])),
    "q_scale": dict(mapping="entmax", q_scale=torch.rand(B, H, N, generator=torch.Generator().manual_seed(3)) * 3 + 0.5),
    "non_causal": dict(mapping="entmax", is_causal=False),
    "bool_mask": dict(mapping="entmax", attn_mask=torch.rand(B, 1, N, N, generator=torch.Generator().manual_seed(4)) > 0.3),
    "additive_mask": dict(mapping="softmax", attn_mask=torch.randn(1, H, N, N, generator=torch.Generator().manual_seed(5))),
}


@pytest.mark.parametrize("case", sorted(set(CASES) - {"entmax3"}))
def test_chunked_equals_reference_outputs_and_grads(case):
    q, k, v = _qkv()
    kw = CASES[case]
    ref = _run("reference", q, k, v, **kw)
    for chunk in (1, 5, 16):
        fast = _run("chunked", q, k, v, chunk_size=chunk, **kw)
        for a, b in zip(ref, fast):
            assert torch.isfinite(b).all()
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_chunked_equals_reference_alpha_above_two():
    q, k, v = _qkv()
    ref = _run("reference", q, k, v, **CASES["entmax3"])
    fast = _run("chunked", q, k, v, chunk_size=5, **CASES["entmax3"])
    torch.testing.assert_close(fast[0], ref[0], atol=1e-5, rtol=1e-5)
    for a, b in zip(ref[1:], fast[1:]):
        assert ((a - b).norm() / a.norm()) < 1e-5


@pytest.mark.parametrize("case", ["softmax", "entmax15", "entmax3", "per_head_alpha", "topk", "adatemp", "alibi", "q_scale",
                                  "bool_mask", "additive_mask", "non_causal"])
def test_reference_matches_float64_brute_force(case):
    q, k, v = _qkv(seed=1)
    kw = dict(CASES[case])
    out = ls.attention(q, k, v, path="reference", **kw)
    expect = brute_force(q, k, v, **kw)
    torch.testing.assert_close(out.double(), expect, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("case", ["adatemp", "adatemp_reversed", "topk"])
@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_after_logits_matches_brute_force(case, causal):
    """"auto" runs adaptive temperature and top-k through SDPA after a no-grad pass over the logits (θ
    scales q and the bias / the k largest stay unmasked): the float64 brute force with ALiBi, an additive
    mask and a masked key, and decoding rows too."""
    q, k, v = _qkv(seed=2)
    mask = torch.randn(1, H, N, N, generator=torch.Generator().manual_seed(6))
    mask[..., 2] = float("-inf")
    kw = dict(CASES[case], is_causal=causal, attn_mask=mask, alibi_slopes=torch.tensor([1.0, 0.5, 0.25, 0.0]))
    out = ls.attention(q * 4, k, v, **kw)       # × 4: sharper rows, so that θ > 1 on some and 1 on others
    torch.testing.assert_close(out.double(), brute_force(q * 4, k, v, **kw), atol=2e-6, rtol=1e-5)
    if causal:
        part = ls.attention(q[:, :, -3:] * 4, k, v, **dict(kw, attn_mask=mask[:, :, -3:]))
        torch.testing.assert_close(part, out[:, :, -3:], atol=1e-6, rtol=1e-5)


def test_softmax_matches_sdpa():
    q, k, v = _qkv()
    torch.testing.assert_close(ls.attention(q, k, v, mapping="softmax"),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6, rtol=1e-5)
    mask = torch.rand(B, H, N, N) > 0.2
    mask[..., 0] = True
    torch.testing.assert_close(ls.attention(q, k, v, mapping="softmax", is_causal=False, attn_mask=mask),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("path", ["reference", "chunked"])
def test_decoding_rows_equal_the_full_rows(path):
    """Queries sit at the last Nq key positions: the last rows of a full pass equal a decode step."""
    q, k, v = _qkv()
    slopes = torch.tensor([0.5, 0.25, 0.0, 1.0])
    scale = torch.rand(B, H, N) + 0.5
    full = ls.attention(q, k, v, alibi_slopes=slopes, q_scale=scale, path=path)
    for nq in (1, 3):
        part = ls.attention(q[:, :, -nq:], k, v, alibi_slopes=slopes, q_scale=scale[:, :, -nq:], path=path)
        torch.testing.assert_close(part, full[:, :, -nq:], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("path", ["reference", "chunked"])
def test_gqa_equals_repeated_heads(path):
    q, k, v = _qkv(hkv=2)
    grads = _run(path, q, k, v, mapping="entmax")
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    full = _run(path, q, kr, vr, mapping="entmax")
    torch.testing.assert_close(grads[0], full[0], atol=1e-6, rtol=1e-5)
    # the gradient of a shared k/v head is the sum over the query heads that read it
    torch.testing.assert_close(grads[2], full[2].view(B, 2, 2, N, D).sum(2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[3], full[3].view(B, 2, 2, N, D).sum(2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mapping", ["softmax", "entmax", "sparsemax", "topk", "adatemp"])
@pytest.mark.parametrize("path", ["reference", "chunked"])
def test_fully_masked_rows_give_zeros_and_no_nan(mapping, path):
    q, k, v = _qkv()
    mask = torch.ones(B, H, N, N, dtype=torch.bool)
    mask[:, :, 3] = False          # query 3 can see nothing
    mask[1, 2, 10] = False
    outs = _run(path, q, k, v, mapping=mapping, attn_mask=mask, chunk_size=4)
    for t in outs:
        assert torch.isfinite(t).all()
    assert (outs[0][:, :, 3] == 0).all() and (outs[0][1, 2, 10] == 0).all()
    assert (outs[1][:, :, 3] == 0).all()       # no gradient flows through an empty row


def test_bf16_inputs():
    q, k, v = _qkv()
    ref = ls.attention(q, k, v)
    out = ls.attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)
    grads = _run("chunked", q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert all(g.dtype == torch.bfloat16 and torch.isfinite(g.float()).all() for g in grads)


def test_learned_per_head_alpha_gets_a_gradient():
    q, k, v = _qkv(nq=6, nk=6)
    q, k, v = q.double(), k.double(), v.double()
    alpha = torch.tensor([1.3, 1.5, 1.8, 2.2], dtype=torch.float64, requires_grad=True)
    out = ls.attention(q, k, v, alpha=alpha)         # auto → reference path, which differentiates α
    out.sum().backward()
    assert alpha.grad is not None and torch.isfinite(alpha.grad).all() and alpha.grad.abs().sum() > 0
    assert torch.autograd.gradcheck(lambda a: ls.attention(q, k, v, alpha=a), (alpha.detach().requires_grad_(),))


def test_chunked_backward_saves_only_its_inputs():
    """The recomputing backward keeps q, k, v (and q_scale), never a score-sized buffer."""
    q, k, v = [t.requires_grad_() for t in _qkv(nq=64, nk=64)]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        ls.attention(q, k, v, path="chunked", chunk_size=8)
    assert sum(saved) <= 3 * q.numel()
    assert max(saved) < B * H * 64 * 64


def test_bad_inputs_raise_clear_errors():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="mapping"):
        ls.attention(q, k, v, mapping="nope")
    with pytest.raises(ValueError, match="shape"):
        ls.attention(q[0], k, v)
    with pytest.raises(ValueError, match="head dims"):
        ls.attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="multiple"):
        ls.attention(q, k[:, :3], v[:, :3])
    with pytest.raises(ValueError, match="alibi_slopes"):
        ls.attention(q, k, v, alibi_slopes=torch.ones(3))
    with pytest.raises(ValueError, match="q_scale"):
        ls.attention(q, k, v, q_scale=torch.ones(B, H, 2))
    with pytest.raises(ValueError, match="more queries"):
        ls.attention(q, k[:, :, :5], v[:, :, :5])
    with pytest.raises(ValueError, match="attn_mask"):
        ls.attention(q, k, v, attn_mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="chunk_size"):
        ls.attention(q, k, v, chunk_size=0)
    with pytest.raises(ValueError, match="alpha"):
        ls.attention(q, k, v, alpha=0.5)
    with pytest.raises(ValueError, match="reference"):
        ls.attention(q, k, v, alpha=torch.full((H,), 1.5, requires_grad=True), path="chunked")


def test_automatic_blocks_split_heads_exactly(monkeypatch):
    """With a small block budget the automatic path splits heads as well as queries; per-head α,
    ALiBi slopes, q-scales and a per-head mask must follow their heads."""
    import importlib

    core = importlib.import_module("longsparse.attention.core")   # ls.attention is the function
    monkeypatch.setattr(core, "_AUTO_CHUNK_ELEMENTS", B * N * 8)
    monkeypatch.setattr(core, "_MIN_ROWS", 8)        # → one head per block, 8 queries per block
    q, k, v = _qkv()
    kw = dict(mapping="entmax", alpha=torch.tensor([1.2, 1.5, 2.0, 1.75]),
              alibi_slopes=torch.tensor([1.0, 0.5, 0.25, 0.0]), q_scale=torch.rand(B, H, N) + 0.5,
              attn_mask=torch.rand(H, N, N, generator=torch.Generator().manual_seed(2)) > 0.2)
    ref = _run("reference", q, k, v, **kw)
    fast = _run("chunked", q, k, v, **kw)
    for a, b in zip(ref, fast):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["softmax", "alibi_softmax", "q_scale_softmax", "mask_softmax", "decode", "non_causal"])
def test_softmax_auto_path_through_sdpa_equals_reference(case):
    q, k, v = _qkv()
    kw = {"softmax": {}, "alibi_softmax": dict(alibi_slopes=torch.tensor([1.0, 0.5, 0.25, 0.0])),
          "q_scale_softmax": dict(q_scale=torch.rand(B, H, N) + 0.5),
          "mask_softmax": dict(attn_mask=torch.rand(B, 1, N, N) > 0.5), "decode": {},
          "non_causal": dict(is_causal=False)}[case]
    if case == "decode":
        q = q[:, :, -3:]
    ref = _run("reference", q, k, v, mapping="softmax", **kw)
    auto = _run("auto", q, k, v, mapping="softmax", **kw)
    for a, b in zip(ref, auto):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mapping", ["entmax", "softmax"])
def test_runs_under_bf16_autocast(mapping):
    q, k, v = [t.requires_grad_() for t in _qkv()]
    ref = ls.attention(q, k, v, mapping=mapping)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ls.attention(q, k, v, mapping=mapping)
    out.float().sum().backward()
    assert torch.isfinite(q.grad).all()
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("mapping", ["entmax", "sparsemax", "topk", "adatemp", "asentmax"])
@pytest.mark.parametrize("n", [37, 70])
def test_auto_path_with_gradients_equals_chunked(mapping, n):
    """"auto" differentiates short rows (≤ 64 keys) through the dense path and long ones through the
    chunked path (adaptive temperature, top-k: SDPA); either way the output and every gradient equal the chunked
    path's, masked rows included."""
    q, k, v = _qkv(nq=n, nk=n)
    mask = torch.ones(B, 1, n, n, dtype=torch.bool)
    mask[0, :, 5] = False                       # a query that can see nothing
    kw = dict(mapping=mapping, alibi_slopes=torch.tensor([1.0, 0.5, 0.0, 0.0]), q_scale=torch.rand(B, H, n) + 0.5,
              attn_mask=mask, topk=8)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        auto = _run("auto", q, k, v, **kw)
    if mapping in ("adatemp", "topk"):   # SDPA with a materialised bias at both lengths: one score-sized buffer
        assert max(saved) == B * H * n * n
    else:
        assert (max(saved) >= B * H * n * n) == (n <= 64)  # the dense path keeps score-sized buffers
    chunked = _run("chunked", q, k, v, **kw)
    for a, c in zip(auto, chunked):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)
    assert (auto[0][0, :, 5] == 0).all()
