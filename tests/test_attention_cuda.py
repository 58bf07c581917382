"""The adasplash (CUDA) path of ls.attention.

Without a GPU the dispatch and the argument folding (scale, q_scale) are tested against a stand-in
`adasplash` module that computes what the real one documents: entmax attention with logits scaled by
1/√D. On a machine with CUDA and adasplash installed, the real kernels are compared with the reference.
"""
import importlib.util
import math
import sys
import types

import pytest
import torch

import longsparse as ls
from longsparse.attention import cuda as cuda_path


def _stand_in(calls):
    def adasplash(q, k, v, alpha=1.5, is_causal=True, varlen=None, niter=None):
        calls.append({"alpha": alpha, "is_causal": is_causal, "shape": tuple(q.shape)})
        return ls.attention(q, k, v, mapping="entmax", alpha=alpha, is_causal=is_causal,
                            scale=1 / math.sqrt(q.shape[-1]), path="reference")
    return types.SimpleNamespace(adasplash=adasplash)


@pytest.fixture
def fake_cuda(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "adasplash", _stand_in(calls))
    monkeypatch.setattr(cuda_path, "_on_cuda", lambda t: True)
    return calls


def _qkv(B=2, H=3, N=64, D=16, requires_grad=True):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, N, D, generator=g).requires_grad_(requires_grad) for _ in range(3)]


@pytest.mark.parametrize("mapping,alpha", [("entmax", 1.5), ("entmax", 1.3), ("sparsemax", 2.0), ("asentmax", 1.5)])
@pytest.mark.parametrize("causal", [True, False])
def test_adasplash_path_folds_scale_and_q_scale_exactly(fake_cuda, mapping, alpha, causal):
    q, k, v = _qkv()
    q_scale = torch.rand(2, 3, 64) + 0.5 if mapping == "asentmax" else None
    kw = dict(mapping=mapping, alpha=alpha, is_causal=causal, scale=0.37, q_scale=q_scale)
    out = ls.attention(q, k, v, **kw)
    assert fake_cuda == [{"alpha": alpha, "is_causal": causal, "shape": (2, 3, 64, 16)}]
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = ls.attention(q, k, v, path="reference", **kw)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    # float32 rounding of the folded q over 64-key rows: ~1.5e-5 at most seen
    torch.testing.assert_close(out, ref, atol=5e-5, rtol=5e-5)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=5e-5)


def test_adasplash_path_is_skipped_when_it_cannot_express_the_call(fake_cuda, monkeypatch):
    q, k, v = _qkv(requires_grad=False)
    H, N = 3, 64
    ls.attention(q, k, v, mapping="entmax", alibi_slopes=torch.full((H,), 0.1))
    ls.attention(q, k, v, mapping="entmax", attn_mask=torch.ones(N, N, dtype=torch.bool))
    ls.attention(q[:, :, -4:], k, v, mapping="entmax")                       # decoding: Nq < Nk
    ls.attention(q, k, v, mapping="entmax", alpha=torch.tensor([1.5, 1.3, 1.7]))   # per-head α
    ls.attention(q, k, v, mapping="entmax", alpha=2.5)                       # α > 2
    ls.attention(q, k, v, mapping="entmax", path="chunked")
    ls.attention(q, k, v, mapping="entmax", chunk_size=4)
    ls.attention(q, k, v, mapping="softmax")
    # lengths and head sizes its kernels reject: not a power of two, under its 64-token tile, head dim 8
    ls.attention(*_qkv(N=96, requires_grad=False), mapping="entmax")
    ls.attention(*(t[:, :, :32] for t in (q, k, v)), mapping="entmax")
    ls.attention(*(t[..., :8] for t in (q, k, v)), mapping="entmax")
    monkeypatch.setenv("LONGSPARSE_ADASPLASH", "0")
    ls.attention(q, k, v, mapping="entmax")
    assert fake_cuda == []


def test_gqa_reaches_adasplash_with_repeated_heads(fake_cuda):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 64, 16, generator=g)
    k, v = (torch.randn(1, 2, 64, 16, generator=g) for _ in range(2))
    out = ls.attention(q, k, v, mapping="entmax")
    ref = ls.attention(q, k, v, mapping="entmax", path="reference")
    assert fake_cuda[0]["shape"] == (1, 4, 64, 16)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def _real_adasplash_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("adasplash") is not None


@pytest.mark.skipif(not _real_adasplash_available(), reason="needs CUDA and the adasplash package")
@pytest.mark.parametrize("alpha,causal", [(1.5, True), (1.5, False), (1.3, True)])
def test_real_adasplash_matches_reference(alpha, causal):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 4, 256, 64, device="cuda", generator=g) for _ in range(3))
    out = ls.attention(q, k, v, mapping="entmax", alpha=alpha, is_causal=causal)
    ref = ls.attention(q, k, v, mapping="entmax", alpha=alpha, is_causal=causal, path="reference")
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)
