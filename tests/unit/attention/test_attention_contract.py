"""The input contract of `ls.attention` and the mappings, the same on every backend that runs on CPU tensors
(reference, chunked, fused_cpu, sdpa; triton's CPU interpreter is too slow here:
tests/unit/attention/test_backends.py) and on "auto": α = 1 is softmax, masks are bool or float, non-finite inputs
and non-float tensors are refused, scale = 0 gives uniform rows."""

import math

import pytest
import torch
from helpers.mappings import solver_path

import longsparse as ls
from longsparse.attention import BACKENDS
from longsparse.attention.call import make_call
from longsparse.nn.mha import EntmaxMultiheadAttention

B, H, D = 2, 4, 8
CHOICES = [name for name in BACKENDS if name not in ("triton", "adasplash")] + ["auto"]


def _attention(q, k, v, backend="auto", **kw):
    """ls.attention with a named backend; skips where that backend does not take the call."""
    if backend != "auto":
        reason = BACKENDS[backend].supports(make_call(q, k, v, **kw))
        if reason is not None:
            pytest.skip(f"{backend}: {reason}")
    return ls.attention(q, k, v, backend=backend, **kw)


def _qkv(nq, nk, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, nq, D, generator=g, dtype=dtype),
        torch.randn(B, H, nk, D, generator=g, dtype=dtype),
        torch.randn(B, H, nk, D, generator=g, dtype=dtype),
    )


def _out_and_grads(q, k, v, grad, **kw):
    """The output and, with grad, the gradients of q, k, v under a fixed upstream gradient."""
    leaves = [t.detach().clone().requires_grad_(grad) for t in (q, k, v)]
    if not grad:
        with torch.no_grad():
            return [_attention(*leaves, **kw)]
    out = _attention(*leaves, **kw)
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    (out * up).sum().backward()
    return [out] + [t.grad for t in leaves]


# ----------------------------------------------------------------------------- α = 1 is softmax

ALPHA_ONE_CASES = {
    "plain": {},
    "alibi": dict(alibi_slopes=torch.tensor([0.5, 0.25, 0.0, 1.0])),  # still on the fused kernel
    "bool_mask": dict(attn_mask=torch.rand(B, 1, 70, 70, generator=torch.Generator().manual_seed(1)) > 0.3),
    "non_causal": dict(is_causal=False),
}


@pytest.mark.parametrize("backend", CHOICES)
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("n", [37, 70])  # > 64 keys: "auto" takes a chunked backend with gradients too
@pytest.mark.parametrize("case", sorted(ALPHA_ONE_CASES))
def test_alpha_one_equals_softmax(backend, grad, n, case):
    q, k, v = _qkv(n, n)
    kw = dict(ALPHA_ONE_CASES[case])
    if "attn_mask" in kw:
        kw["attn_mask"] = kw["attn_mask"][..., :n, :n]
    want = _out_and_grads(q, k, v, grad, mapping="softmax", backend="reference", **kw)
    for alpha in (1.0, 1, torch.tensor(1.0)):
        got = _out_and_grads(q, k, v, grad, mapping="entmax", alpha=alpha, backend=backend, **kw)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", CHOICES)
@pytest.mark.parametrize("grad", [False, True])
def test_per_head_alpha_with_ones_is_softmax_on_those_heads(backend, grad):
    q, k, v = _qkv(70, 70)
    alpha = torch.tensor([1.0, 1.5, 1.0, 1.3])
    got = _out_and_grads(q, k, v, grad, mapping="entmax", alpha=alpha, backend=backend)
    soft = _out_and_grads(q, k, v, grad, mapping="softmax", backend="reference")
    for h, a in enumerate(alpha.tolist()):
        want = soft if a == 1 else _out_and_grads(q, k, v, grad, mapping="entmax", alpha=a, backend="reference")
        for x, y in zip(got, want):
            torch.testing.assert_close(x[:, h], y[:, h], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("solver", ["kernel", "torch"])
def test_entmax_tensor_alpha_one_rows_are_softmax(solver):
    """ls.entmax with a tensor α holding 1 on some rows: softmax there (values and ∂/∂x) on both solvers."""
    x = torch.randn(3, 5, 9, generator=torch.Generator().manual_seed(2)) * 3
    x[1, 2, :4] = float("-inf")
    x[2, 0] = float("-inf")  # a fully masked row: zeros
    alpha = torch.tensor([1.0, 1.5, 1.0]).view(3, 1, 1)
    up = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    with solver_path(solver):
        xs = x.clone().requires_grad_()
        p = ls.entmax(xs, alpha)
        (p * up).sum().backward()
    for r, a in enumerate(alpha.view(-1).tolist()):
        xr = x[r].clone().requires_grad_()
        pr = torch.nan_to_num(torch.softmax(xr, -1)) if a == 1 else ls.entmax(xr, a)
        (pr * up[r]).sum().backward()
        torch.testing.assert_close(p[r], pr, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(xs.grad[r], torch.nan_to_num(xr.grad), atol=1e-6, rtol=1e-6)
    assert (p[2, 0] == 0).all()


@pytest.mark.parametrize("solver", ["kernel", "torch"])
def test_alpha_gradient_at_one_is_the_right_derivative(solver):
    """∂L/∂α at α = 1 is the limit of the α > 1 derivative: ½ p_i (Σ_j p_j log² p_j − log² p_i)."""
    x = torch.randn(4, 7, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 2
    x[3, :2] = float("-inf")
    up = torch.randn(4, 7, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with solver_path(solver):
        alpha = torch.ones(4, 1, dtype=torch.float64, requires_grad=True)
        (ls.entmax(x, alpha) * up).sum().backward()
        h = 1e-6
        p1 = ls.entmax(x, torch.ones(4, 1, dtype=torch.float64))
        ph = ls.entmax(x, torch.full((4, 1), 1 + h, dtype=torch.float64))
        p2h = ls.entmax(x, torch.full((4, 1), 1 + 2 * h, dtype=torch.float64))
    # second-order one-sided difference (α < 1 is not defined)
    fd = ((-3 * p1 + 4 * ph - p2h) / (2 * h) * up).sum(-1, keepdim=True)
    assert torch.isfinite(alpha.grad).all()
    torch.testing.assert_close(alpha.grad, fd, atol=1e-5, rtol=1e-4)


def test_mha_alpha_one_equals_softmax():
    torch.manual_seed(0)
    soft = EntmaxMultiheadAttention(16, 4, mapping="softmax")
    ent = EntmaxMultiheadAttention(16, 4, mapping="entmax", alpha=1.0)
    ent.load_state_dict(soft.state_dict())
    x = torch.randn(2, 70, 16)
    with torch.no_grad():
        for causal in (False, True):
            mask = torch.ones(70, 70, dtype=torch.bool).triu(1) if causal else None
            for need in (False, True):
                a = soft(x, x, x, attn_mask=mask, need_weights=need)
                b = ent(x, x, x, attn_mask=mask, need_weights=need)
                torch.testing.assert_close(b[0], a[0], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- masks: bool or float only


@pytest.mark.parametrize("backend", CHOICES)
@pytest.mark.parametrize("mapping", ["softmax", "entmax"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.int32])
def test_integer_masks_are_refused(backend, mapping, dtype):
    q, k, v = _qkv(9, 9)
    mask = (torch.rand(B, 1, 9, 9) > 0.3).to(dtype)
    with pytest.raises(ValueError, match=f"attn_mask.*{str(dtype).split('.')[-1]}"):
        ls.attention(q, k, v, mapping=mapping, attn_mask=mask, backend=backend)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8])
def test_mha_integer_masks_are_refused(dtype):
    mha = EntmaxMultiheadAttention(16, 4)
    x = torch.randn(2, 9, 16)
    with pytest.raises(ValueError, match="attn_mask"):
        mha(x, x, x, attn_mask=torch.zeros(9, 9, dtype=dtype))
    with pytest.raises(ValueError, match="key_padding_mask"):
        mha(x, x, x, key_padding_mask=torch.zeros(2, 9, dtype=dtype))


# ----------------------------------------------------------------------------- non-finite inputs are refused


@pytest.mark.parametrize("backend", CHOICES)
@pytest.mark.parametrize("mapping", ["softmax", "entmax", "topk"])
@pytest.mark.parametrize("where", ["q", "k", "v", "q_scale", "alibi_slopes", "attn_mask"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("causal", [True, False])
def test_non_finite_inputs_are_refused(backend, mapping, where, value, causal):
    q, k, v = _qkv(9, 9)
    kw = dict(q_scale=torch.ones(B, H, 9), alibi_slopes=torch.full((H,), 0.5), attn_mask=torch.zeros(1, H, 9, 9))
    t = dict(q=q, k=k, v=v, **kw)[where]
    t.view(-1)[-3] = value
    with pytest.raises(ValueError, match=f"{where} contains"):
        ls.attention(q, k, v, mapping=mapping, backend=backend, is_causal=causal, **kw)


@pytest.mark.parametrize("backend", CHOICES)
@pytest.mark.parametrize("mapping", ["softmax", "entmax"])
@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf])
def test_non_finite_scale_is_refused(backend, mapping, scale):
    q, k, v = _qkv(9, 9)
    with pytest.raises(ValueError, match="scale"):
        ls.attention(q, k, v, mapping=mapping, backend=backend, scale=scale)


@pytest.mark.parametrize("backend", CHOICES)
@pytest.mark.parametrize("mapping", ["softmax", "entmax", "sparsemax", "topk", "adatemp"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("nq", [9, 3])
def test_zero_scale_gives_uniform_rows(backend, mapping, causal, nq):
    """scale = 0 makes every logit 0: each query averages v over the keys it may see."""
    q, k, v = _qkv(nq, 9)
    out = _attention(q, k, v, mapping=mapping, backend=backend, is_causal=causal, scale=0.0)
    seen = torch.arange(9 - nq, 9) + 1 if causal else torch.full((nq,), 9)
    want = torch.stack([v[:, :, :s].mean(2) for s in seen.tolist()], 2)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mapping", ["softmax", "entmax"])
def test_negative_scale_equals_the_reference(mapping):
    q, k, v = _qkv(9, 9)
    want = ls.attention(q, k, v, mapping=mapping, backend="reference", scale=-0.3)
    for backend in CHOICES:
        if backend == "auto" or BACKENDS[backend].supports(make_call(q, k, v, mapping=mapping, scale=-0.3)) is None:
            torch.testing.assert_close(ls.attention(q, k, v, mapping=mapping, backend=backend, scale=-0.3), want)


@pytest.mark.parametrize("backend", CHOICES)
@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_non_finite_tensor_alpha_is_refused(backend, bad):
    q, k, v = _qkv(9, 9)
    alpha = torch.tensor([1.5, bad, 1.5, 1.5])
    with pytest.raises(ValueError, match="alpha"):
        ls.attention(q, k, v, alpha=alpha, backend=backend)
    with pytest.raises(ValueError, match="alpha"):
        ls.entmax(torch.randn(2, H, 3, 5), alpha)
    with pytest.raises(ValueError, match="alpha"):
        ls.attention(q, k, v, alpha=bad, backend=backend)


# ----------------------------------------------------------------------------- floating-point tensors only


@pytest.mark.parametrize("backend", CHOICES)
@pytest.mark.parametrize("mapping", ["softmax", "entmax"])
@pytest.mark.parametrize("which", ["q", "k", "v", "all"])
def test_non_float_inputs_are_refused(backend, mapping, which):
    q, k, v = _qkv(9, 9)
    t = dict(q=q, k=k, v=v)
    for name in ("q", "k", "v") if which == "all" else (which,):
        t[name] = (t[name] * 10).long()
    with pytest.raises(TypeError, match="floating-point.*int64"):
        ls.attention(t["q"], t["k"], t["v"], mapping=mapping, backend=backend)
