"""The attention backends' test grid (mapping × bias × mask × rows × heads) and the call that returns an output
with its gradients: tests/unit/attention/test_backends.py runs every backend over it, test_key_ranges.py pads
its cases."""

from __future__ import annotations

import os
import zlib

# Triton's interpreter must be on before triton is first imported (its own library functions are jitted at
# import): CPU tensors reach the triton backend only through it. Auto never picks triton for CPU tensors.
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import longsparse as ls  # noqa: E402

B, H, N, D = 2, 4, 37, 16
NQ_DECODE = 5

MAPPINGS = {
    "softmax": dict(mapping="softmax"),
    "entmax15": dict(mapping="entmax"),
    "entmax13": dict(mapping="entmax", alpha=1.3),
    "per_head_alpha": dict(mapping="entmax", alpha=torch.tensor([1.2, 1.5, 2.0, 1.75])),
    "sparsemax": dict(mapping="sparsemax"),
    # α > 2: the Jacobian carries p^{2−α}, unbounded as p → 0, so gradients are compared in relative norm
    "entmax3": dict(mapping="entmax", alpha=3.0),
    "topk": dict(mapping="topk", topk=5),
    "adatemp": dict(mapping="adatemp"),
}
BIASES = ("none", "alibi", "q_scale")
MASKS = ("none", "bool", "float")
ROWS = ("causal", "decode", "non_causal")
# dv: a value head dim (24) other than q/k's (16), which every backend computes or refuses by its supports
HEADS = ("mha", "gqa", "dv")
DV = 24


def grid_case(mapping, bias, mask, rows, heads):
    """(q, k, v, kwargs) of one grid case; the bool mask leaves query 3 nothing to attend to."""
    nq = NQ_DECODE if rows == "decode" else N
    hkv = H // 2 if heads == "gqa" else H
    g = torch.Generator().manual_seed(zlib.crc32("-".join((mapping, bias, mask, rows, heads)).encode()))
    q = torch.randn(B, H, nq, D, generator=g) * 2  # sharp rows: sparse supports, θ > 1 on some rows
    k, v = (torch.randn(B, hkv, N, d, generator=g) for d in (D, DV if heads == "dv" else D))
    kw = dict(MAPPINGS[mapping], is_causal=rows != "non_causal")
    if bias == "alibi":
        kw["alibi_slopes"] = torch.tensor([1.0, 0.5, 0.25, 0.0])
    elif bias == "q_scale":
        kw["q_scale"] = torch.rand(B, H, nq, generator=g) * 2 + 0.5
    if mask == "bool":
        m = torch.rand(B, 1, nq, N, generator=g) > 0.3
        m[:, :, 3] = False
        kw["attn_mask"] = m
    elif mask == "float":
        m = torch.randn(1, H, nq, N, generator=g)
        m[..., 2] = float("-inf")
        kw["attn_mask"] = m
    return q, k, v, kw


def run_with_grads(q, k, v, kw, up=None, **extra):
    """Output and gradients of q, k, v (and q_scale) under the upstream gradient `up` (None: a fixed random one)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    kw = dict(kw)
    if kw.get("q_scale") is not None:
        kw["q_scale"] = kw["q_scale"].detach().clone().requires_grad_()
        leaves.append(kw["q_scale"])
    out = ls.attention(*leaves[:3], **kw, **extra)
    if up is None:
        up = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    (out * up).sum().backward()
    return [out.detach()] + [t.grad for t in leaves]
