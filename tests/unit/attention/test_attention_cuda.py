"""The adasplash backend of ls.attention (opt-in: only when named).

Without a GPU, what it accepts and the argument folding (scale, q_scale) are tested against a stand-in
`adasplash` module that computes what the real one documents: entmax attention with logits scaled by
1/√D. On a machine with CUDA and adasplash installed, the real kernels are compared with the reference.
"""

import dataclasses
import importlib.util
import math
import sys
import types

import pytest
import torch

import longsparse as ls
from longsparse.attention import BACKENDS


def _stand_in(calls):
    def adasplash(q, k, v, alpha=1.5, is_causal=True, varlen=None, niter=None):
        calls.append({"alpha": alpha, "is_causal": is_causal, "shape": tuple(q.shape)})
        return ls.attention(
            q,
            k,
            v,
            mapping="entmax",
            alpha=alpha,
            is_causal=is_causal,
            scale=1 / math.sqrt(q.shape[-1]),
            backend="reference",
        )

    return types.SimpleNamespace(adasplash=adasplash)


@pytest.fixture
def fake_cuda(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "adasplash", _stand_in(calls))
    # CPU tensors stand in for CUDA ones: the backend's capabilities also take the CPU here
    real = BACKENDS["adasplash"]
    monkeypatch.setitem(
        BACKENDS,
        "adasplash",
        dataclasses.replace(real, capabilities=(dataclasses.replace(real.capabilities[0], devices=("cuda", "cpu")),)),
    )
    return calls


def _qkv(B=2, H=3, N=64, D=16, requires_grad=True):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, N, D, generator=g).requires_grad_(requires_grad) for _ in range(3)]


@pytest.mark.parametrize("mapping,alpha", [("entmax", 1.5), ("entmax", 1.3), ("sparsemax", 2.0), ("asentmax", 1.5)])
@pytest.mark.parametrize("causal", [True, False])
def test_adasplash_backend_folds_scale_and_q_scale_exactly(fake_cuda, mapping, alpha, causal):
    q, k, v = _qkv()
    q_scale = torch.rand(2, 3, 64) + 0.5 if mapping == "asentmax" else None
    kw = dict(mapping=mapping, alpha=alpha, is_causal=causal, scale=0.37, q_scale=q_scale)
    out = ls.attention(q, k, v, backend="adasplash", **kw)
    assert fake_cuda == [{"alpha": alpha, "is_causal": causal, "shape": (2, 3, 64, 16)}]
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = ls.attention(q, k, v, backend="reference", **kw)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    # float32 rounding of the folded q over 64-key rows: ~1.5e-5 at most seen
    torch.testing.assert_close(out, ref, atol=5e-5, rtol=5e-5)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=5e-5)


def test_auto_never_picks_adasplash(fake_cuda):
    q, k, v = _qkv(requires_grad=False)
    for mapping in ("entmax", "sparsemax"):
        ls.attention(q, k, v, mapping=mapping)
        assert "opt-in" in ls.explain_attention(q, k, v, mapping=mapping).passed_over["adasplash"]
    assert fake_cuda == []


def test_adasplash_refuses_what_it_cannot_express(fake_cuda, monkeypatch):
    q, k, v = _qkv(requires_grad=False)
    H, N = 3, 64
    refused = {
        "ALiBi": dict(alibi_slopes=torch.full((H,), 0.1)),
        "attn_mask": dict(attn_mask=torch.ones(N, N, dtype=torch.bool)),
        "per-head": dict(alpha=torch.tensor([1.5, 1.3, 1.7])),
        "outside": dict(alpha=2.5),
        "not α-entmax": dict(mapping="topk"),
        "α = 1 outside": dict(mapping="softmax"),
    }
    for reason, kw in refused.items():
        with pytest.raises(ValueError, match=f"'adasplash' cannot take this call: .*{reason}"):
            ls.attention(q, k, v, backend="adasplash", **kw)
    # decoding, and lengths / head sizes its kernels reject: not a power of two, under its 64-token tile, head dim 8
    for reason, args in (
        ("decoding", (q[:, :, -4:], k, v)),
        ("power of two", _qkv(N=96, requires_grad=False)),
        ("power of two", [t[:, :, :32] for t in (q, k, v)]),
        ("head dim", [t[..., :8] for t in (q, k, v)]),
    ):
        with pytest.raises(ValueError, match=reason):
            ls.attention(*args, backend="adasplash")
    monkeypatch.setenv("LONGSPARSE_ADASPLASH", "0")
    with pytest.raises(ValueError, match="LONGSPARSE_ADASPLASH=0"):
        ls.attention(q, k, v, backend="adasplash")
    monkeypatch.delenv("LONGSPARSE_ADASPLASH")
    monkeypatch.setitem(sys.modules, "adasplash", None)  # not installed
    with pytest.raises(ValueError, match="not available: adasplash is not installed"):
        ls.attention(q, k, v, backend="adasplash")
    assert fake_cuda == []


def test_gqa_reaches_adasplash_with_repeated_heads(fake_cuda):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 64, 16, generator=g)
    k, v = (torch.randn(1, 2, 64, 16, generator=g) for _ in range(2))
    out = ls.attention(q, k, v, mapping="entmax", backend="adasplash")
    ref = ls.attention(q, k, v, mapping="entmax", backend="reference")
    assert fake_cuda[0]["shape"] == (1, 4, 64, 16)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def _real_adasplash_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("adasplash") is not None


@pytest.mark.skipif(not _real_adasplash_available(), reason="needs CUDA and the adasplash package")
@pytest.mark.parametrize("alpha,causal", [(1.5, True), (1.5, False), (1.3, True)])
def test_real_adasplash_matches_reference(alpha, causal):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 4, 256, 64, device="cuda", generator=g) for _ in range(3))
    out = ls.attention(q, k, v, mapping="entmax", alpha=alpha, is_causal=causal, backend="adasplash")
    ref = ls.attention(q, k, v, mapping="entmax", alpha=alpha, is_causal=causal, backend="reference")
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)
