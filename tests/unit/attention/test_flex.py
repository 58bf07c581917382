"""The flex backend (torch FlexAttention, compiled): its block mask, its values against a float64 oracle on the
CPU (inference: torch's CPU FlexAttention has no backward and no log-sum-exp), its adaptive-temperature passes
(run here through FlexAttention's uncompiled path, which returns the log-sum-exp), what it refuses and why, and
auto's choice of it on CUDA. With CUDA: values and gradients against the oracle over a grid.

The values over the shared grid of every backend are in tests/unit/attention/test_backends.py (forward-only
backends)."""

from __future__ import annotations

import dataclasses
import itertools
import re
import zlib

import pytest
import torch

import longsparse as ls
from longsparse.attention import BACKENDS, flex, policy
from longsparse.attention.backends import sdpa as sdpa_backend
from longsparse.attention.call import make_call
from longsparse.attention.policy import select_backend
from longsparse.mappings.variants import adaptive_temperature

B, H, N, D = 2, 4, 37, 16
SLOPES = torch.tensor([1.0, 0.5, 0.25, 0.0])
CUDA = torch.cuda.is_available()


def oracle(q, k, v, *, mapping="softmax", is_causal=True, alibi_slopes=None, q_scale=None, key_start=None,
           key_end=None, scale=None, **_):  # fmt: skip
    """Float64 brute force of the flex formula: softmax(θ·z) with z = scale·(q·s)·k − m·|pos_i − j|, pos_i =
    Nk − Nq + i, masked by the key ranges and (causal) j ≤ pos_i; θ the adaptive temperature (no gradient) or
    1; a row that sees no key gives zeros. Differentiable in q, k, v, q_scale."""
    Bq, Hq, Nq, Dq = q.shape
    Nk = k.shape[2]
    rep = Hq // k.shape[1]
    k64, v64 = (t.double().repeat_interleave(rep, 1) for t in (k, v))
    q64 = q.double() * (1.0 if q_scale is None else q_scale.double()[..., None])
    z = q64 @ k64.transpose(-1, -2) * (Dq**-0.5 if scale is None else scale)
    pos = (Nk - Nq + torch.arange(Nq, device=q.device))[:, None]
    j = torch.arange(Nk, device=q.device)
    if alibi_slopes is not None:
        z = z - alibi_slopes.double().view(1, -1, 1, 1) * (pos - j).abs()
    keep = torch.ones(Bq, 1, Nq, Nk, dtype=torch.bool, device=q.device)
    if is_causal:
        keep = keep & (j <= pos)
    if key_start is not None:
        keep = keep & (j >= key_start.view(-1, 1, 1, 1))
    if key_end is not None:
        keep = keep & (j < key_end.view(-1, 1, 1, 1))
    z = z.masked_fill(~keep, float("-inf"))
    if mapping == "adatemp":
        z = z * adaptive_temperature(z)
    p = torch.softmax(z, -1).nan_to_num(0.0)
    return p @ v64


def _inputs(nq, hkv, seed_text, *, mapping="softmax", causal=True, alibi=True, q_scale=True, ranges=None,
            device="cpu", dtype=torch.float32):  # fmt: skip
    g = torch.Generator().manual_seed(zlib.crc32(seed_text.encode()))
    q = torch.randn(B, H, nq, D, generator=g) * 2
    k, v = (torch.randn(B, hkv, N, D, generator=g) for _ in range(2))
    kw = dict(mapping=mapping, is_causal=causal)
    if alibi:
        kw["alibi_slopes"] = SLOPES * 0.3
    if q_scale:
        kw["q_scale"] = torch.rand(B, H, nq, generator=g) + 0.5
    if ranges is not None:
        kw["key_start"], kw["key_end"] = (torch.tensor(r) for r in ranges)
    move = lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() and t.dim() == 4 else t.dtype)  # noqa: E731
    return move(q), move(k), move(v), {n: move(t) if torch.is_tensor(t) else t for n, t in kw.items()}


# ----------------------------------------------------------------------------- the block mask


@pytest.mark.parametrize("seed", range(40))
def test_block_mask_lists_every_visible_tile_and_only_fully_visible_ones_as_full(seed):
    """Against the dense mask: every tile holding a visible key is listed (partial or full), no tile without
    one is, and a full tile is visible at every row and key (so mask_mod may be skipped there)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
    bsz, nk = r(1, 3), r(1, 700)
    nq = nk if seed % 3 == 0 else r(1, nk)
    first = nk - nq
    ks = torch.randint(-5, nk + 3, (bsz,), generator=g)
    ke = torch.randint(-5, nk + 3, (bsz,), generator=g)
    if seed % 4 == 0:
        ks, ke = torch.zeros(bsz, dtype=torch.long), torch.full((bsz,), nk)
    far = nk + nq
    lo, hi = [(-far, 0), (-far, far), (1, far)][seed % 3]
    kv_num, kv_idx, full_num, full_idx = flex.block_mask_tensors(bsz, nq, nk, first, ks, ke, lo, hi, "cpu")
    pos = first + torch.arange(nq)[:, None]
    j = torch.arange(nk)
    vis = (j >= ks.view(-1, 1, 1)) & (j < ke.view(-1, 1, 1)) & (j >= pos + lo) & (j <= pos + hi)  # (B, nq, nk)
    nqb, nkb = -(-nq // flex.BLOCK), -(-nk // flex.BLOCK)
    for b, qb in itertools.product(range(bsz), range(nqb)):
        partial = set(kv_idx[b, 0, qb, : kv_num[b, 0, qb]].tolist())
        full = set(full_idx[b, 0, qb, : full_num[b, 0, qb]].tolist())
        assert not partial & full
        for kb in range(nkb):
            tile = vis[b, qb * flex.BLOCK : (qb + 1) * flex.BLOCK, kb * flex.BLOCK : (kb + 1) * flex.BLOCK]
            assert (kb in partial or kb in full) == bool(tile.any()), (b, qb, kb)
            if kb in full:
                assert tile.all() and tile.shape[1] == flex.BLOCK


# ----------------------------------------------------------------------------- values on the CPU (compiled)

# (Nq, Hkv) shapes: each compiles once per process on the CPU (~10-20 s); the decoding shape by default
CPU_CASES = [
    pytest.param(
        nq,
        hkv,
        causal,
        ranges,
        id=f"nq{nq}-hkv{hkv}-{'causal' if causal else 'non_causal'}-{rid}",
        marks=[] if (nq, hkv) == (5, 2) else [pytest.mark.slow],
    )  # fmt: skip
    for nq, hkv in ((5, 2), (N, 4))
    for causal in (True, False)
    for rid, ranges in (("no_ranges", None), ("ranges", ([N - 3, 2], [N, N - 4])), ("empty_row", ([N, 0], [N, 20])))
]


@pytest.mark.parametrize("nq,hkv,causal,ranges", CPU_CASES)
def test_flex_forward_on_cpu_equals_the_oracle(nq, hkv, causal, ranges):
    """Softmax with NAPE slopes (symmetric when not causal), q-scales, bottom-right decoding offsets, GQA and
    key ranges (left and right padding; a batch row whose range is empty gives zeros)."""
    q, k, v, kw = _inputs(nq, hkv, f"{nq}{hkv}{causal}{ranges}", causal=causal, ranges=ranges)
    if BACKENDS["flex"].supports(make_call(q, k, v, **kw)) is not None:
        pytest.skip(BACKENDS["flex"].supports(make_call(q, k, v, **kw)))
    with torch.no_grad():
        got = ls.attention(q, k, v, **kw, backend="flex")
    torch.testing.assert_close(got.double(), oracle(q, k, v, **kw), atol=2e-6, rtol=1e-5)
    if ranges is not None and ranges[0][0] >= ranges[1][0]:
        assert (got[0] == 0).all()


# ----------------------------------------------------------------------------- both passes, uncompiled


@pytest.fixture
def uncompiled_flex(monkeypatch):
    """flex with FlexAttention's uncompiled path (dense scores inside torch; on the CPU it returns the
    log-sum-exp that the compiled CPU kernel lacks): tests the adaptive temperature's passes here."""
    import torch.nn.attention.flex_attention as fa

    monkeypatch.setattr(fa, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", False)
    monkeypatch.setattr(flex, "compiled", lambda with_lse, *_: flex._attend_lse if with_lse else flex._attend_out)


@pytest.mark.parametrize("mapping", ["adatemp", "softmax"])
@pytest.mark.parametrize(
    "nq,hkv,causal,ranges",
    [
        (N, 4, True, None),
        (5, 2, True, None),
        (N, 4, False, None),
        (N, 2, False, ([20, 0], [N, 9])),
        (7, 4, True, ([N - 2, 3], [N, N - 3])),
        (N, 4, False, ([N, 0], [N, N])),  # row 0 sees nothing: θ = 1, output 0
    ],
)
@pytest.mark.parametrize("alibi", [True, False])
def test_adaptive_temperature_passes_equal_the_oracle(uncompiled_flex, mapping, nq, hkv, causal, ranges, alibi):
    """θ from the entropy pass (H = lse − E_p[z], E_p[z] from an output over [k | j]; non-causal ALiBi as two
    calls, keys left and right of each query) and the re-tempered softmax equal the float64 oracle."""
    q, k, v, kw = _inputs(nq, hkv, f"{mapping}{nq}{causal}{ranges}{alibi}", mapping=mapping, causal=causal,
                          alibi=alibi, ranges=ranges)  # fmt: skip
    with torch.no_grad():
        got = flex.flex_attention_run(make_call(q, k, v, **kw))
    torch.testing.assert_close(got.double(), oracle(q, k, v, **kw), atol=2e-5, rtol=1e-5)


def test_adaptive_temperature_is_above_one_on_some_rows_of_these_cases():
    """The oracle's θ exceeds 1 on some rows of the adaptive-temperature cases (else they test softmax)."""
    q, k, v, kw = _inputs(N, 4, "theta", mapping="adatemp", alibi=False)
    z = (q * kw["q_scale"][..., None]) @ k.transpose(-1, -2) / D**0.5
    assert (adaptive_temperature(z) > 1).any()


# ----------------------------------------------------------------------------- refusals


def _reason(**over):
    q, k, v, kw = _inputs(N, 4, "reasons")
    grad = over.pop("grad", False)
    dtype = over.pop("dtype", None)
    if dtype is not None:
        q, k, v = (t.to(dtype) for t in (q, k, v))
    q.requires_grad_(grad)
    call = make_call(q, k, v, **{**kw, **over})
    return BACKENDS["flex"].supports(call), (q, k, v, {**kw, **over})


@pytest.mark.parametrize(
    "over,words",
    [
        (dict(mapping="entmax"), "not a softmax"),
        (dict(mapping="topk", topk=3), "kept set"),
        (dict(attn_mask=torch.ones(N, N, dtype=torch.bool)), "not a dense mask"),
        (dict(alibi_slopes=(SLOPES * 0.3).requires_grad_()), "does not differentiate"),
        (dict(dtype=torch.float64), "dtype float64"),
        (dict(grad=True), "no backward"),
        (dict(mapping="adatemp"), "log-sum-exp"),
    ],
)
def test_flex_refuses_what_it_cannot_run_with_a_one_line_reason(over, words):
    reason, (q, k, v, kw) = _reason(**over)
    assert reason is not None and words in reason and "\n" not in reason
    with pytest.raises(ValueError, match=re.escape(f"backend 'flex' cannot take this call: {reason}")):
        ls.attention(q, k, v, **kw, backend="flex")


def test_flex_on_a_build_without_flex_attention_says_so(monkeypatch):
    monkeypatch.setattr(flex, "_BUILD_REASONS", {})
    monkeypatch.setattr(flex, "_flex_module", lambda: (None, "not available: torch 2.0 has no FlexAttention"))
    reason, (q, k, v, kw) = _reason()
    assert reason == "not available: torch 2.0 has no FlexAttention"
    with pytest.raises(ValueError, match="backend 'flex' cannot take this call: not available"):
        ls.attention(q, k, v, **kw, backend="flex")
    monkeypatch.setattr(flex, "_BUILD_REASONS", {})
    monkeypatch.setattr(flex, "_flex_module", lambda: (object(), None))
    monkeypatch.setattr(flex, "_cpu_supported", lambda: False)
    assert "needs AVX2" in _reason()[0]


def test_a_compiler_failure_is_one_line(monkeypatch):
    def broken(*args):
        raise RuntimeError("InductorError: no C++ compiler\nlong traceback text")

    monkeypatch.setattr(flex, "compiled", lambda *a: broken)
    q, k, v, kw = _inputs(N, 4, "broken")
    with torch.no_grad(), pytest.raises(RuntimeError) as err:
        ls.attention(q, k, v, **kw, backend="flex")
    assert str(err.value).startswith("backend 'flex': FlexAttention could not run this call on cpu")
    assert "\n" not in str(err.value) and "no C++ compiler" in str(err.value)


# ----------------------------------------------------------------------------- auto's choice


def _cuda_call(grad=False, **kw):
    g = torch.Generator().manual_seed(0)
    nq = kw.pop("nq", N)
    q = torch.randn(B, H, nq, D, generator=g).requires_grad_(grad)
    k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(2))
    return dataclasses.replace(make_call(q, k, v, **kw), device_type="cuda")


def _not_triton(name):
    return "triton refuses" if name == "triton" else None


@pytest.mark.parametrize("grad", [False, True])
def test_auto_on_cuda_sends_biased_softmax_and_adaptive_temperature_to_flex(grad, monkeypatch):
    short = select_backend(_cuda_call(grad, mapping="softmax", alibi_slopes=SLOPES), supports=_not_triton)
    assert short.backend == "sdpa" and "dense bias" in short.passed_over["flex"]  # flex compiles per shape
    monkeypatch.setattr(sdpa_backend, "SDPA_MAX_ELEMENTS", 1)  # every bias counts as long
    for kw in (
        dict(mapping="softmax", alibi_slopes=SLOPES),
        dict(mapping="softmax", key_start=torch.tensor([3, 0])),
        dict(mapping="softmax", nq=5),  # a causal decoding offset
        dict(mapping="softmax", alibi_slopes=SLOPES, q_scale=torch.ones(B, H, N)),  # SSMax with NAPE
        dict(mapping="adatemp"),
        dict(mapping="adatemp", alibi_slopes=SLOPES, is_causal=False),
    ):
        choice = select_backend(_cuda_call(grad, **kw), supports=_not_triton)
        assert choice.backend == "flex", kw
        assert "FlexAttention" in choice.why
    plain = select_backend(_cuda_call(grad, mapping="softmax"), supports=_not_triton)
    assert plain.backend == "sdpa" and "flash kernel" in plain.passed_over["flex"]
    chunked = select_backend(
        _cuda_call(grad, mapping="softmax", alibi_slopes=SLOPES, chunk_size=8), supports=_not_triton
    )
    assert chunked.backend != "flex" and "chunk_size" in chunked.passed_over["flex"]


def test_auto_on_cuda_falls_back_when_flex_refuses(monkeypatch):
    monkeypatch.setattr(policy, "_flex_gate", lambda call: None)  # a call auto would give flex
    choice = select_backend(
        _cuda_call(mapping="softmax", alibi_slopes=SLOPES),
        supports=lambda name: "flex refuses" if name in ("flex", "triton") else None,
    )
    assert choice.backend == "sdpa" and choice.passed_over["flex"] == "flex refuses"


def test_auto_keeps_cpu_calls_off_flex_and_explain_says_why():
    q, k, v, kw = _inputs(N, 4, "cpu-auto")
    with torch.no_grad():
        choice = ls.explain_attention(q, k, v, **kw)
    assert choice.backend != "flex"
    assert "CUDA tensors only" in choice.passed_over["flex"]
    assert "flex" in str(choice)
    assert policy.select_backend(make_call(q, k, v, **kw)).backend == choice.backend


# ----------------------------------------------------------------------------- CUDA: values and gradients

CUDA_GRID = [
    (mapping, causal, nq, hkv, biased, ([N - 3, 2], [N, N - 4]) if biased else None)
    for mapping in ("softmax", "adatemp")
    for causal, nq in ((True, N), (True, 5), (False, N))
    for hkv in (4, 2)
    for biased in (True, False)  # ALiBi slopes and key ranges, or neither
]


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("case", CUDA_GRID, ids=lambda c: "-".join(map(str, c[:5])) + ("-ranges" if c[5] else ""))
def test_flex_on_cuda_equals_the_oracle_with_gradients(case):
    mapping, causal, nq, hkv, alibi, ranges = case
    q, k, v, kw = _inputs(nq, hkv, str(case), mapping=mapping, causal=causal, alibi=alibi, ranges=ranges,
                          device="cuda")  # fmt: skip
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, kw["q_scale"])]
    kw = {**kw, "q_scale": leaves[3]}
    biased = alibi or ranges is not None or nq != N or mapping == "adatemp"
    assert (ls.explain_attention(*leaves[:3], **kw).backend == "flex") == biased
    got = ls.attention(*leaves[:3], **kw, backend="flex")
    up = torch.randn(got.shape, generator=torch.Generator().manual_seed(7)).cuda()
    grads = torch.autograd.grad((got * up).sum(), leaves)
    want = oracle(*leaves[:3], **kw)
    want_grads = torch.autograd.grad((want * up.double()).sum(), leaves)
    tol = 1e-4 if mapping == "adatemp" else 2e-5
    for a, b in zip([got, *grads], [want, *want_grads]):
        torch.testing.assert_close(a.double(), b, atol=tol * max(1.0, b.abs().max().item()), rtol=tol)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_flex_on_cuda_in_bfloat16_and_at_a_long_decoding_offset():
    q, k, v, kw = _inputs(3, 2, "bf16", device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        got = ls.attention(q, k, v, **kw, backend="flex")
    torch.testing.assert_close(got.double(), oracle(q, k, v, **kw), atol=3e-2, rtol=3e-2)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 1, 32, generator=g).cuda()
    k, v = (torch.randn(1, 4, 1000, 32, generator=g).cuda() for _ in range(2))
    for nk in (1000, 999, 517):  # one compiled function across growing caches (dynamic lengths)
        kw = dict(mapping="softmax", alibi_slopes=SLOPES.cuda() * 0.05, key_start=torch.tensor([nk // 3]).cuda())
        with torch.no_grad():
            got = ls.attention(q, k[:, :, :nk], v[:, :, :nk], **kw, backend="flex")
        torch.testing.assert_close(got.double(), oracle(q, k[:, :, :nk], v[:, :, :nk], **kw), atol=2e-5, rtol=1e-5)
