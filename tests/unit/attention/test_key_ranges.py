"""Per-row key ranges (``key_start`` / ``key_end`` of ``ls.attention``): left and right padding without a
dense mask.

* every backend: a left-padded batch equals each row run alone without padding (values and gradients), over
  mapping × bias × rows (causal, decoding, non-causal) × GQA; where a backend refuses, naming it raises with
  the reason. Triton runs in its CPU interpreter (a sample of its cases by default, all with -m slow);
* key ranges combined with a mask, and right padding, equal the reference given the equivalent dense mask;
* the model: left-padded prompts reach attention as key ranges (no mask), so auto picks triton for every
  call of a CUDA generation; cached generation of a left-padded batch equals each row alone, per backend.
"""

from __future__ import annotations

import dataclasses
import os
import re

# the interpreter must be on before triton is first imported (see tests/unit/attention/test_backends.py)
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from helpers.attention_grid import MAPPINGS as BACKEND_GRID_MAPPINGS
from helpers.attention_grid import B, H, N, grid_case, run_with_grads

import longsparse as ls
import longsparse.nn.attention as nn_attention
from longsparse.attention import BACKENDS
from longsparse.attention.call import make_call
from longsparse.attention.policy import select_backend
from longsparse.nn import ModelConfig, Transformer

PADS = (13, 0)  # left pads of the batch rows (the decode queries stay after them)
assert len(PADS) == B

# tests/unit/attention/test_backends.py's cases without their masks, and without α = 3 (its gradients need a relative
# comparison; the padding is the same for every α)
MAPPINGS = {name: kw for name, kw in BACKEND_GRID_MAPPINGS.items() if name != "entmax3"}
BIASES = ("none", "alibi", "q_scale")
ROWS = ("causal", "decode", "non_causal")
HEADS = ("mha", "gqa")
GRID = [(m, b, r, h) for m in MAPPINGS for b in BIASES for r in ROWS for h in HEADS]

# triton in the CPU interpreter costs ~1-3 s per case: these run by default, all with -m slow
TRITON_SAMPLE = {
    ("entmax15", "alibi", "decode", "gqa"),
    ("per_head_alpha", "q_scale", "causal", "mha"),
    ("sparsemax", "none", "non_causal", "gqa"),
}
TRITON_MAPPINGS = {"entmax15", "entmax13", "per_head_alpha", "sparsemax"}


def _case(mapping, bias, rows, heads):
    """(q, k, v, kwargs without key ranges, upstream gradient zero on the pads' query rows)."""
    q, k, v, kw = grid_case(mapping, bias, "none", rows, heads)
    up = torch.randn(q.shape, generator=torch.Generator().manual_seed(7))
    if q.shape[2] == N:  # the pads' own query rows: their outputs are not compared
        for b, s in enumerate(PADS):
            up[b, :, :s] = 0
    return q, k, v, kw, up


def _grad(*tensors):
    """Copies that require grad: the call `_run` makes (a backend may take a call only without gradient)."""
    return [t.detach().requires_grad_() for t in tensors]


def _keys(t, b, s):
    """Batch row b of a key-indexed (B, h, N, ·) tensor without its s pads."""
    return t[b : b + 1, :, s:]


def _queries(t, b, s):
    """Batch row b of a query-indexed (B, h, Nq[, ·]) tensor without the pads' own query rows (with Nq < Nk
    the queries sit at the last positions, after every pad)."""
    return t[b : b + 1, :, s:] if t.shape[2] == N else t[b : b + 1]


def _params():
    out = []
    for name in BACKENDS:
        for case in GRID:
            slow = name == "triton" and case[0] in TRITON_MAPPINGS and case not in TRITON_SAMPLE
            out.append(
                pytest.param(name, case, id=f"{name}-{'-'.join(case)}", marks=[pytest.mark.slow] if slow else [])
            )
    return out


@pytest.mark.parametrize("name,case", _params())
def test_left_padded_batch_equals_each_row_alone(name, case):
    """Batch rows left-padded by PADS, passed as key_start: at the real positions, output and gradients equal
    each row run alone through the same backend (pads get zero gradients). A backend that cannot take the
    call raises with its reason when named."""
    q, k, v, kw, up = _case(*case)
    start = torch.tensor(PADS)
    q, k, v = _grad(q, k, v)
    reason = BACKENDS[name].supports(make_call(q, k, v, **kw, key_start=start, chunk_size=5))
    if reason is not None:
        with pytest.raises(ValueError, match=re.escape(f"backend {name!r} cannot take this call: {reason}")):
            ls.attention(q, k, v, **kw, key_start=start, chunk_size=5, backend=name)
        return
    got = run_with_grads(q, k, v, kw, up, key_start=start, chunk_size=5, backend=name)
    tol = 5e-5 if name == "triton" else 1e-5  # the kernels' general-α solve stops at a τ step of 1e-6
    cuts = (_queries, _queries, _keys, _keys, _queries)  # out, dq, dk, dv, dq_scale
    for b, s in enumerate(PADS):
        row_kw = dict(kw)
        if "q_scale" in kw:
            row_kw["q_scale"] = _queries(kw["q_scale"], b, s)
        alone = run_with_grads(
            _queries(q, b, s), _keys(k, b, s), _keys(v, b, s), row_kw, _queries(up, b, s), chunk_size=5, backend=name
        )
        for i, (cut, a, want) in enumerate(zip(cuts, got, alone)):
            torch.testing.assert_close(
                cut(a, b, s),
                want,
                atol=tol * max(1.0, want.abs().max().item()),
                rtol=tol,
                msg=lambda m, i=i, b=b: f"row {b}, result {i}: {m}",
            )
        assert (got[2][b, :, :s] == 0).all() and (got[3][b, :, :s] == 0).all()  # dk, dv of the pads


@pytest.mark.parametrize("name", [n for n in BACKENDS if n != "reference"])
@pytest.mark.parametrize("mask", ["none", "bool", "float"])
@pytest.mark.parametrize("mapping", ["entmax15", "softmax"])
def test_key_ranges_equal_the_dense_mask(name, mask, mapping):
    """Left and right padding together (one row with an empty range), alone or with a bool mask (and-ed) or a
    float mask (−inf outside the ranges): the reference given the equivalent dense mask (a query that sees
    nothing gets zeros). A backend that takes the call without key ranges but not with them says that they
    became a mask."""
    q, k, v, kw, up = _case(mapping, "alibi", "causal", "gqa")
    start, end = torch.tensor([5, 15]), torch.tensor([N - 7, 9])
    j = torch.arange(N)
    dense = ((j >= start[:, None]) & (j < end[:, None])).view(B, 1, 1, N)
    extra = {}
    g = torch.Generator().manual_seed(1)
    if mask == "bool":
        extra["attn_mask"] = torch.rand(1, H, N, N, generator=g) > 0.2
        dense = dense & extra["attn_mask"]
    elif mask == "float":
        extra["attn_mask"] = torch.randn(1, H, N, N, generator=g)
        dense = extra["attn_mask"].masked_fill(~dense, float("-inf"))
    q, k, v = _grad(q, k, v)
    reason = BACKENDS[name].supports(make_call(q, k, v, **kw, **extra, key_start=start, key_end=end))
    if reason is not None:
        plain = BACKENDS[name].supports(make_call(q, k, v, **kw))
        assert ("key_start / key_end reach it as an attn_mask" in reason) == (plain is None and mask == "none")
        with pytest.raises(ValueError, match=re.escape(reason)):
            ls.attention(q, k, v, **kw, **extra, key_start=start, key_end=end, backend=name)
        return
    got = run_with_grads(q, k, v, kw, up, **extra, key_start=start, key_end=end, backend=name)
    want = run_with_grads(q, k, v, kw, up, attn_mask=dense, backend="reference")
    tol = 5e-5 if name == "triton" else 1e-5
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=tol * max(1.0, b.abs().max().item()), rtol=tol)
    assert (got[0][1] == 0).all()


def test_key_range_arguments_are_validated_and_explained():
    q, k, v, _, _ = _case("entmax15", "none", "causal", "mha")
    for bad in (torch.tensor([1.0, 2.0]), torch.tensor([1, 2, 3]), torch.tensor([True, False]), [0, 1]):
        with pytest.raises(ValueError, match=r"key_start must be an integer tensor of shape \(2,\)"):
            ls.attention(q, k, v, key_start=bad)
    choice = ls.explain_attention(q, k, v, key_start=torch.tensor(PADS), key_end=torch.tensor([N, 20]))
    assert "key_start" in choice.call and "key_end" in choice.call
    if BACKENDS["fused_cpu"].supports(make_call(q, k, v)) is None:  # the C++ kernel is built here
        assert choice.backend == "fused_cpu"  # it reads the key ranges natively
    # any integer is a range: past the ends it clamps, an empty one gives zeros
    out = ls.attention(q, k, v, key_start=torch.tensor([-4, N + 3]), key_end=torch.tensor([99, N + 9]))
    torch.testing.assert_close(out[0], ls.attention(q[:1], k[:1], v[:1])[0])
    assert (out[1] == 0).all()


def test_policy_with_key_ranges():
    """CUDA: triton takes key ranges; CPU: entmax stays on fused_cpu (it reads them natively; chunked without
    the kernel), softmax stays on sdpa."""
    q, k, v, _, _ = _case("entmax15", "none", "causal", "mha")
    call = make_call(q, k, v, key_start=torch.tensor(PADS))
    assert select_backend(dataclasses.replace(call, device_type="cuda"), supports=lambda n: None).backend == "triton"
    choice = select_backend(call, complete=True)
    kernel_built = BACKENDS["fused_cpu"].supports(make_call(q, k, v)) is None
    assert choice.backend == ("fused_cpu" if kernel_built else "chunked")
    assert select_backend(make_call(q, k, v, mapping="softmax", key_start=torch.tensor(PADS))).backend == "sdpa"


# ----------------------------------------------------------------------------- the model

V = 23


def _model(backend="auto", method="asentmax", positions="nape", dtype=torch.float64):
    torch.manual_seed(0)
    cfg = ModelConfig.from_dict(
        dict(
            vocab_size=V,
            d_model=32,
            n_layers=2,
            n_heads=2,
            d_ff=64,
            attention=dict(method=method, positions=positions, attn_backend=backend),
        )
    )
    return Transformer(cfg).to(dtype).eval()


def _left_padded(n=8, pads=(3, 0)):
    ids = torch.randint(0, V, (len(pads), n), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(len(pads), n, dtype=torch.bool)
    for b, s in enumerate(pads):
        mask[b, :s] = False
    return ids, mask


def _record_attention_calls(monkeypatch):
    calls = []
    real = nn_attention.attention

    def record(*args, **kw):
        calls.append((args, kw))
        return real(*args, **kw)

    monkeypatch.setattr(nn_attention, "attention", record)
    return calls


def test_model_passes_padding_as_key_ranges(monkeypatch):
    """Left-padded prompts, their cached decoding and right-padded prompts with a cache reach attention as key
    ranges; right padding without a cache as nothing; pads between real keys as the dense mask."""
    calls = _record_attention_calls(monkeypatch)
    model = _model()
    ids, left = _left_padded()

    def seen(**kw):
        calls.clear()
        model(ids, **kw)
        return [{name: kwargs.get(name) for name in ("attn_mask", "key_start", "key_end")} for _, kwargs in calls]

    for c in seen(attention_mask=left):
        assert c["attn_mask"] is None and c["key_end"] is None and c["key_start"].tolist() == [3, 0]
    for c in seen(attention_mask=left.flip(1)):  # right padding, no cache
        assert c == {"attn_mask": None, "key_start": None, "key_end": None}
    cache = model.new_cache()
    for c in seen(attention_mask=left.flip(1), cache=cache):  # right padding with a cache: later queries see it
        assert c["attn_mask"] is None and c["key_start"] is None and c["key_end"].tolist() == [5, 8]
    calls.clear()
    model(ids[:, :1], cache=cache)  # pads now sit between real keys
    assert all(kw["attn_mask"] is not None and kw.get("key_start") is None for _, kw in calls)
    calls.clear()
    model.generate(ids, 3, attention_mask=left)
    assert len(calls) == 2 * 3 and all(
        kw.get("attn_mask") is None and kw["key_start"].tolist() == [3, 0] for _, kw in calls
    )


def test_auto_picks_triton_for_every_call_of_a_left_padded_cuda_generation(monkeypatch):
    """Every attention call of a left-padded generation (prefill and cached steps), as it would be on CUDA
    tensors: auto picks the triton kernels (before key ranges, the mask sent it to the chunked path)."""
    calls = _record_attention_calls(monkeypatch)
    model = _model(dtype=torch.float32)
    ids, left = _left_padded()
    model.generate(ids, 3, attention_mask=left)
    assert calls
    for args, kw in calls:
        kw = {name: value for name, value in kw.items() if name != "backend"}
        call = dataclasses.replace(make_call(*args, **kw), device_type="cuda")
        choice = select_backend(call)
        assert choice.backend == "triton", choice


@pytest.mark.parametrize(
    "backend,method",
    [("auto", "asentmax"), ("reference", "entmax"), ("chunked", "softmax"), ("sdpa", "ssmax"), ("triton", "asentmax")],
)
def test_cached_generation_of_a_left_padded_batch_equals_each_row_alone(backend, method, monkeypatch):
    """Prefill of left-padded prompts with a cache, then cached steps: the logits of every row equal those of
    the row generated alone without padding, and so do the greedy tokens (float64; triton: float32, its
    cached steps on the split-K decode path, which takes them from 9 cached keys here instead of 1024)."""
    decode_flags = []
    if backend == "triton":
        from longsparse.attention import triton_entmax as te

        op = te._attention_op  # its arguments: q, k, v, α, α per head, slopes, key ranges, scale, causal, decode, …
        monkeypatch.setattr(te, "DECODE_MIN_KEYS", 9)
        monkeypatch.setattr(te, "_attention_op", lambda *args: decode_flags.append(args[10]) or op(*args))
    dtype = torch.float32 if backend == "triton" else torch.float64
    model = _model(backend, method, dtype=dtype)
    pads = (3, 0)
    ids, left = _left_padded(pads=pads)
    steps = torch.randint(0, V, (2, 3), generator=torch.Generator().manual_seed(6))

    def teacher_forced(prompt, mask, follow):
        cache = model.new_cache()
        out = [model(prompt, attention_mask=mask, cache=cache, logits_for="last")]
        out += [model(follow[:, t : t + 1], cache=cache, logits_for="last") for t in range(follow.shape[1])]
        return torch.cat(out, 1)

    batch = teacher_forced(ids, left, steps)
    tol = 2e-5 if dtype == torch.float32 else 1e-10
    for b, s in enumerate(pads):
        alone = teacher_forced(ids[b : b + 1, s:], None, steps[b : b + 1])
        torch.testing.assert_close(batch[b : b + 1], alone, atol=tol, rtol=tol)
    if backend == "triton":
        assert True in decode_flags and False in decode_flags  # the cached steps; the 8-token prefills
    if dtype == torch.float64:
        tokens = model.generate(ids, 4, attention_mask=left)
        for b, s in enumerate(pads):
            assert torch.equal(tokens[b : b + 1], model.generate(ids[b : b + 1, s:], 4))
