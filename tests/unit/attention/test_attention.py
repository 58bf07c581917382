"""ls.attention: the reference backend equals a float64 brute-force formula, and the edge cases (masks,
decoding, GQA, dtypes, block sizes) behave. Every other backend is tested equal to the reference in
tests/unit/attention/test_backends.py."""

import math

import pytest
import torch
import torch.nn.functional as F

import longsparse as ls
from longsparse.attention import BACKENDS
from longsparse.attention import call as attention_call
from longsparse.attention.call import make_call
from longsparse.mappings.variants import ADATEMP_POLY

B, H, N, D = 2, 4, 37, 8


def _qkv(nq=N, nk=N, hkv=H, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, nq, D, generator=g, dtype=dtype)
    k = torch.randn(B, hkv, nk, D, generator=g, dtype=dtype)
    v = torch.randn(B, hkv, nk, D, generator=g, dtype=dtype)
    return q, k, v


def _run(backend, q, k, v, q_scale=None, **kw):
    """Output and gradients of q, k, v (and q_scale) under a fixed upstream gradient."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    qs = None if q_scale is None else q_scale.detach().clone().requires_grad_()
    out = ls.attention(*leaves, q_scale=qs, backend=backend, **kw)
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    (out * up).sum().backward()
    return [out] + [t.grad for t in leaves] + ([qs.grad] if qs is not None else [])


def brute_force(
    q,
    k,
    v,
    *,
    mapping,
    alpha=1.5,
    is_causal=True,
    alibi_slopes=None,
    q_scale=None,
    attn_mask=None,
    topk=32,
    adatemp_order="original",
):
    """Float64 loops over (b, h, i): the formulas of docs/method.md §2 written out row by row."""
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
                        z[j] -= float(alibi_slopes[h]) * abs(pos - j)  # symmetric: docs/method.md §3
                    if attn_mask is not None:
                        m = attn_mask.expand(q.shape[0], q.shape[1], nq, nk)[b, h, i, j]
                        if attn_mask.dtype == torch.bool:
                            z[j] = z[j] if m else -math.inf
                        else:
                            z[j] += float(m)
                    if is_causal and j > pos:
                        z[j] = -math.inf
                if torch.isinf(z).all():
                    continue  # nothing to attend to: zero output
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
    "per_head_alpha": dict(mapping="entmax", alpha=torch.tensor([1.2, 1.5, 2.0, 1.75])),
    "entmax3": dict(mapping="entmax", alpha=3.0),
    "topk": dict(mapping="topk", topk=5),
    "adatemp": dict(mapping="adatemp"),
    "adatemp_reversed": dict(mapping="adatemp", adatemp_order="reversed"),
    "alibi": dict(mapping="entmax", alibi_slopes=torch.tensor([1.0, 0.5, 0.25, 0.0])),
    "q_scale": dict(
        mapping="entmax", q_scale=torch.rand(B, H, N, generator=torch.Generator().manual_seed(3)) * 3 + 0.5
    ),
    "non_causal": dict(mapping="entmax", is_causal=False),
    "alibi_non_causal": dict(mapping="entmax", is_causal=False, alibi_slopes=torch.tensor([1.0, 0.5, 0.25, 0.0])),
    "alibi_non_causal_softmax": dict(
        mapping="softmax", is_causal=False, alibi_slopes=torch.tensor([1.0, 0.5, 0.25, 0.0])
    ),
    "bool_mask": dict(
        mapping="entmax", attn_mask=torch.rand(B, 1, N, N, generator=torch.Generator().manual_seed(4)) > 0.3
    ),
    "additive_mask": dict(
        mapping="softmax", attn_mask=torch.randn(1, H, N, N, generator=torch.Generator().manual_seed(5))
    ),
}


@pytest.mark.parametrize("backend", ["chunked", "fused_cpu"])
def test_block_sizes_do_not_change_the_result(backend):
    """Rows are independent: any chunk size gives the reference's output and gradients."""
    q, k, v = _qkv()
    kw = dict(alibi_slopes=torch.tensor([1.0, 0.5, 0.25, 0.0]), q_scale=torch.rand(B, H, N) + 0.5)
    ref = _run("reference", q, k, v, **kw)
    for chunk in (1, 16, N, None):
        for a, b in zip(ref, _run(backend, q, k, v, chunk_size=chunk, **kw)):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "case",
    [
        "softmax",
        "entmax15",
        "entmax3",
        "per_head_alpha",
        "topk",
        "adatemp",
        "alibi",
        "q_scale",
        "bool_mask",
        "additive_mask",
        "non_causal",
        "alibi_non_causal",
        "alibi_non_causal_softmax",
    ],
)
def test_reference_matches_float64_brute_force(case):
    q, k, v = _qkv(seed=1)
    kw = dict(CASES[case])
    out = ls.attention(q, k, v, backend="reference", **kw)
    expect = brute_force(q, k, v, **kw)
    torch.testing.assert_close(out.double(), expect, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0])
@pytest.mark.parametrize("nq", [N, 5])
def test_non_causal_alibi_is_symmetric_on_every_backend(backend, alpha, nq):
    """Without a causal mask ALiBi is −m·|pos_i − j| (flash-attn's form), on every backend that takes the call:
    equal to the float64 formula, full rows and decoding rows (the queries at the last positions). Head dim 16:
    one the Triton kernels take."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, H, n, 16, generator=g) for n in (nq, N, N))
    mapping = "softmax" if alpha == 1.0 else "entmax"
    kw = dict(mapping=mapping, alpha=alpha, is_causal=False, alibi_slopes=torch.tensor([1.0, 0.5, 0.25, 0.0]))
    reason = BACKENDS[backend].supports(make_call(q, k, v, **kw))
    if reason is not None:  # adasplash without CUDA, triton outside its interpreter
        with pytest.raises(ValueError, match="cannot take this call"):
            ls.attention(q, k, v, backend=backend, **kw)
        return
    out = ls.attention(q, k, v, backend=backend, **kw)
    torch.testing.assert_close(out.double(), brute_force(q, k, v, **kw), atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize("backend", ["reference", "fused_cpu", "sdpa"])
def test_non_causal_alibi_favours_near_keys_in_both_directions(backend):
    """With equal content scores, query 0 of 12 at slope 0.5 puts its largest weight on itself and almost
    none on the farthest (future) key; the signed form gave that key the largest bias (39 % of softmax)."""
    q, k, v = torch.zeros(1, 1, 12, 12), torch.zeros(1, 1, 12, 12), torch.eye(12)[None, None]
    kw = dict(mapping="softmax", is_causal=False, alibi_slopes=torch.tensor([0.5]))
    p = ls.attention(q, k, v, backend=backend, **kw)[0, 0]  # v = identity: the rows are the weights
    assert p[0].argmax() == 0 and p[0, -1] < 0.01
    assert p[-1].argmax() == 11 and p[-1, 0] < 0.01
    torch.testing.assert_close(p, p.flip(0, 1), atol=1e-6, rtol=1e-6)  # mirror image


def test_softmax_matches_sdpa():
    q, k, v = _qkv()
    torch.testing.assert_close(
        ls.attention(q, k, v, mapping="softmax"),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
        atol=1e-6,
        rtol=1e-5,
    )
    mask = torch.rand(B, H, N, N) > 0.2
    mask[..., 0] = True
    torch.testing.assert_close(
        ls.attention(q, k, v, mapping="softmax", is_causal=False, attn_mask=mask),
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        atol=1e-6,
        rtol=1e-5,
    )


def test_decoding_rows_equal_the_full_rows():
    """Queries sit at the last Nq key positions: the last rows of a full pass equal a decode step."""
    q, k, v = _qkv()
    slopes = torch.tensor([0.5, 0.25, 0.0, 1.0])
    scale = torch.rand(B, H, N) + 0.5
    full = ls.attention(q, k, v, alibi_slopes=slopes, q_scale=scale, backend="reference")
    for nq in (1, 3):
        part = ls.attention(q[:, :, -nq:], k, v, alibi_slopes=slopes, q_scale=scale[:, :, -nq:], backend="reference")
        torch.testing.assert_close(part, full[:, :, -nq:], atol=1e-6, rtol=1e-5)


def test_gqa_equals_repeated_heads():
    q, k, v = _qkv(hkv=2)
    grads = _run("reference", q, k, v, mapping="entmax")
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    full = _run("reference", q, kr, vr, mapping="entmax")
    torch.testing.assert_close(grads[0], full[0], atol=1e-6, rtol=1e-5)
    # the gradient of a shared k/v head is the sum over the query heads that read it
    torch.testing.assert_close(grads[2], full[2].view(B, 2, 2, N, D).sum(2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[3], full[3].view(B, 2, 2, N, D).sum(2), atol=1e-5, rtol=1e-5)


def test_bf16_inputs():
    q, k, v = _qkv()
    ref = ls.attention(q, k, v)
    out = ls.attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)
    for backend in ("chunked", "fused_cpu", "reference"):
        grads = _run(backend, q.bfloat16(), k.bfloat16(), v.bfloat16())
        assert all(g.dtype == torch.bfloat16 and torch.isfinite(g.float()).all() for g in grads)


def test_learned_per_head_alpha_gets_a_gradient():
    q, k, v = _qkv(nq=6, nk=6)
    q, k, v = q.double(), k.double(), v.double()
    alpha = torch.tensor([1.3, 1.5, 1.8, 2.2], dtype=torch.float64, requires_grad=True)
    out = ls.attention(q, k, v, alpha=alpha)  # auto → reference path, which differentiates α
    out.sum().backward()
    assert alpha.grad is not None and torch.isfinite(alpha.grad).all() and alpha.grad.abs().sum() > 0
    assert torch.autograd.gradcheck(lambda a: ls.attention(q, k, v, alpha=a), (alpha.detach().requires_grad_(),))


@pytest.mark.parametrize("backend", ["chunked", "fused_cpu"])
def test_chunked_backward_saves_only_its_inputs(backend):
    """The recomputing backward keeps q, k, v (and q_scale; fused_cpu also 3 numbers per query row: max, τ,
    normaliser), never a score-sized buffer."""
    q, k, v = [t.requires_grad_() for t in _qkv(nq=64, nk=64)]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        ls.attention(q, k, v, backend=backend, chunk_size=8)
    row_stats = 3 * B * H * 64 if backend == "fused_cpu" else 0
    assert sum(saved) <= 3 * q.numel() + row_stats
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
        ls.attention(q, k, v, alpha=torch.full((H,), 1.5, requires_grad=True), backend="chunked")
    with pytest.raises(ValueError, match="topk must be"):
        ls.attention(q, k, v, mapping="topk", topk=0)
    with pytest.raises(ValueError, match="adatemp_order"):
        ls.attention(q, k, v, mapping="adatemp", adatemp_order="sideways")


def test_automatic_blocks_split_heads_exactly(monkeypatch):
    """With a small block budget the automatic path splits heads as well as queries; per-head α,
    ALiBi slopes, q-scales and a per-head mask must follow their heads."""
    from longsparse.attention import chunked

    monkeypatch.setattr(chunked, "_AUTO_CHUNK_ELEMENTS", B * N * 8)
    monkeypatch.setattr(chunked, "_MIN_ROWS", 8)  # → one head per block, 8 queries per block
    q, k, v = _qkv()
    kw = dict(
        mapping="entmax",
        alpha=torch.tensor([1.2, 1.5, 2.0, 1.75]),
        alibi_slopes=torch.tensor([1.0, 0.5, 0.25, 0.0]),
        q_scale=torch.rand(B, H, N) + 0.5,
        attn_mask=torch.rand(H, N, N, generator=torch.Generator().manual_seed(2)) > 0.2,
    )
    ref = _run("reference", q, k, v, **kw)
    fast = _run("chunked", q, k, v, **kw)
    for a, b in zip(ref, fast):
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


def test_attention_skips_its_host_checks_while_a_cuda_graph_captures(monkeypatch):
    """The finiteness check of every attention call reads a device value on the host: skipped while a CUDA graph
    captures (a graph refuses the sync), as under torch.compile; CPU tensors are never captured."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert attention_call.tracing_or_capturing(torch.device("cuda")) and not attention_call.tracing_or_capturing(
        torch.device("cpu")
    )
    nan = torch.full((1, 1, 2, 16), float("nan"))
    with pytest.raises(ValueError, match="q contains NaN"):
        attention_call._check_finite_inputs(q=nan)  # CPU: still checked
    monkeypatch.setattr(attention_call, "tracing_or_capturing", lambda device: True)
    attention_call._check_finite_inputs(q=nan)  # captured: nothing read back
