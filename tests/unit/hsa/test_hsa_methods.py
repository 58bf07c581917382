"""Every method (mapping + length scaler) and position scheme inside HSA: each token attention (sliding window,
chunk encoder, attention inside retrieved chunks) equals a float64 brute force with the method's mapping, values
and gradients; the whole model stays causal and its long-context evaluator exact; entmax / ASEntmax models train
and keep the enforced selection sparsity."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers.configs import HSA_VOCAB, tiny_hsa
from helpers.mappings import ref_entmax

from longsparse.hsa import HSAModel, hsa_fast_logits, sliding_window_attention
from longsparse.hsa.model import ChunkEncoderAttention, HSAAttention
from longsparse.hsa.ops import ChunkMemory
from longsparse.mappings import get_mapping
from longsparse.mappings.registry import method_mapping

V = HSA_VOCAB
pytestmark = pytest.mark.usefixtures("one_thread")


def make(seed=0, dtype=torch.float64, **kw) -> HSAModel:
    torch.manual_seed(seed)
    m = HSAModel(tiny_hsa(**{"attention": {"topk": 2}, **kw})).to(dtype).eval()  # the k of the top-k method
    with torch.no_grad():  # scalers away from their init and α per head away from 1.5
        for name, p in m.named_parameters():
            if "scaler" in name or "learned_alpha" in name:
                p.add_(0.3 * torch.randn_like(p))
    return m


def ids(B, N, seed=0):
    return torch.randint(4, V, (B, N), generator=torch.Generator().manual_seed(seed))


def oracle_map(layer, z: torch.Tensor, grad: bool) -> torch.Tensor:
    """The layer's mapping on rows z (H, n) in float64: a bisection α-entmax (values) or the library's
    autograd mapping (gradients); softmax by torch; top-k and adaptive temperature by their mappings."""
    name = method_mapping(layer.cfg.attention.method)
    alpha = layer.alpha()
    alpha = alpha.detach().double()[:, None] if isinstance(alpha, torch.Tensor) else alpha
    if name == "softmax":
        return torch.softmax(z, -1)
    if name in ("entmax", "sparsemax"):
        a = 2.0 if name == "sparsemax" else alpha
        if not grad:
            return ref_entmax(z, a)
        return torch.stack(
            [
                get_mapping("entmax", alpha=float(a[h]) if isinstance(a, torch.Tensor) else a)(z[h])
                for h in range(z.shape[0])
            ]
        )
    return get_mapping(name, topk=layer.cfg.attention.topk, adatemp_order=layer.cfg.attention.adatemp_order)(z)


def oracle_chunk_attention(layer: HSAAttention, h, positions, memory, grad=False):
    """HSA(h) by a loop over (row, token, selected chunk): the layer's own selection, projections and RoPE;
    per chunk the mapping of the scaled logits over its S keys; Σ_c w_tc·o_tc; W_o."""
    S = layer.hsa_cfg.chunk_size
    _, _, w, sel = layer.select(h, positions, memory)
    q = layer.split(layer.q_proj(h))
    if layer.rope is not None:
        q = layer.rope(q, positions)
    qs = (
        torch.ones(q.shape[:3], dtype=q.dtype)
        if layer.scaler is None
        else layer.scaler(h, torch.full((h.shape[0], h.shape[1]), S - 1))
    )
    rows = []
    for b in range(h.shape[0]):
        outs = []
        for t in range(h.shape[1]):
            o = q.new_zeros(q.shape[1], q.shape[3])
            for c in sel[b, t].nonzero().flatten().tolist():
                k = layer.split(layer.k_proj(memory.tokens[b, c]))  # (H, S, Dh)
                v = layer.split(layer.v_proj(memory.tokens[b, c]))
                if layer.rope is not None:
                    k = layer.rope(k[None], torch.arange(c * S, (c + 1) * S))[0]
                z = (q[b, :, t] * qs[b, :, t, None])[:, None, :] @ k.transpose(-1, -2) * layer.scale
                o = o + w[b, t, c] * (oracle_map(layer, z[:, 0], grad)[:, None, :] @ v)[:, 0]
            outs.append(o)
        rows.append(torch.stack(outs, 1))
    return layer.o_proj(layer.merge(torch.stack(rows)))


METHODS = [
    dict(method="softmax"),
    dict(method="entmax"),
    dict(method="entmax", learn_alpha=True, alpha=1.3),
    dict(method="sparsemax"),
    dict(method="topk"),
    dict(method="adatemp"),
    dict(method="ssmax"),
    dict(method="asentmax"),
    dict(method="asentmax", asentmax_scaler="static"),
]


def label(kw):
    return ",".join(f"{k}={v}" for k, v in kw.items())


# ------------------------------------------------------------------------- attention inside retrieved chunks
@pytest.mark.parametrize("hsa_positions", ["nope", "rope"])
@pytest.mark.parametrize("kw", METHODS, ids=label)
def test_chunk_attention_equals_float64_oracle_both_impls(kw, hsa_positions):
    m = make(hsa_positions=hsa_positions, **kw)
    layer = m.hsa_layers()[0]
    g = torch.Generator().manual_seed(1)
    h = torch.randn(2, 23, 32, generator=g, dtype=torch.float64)
    pos = torch.arange(23)
    mem = ChunkMemory(
        torch.randn(2, 5, 32, generator=g, dtype=torch.float64),
        torch.randn(2, 5, 4, 32, generator=g, dtype=torch.float64),
    )
    want = oracle_chunk_attention(layer, h, pos, mem)
    for impl in ("dense", "gather"):
        m.cfg.hsa_impl = impl
        torch.testing.assert_close(layer(h, pos, mem), want, rtol=0, atol=1e-10, msg=impl)


@pytest.mark.parametrize("kw", [dict(method="entmax"), dict(method="asentmax"), dict(method="ssmax")], ids=label)
def test_chunk_attention_gradients_equal_the_oracle(kw):
    m = make(hsa_positions="rope", **kw)
    layer = m.hsa_layers()[0]
    g = torch.Generator().manual_seed(2)
    pos = torch.arange(19)
    mem = ChunkMemory(
        torch.randn(1, 4, 32, generator=g, dtype=torch.float64),
        torch.randn(1, 4, 4, 32, generator=g, dtype=torch.float64),
    )
    proj = torch.randn(1, 19, 32, generator=g, dtype=torch.float64)
    grads = {}
    for impl in ("dense", "gather", "oracle"):
        h = torch.randn(1, 19, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64).requires_grad_()
        layer.zero_grad()
        if impl == "oracle":
            out = oracle_chunk_attention(layer, h, pos, mem, grad=True)
        else:
            m.cfg.hsa_impl = impl
            out = layer(h, pos, mem)
        (out * proj).sum().backward()
        grads[impl] = [h.grad] + [
            p.grad.clone() for p in (layer.q_proj.weight, layer.k_proj.weight, layer.q_ret.weight)
        ]
    for impl in ("dense", "gather"):
        for a, b in zip(grads[impl], grads["oracle"]):
            torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9, msg=impl)


# -------------------------------------------------------------------- sliding window and chunk encoder
@pytest.mark.parametrize("mapping,alpha", [("softmax", 1.0), ("entmax", 1.5), ("entmax", 1.25), ("sparsemax", 2.0)])
def test_sliding_window_any_mapping_with_alibi_and_q_scale_equals_dense_band(mapping, alpha):
    g = torch.Generator().manual_seed(0)
    B, H, D = 2, 3, 8
    slopes = torch.tensor([0.5, 0.0, 0.125], dtype=torch.float64)
    for N, W in ((4, 5), (9, 5), (53, 5), (53, 8), (40, 1)):
        q, k, v = (torch.randn(B, H, N, D, generator=g, dtype=torch.float64) for _ in range(3))
        qs = 0.5 + torch.rand(B, H, N, generator=g, dtype=torch.float64)
        i = torch.arange(N)
        d = i[:, None] - i[None, :]
        z = (q * qs[..., None]) @ k.transpose(-1, -2) / math.sqrt(D) - slopes[:, None, None] * d
        z = z.masked_fill(~((d >= 0) & (d < W)), float("-inf"))
        want = (torch.softmax(z, -1) if mapping == "softmax" else ref_entmax(z, alpha)) @ v
        got = sliding_window_attention(
            q, k, v, W, 1 / math.sqrt(D), q_scale=qs, alibi_slopes=slopes, mapping=mapping, alpha=alpha
        )
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10, msg=f"N={N} W={W}")


@pytest.mark.parametrize("positions", ["alibi", "nape", "rope"])
def test_chunk_encoder_attention_is_bidirectional_with_undirected_alibi(positions):
    """Each of the S + 1 rows sees every row; ALiBi heads get −m·|i − j| (no direction in an encoder)."""
    m = make(positions=positions, method="entmax")
    enc = m.encoder.layers[0].attn
    assert isinstance(enc, ChunkEncoderAttention)
    h = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    q, k, v = (enc.split(p(h)) for p in (enc.q_proj, enc.k_proj, enc.v_proj))
    i = torch.arange(5)
    if enc.rope is not None:
        q, k = enc.rope(q, i), enc.rope(k, i)
    z = q @ k.transpose(-1, -2) * enc.scale
    if enc.alibi_slopes is not None:
        z = z - enc.alibi_slopes.double()[:, None, None] * (i[:, None] - i[None, :]).abs()
    want = enc.o_proj(enc.merge(ref_entmax(z, 1.5) @ v))
    torch.testing.assert_close(enc(h), want, rtol=0, atol=1e-10)


# ------------------------------------------------------------------------------------- whole model
MODEL_SETUPS = [
    dict(method="entmax", positions="alibi"),
    dict(method="asentmax", positions="nape"),
    dict(method="ssmax", positions="rope", hsa_positions="rope", retrieval="chunk"),
    dict(method="sparsemax", positions="nope", weights="entmax", length_scale="learned"),
    dict(method="entmax", learn_alpha=True, positions="nape", n_lower=2, n_upper=2, upper_group_size=2),
]


@pytest.mark.parametrize("kw", MODEL_SETUPS, ids=label)
def test_causal_and_fast_path_exact_for_other_methods_and_positions(kw):
    m = make(**kw)
    x = ids(2, 75, seed=1)
    full = m(x)
    y = x.clone()
    y[:, 40] = (y[:, 40] - 4 + 7) % (V - 4) + 4
    assert torch.equal(m(y)[:, :40], full[:, :40]), "a later token changed an earlier output"
    pos = [0, 3, 39, 57, 74]
    torch.testing.assert_close(
        hsa_fast_logits(m, x, pos, segment_len=16, max_cached_chunks=3), full[:, pos], rtol=0, atol=1e-10
    )
    a, b = m.generate(x[:, :50], 5, use_cache=True), m.generate(x[:, :50], 5, use_cache=False)
    assert torch.equal(a, b)


def test_method_reaches_every_token_attention():
    """The same weights under softmax and entmax give different outputs in every layer kind, and the entmax model
    equals a softmax model nowhere: the method is not silently ignored by any layer."""
    soft, ent = make(method="softmax"), make(method="entmax")
    ent.load_state_dict(soft.state_dict())
    x = ids(1, 30, seed=2)
    with torch.no_grad():
        mid_s, mid_e = soft.run_lower(x), ent.run_lower(x)
        assert not torch.allclose(mid_s, mid_e)  # sliding windows
        land_s, tok_s = soft.encode_chunks(mid_s[:, :28])
        land_e, tok_e = ent.encode_chunks(mid_s[:, :28])
        assert not torch.allclose(land_s, land_e)  # chunk encoder
        mem = ChunkMemory(land_s, tok_s)
        h = soft.upper[0].pre_attn_norm(mid_s)
        assert not torch.allclose(
            soft.hsa_layers()[0](h, torch.arange(30), mem), ent.hsa_layers()[0](h, torch.arange(30), mem)
        )  # inside retrieved chunks


@pytest.mark.parametrize(
    "kw",
    [
        dict(method="entmax", weights="stickbreaking", topk=2),
        dict(method="asentmax", positions="nape", weights="softmax", topk=2),
        dict(method="asentmax", weights="entmax", entmax_cap=2, length_scale="learned"),
    ],
    ids=label,
)
def test_entmax_and_asentmax_train_and_selection_stays_sparse(kw):
    m = make(dtype=torch.float32, **kw).train()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    x = ids(4, 48, seed=5)
    labels = torch.roll(x, -1, 1)
    labels[:, -1] = -100
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    losses = []
    for _ in range(4):
        rec = []
        loss = F.cross_entropy(m(x, record=rec).flatten(0, 1), labels.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in m.parameters())
        opt.step()
        losses.append(loss.item())
        for r in rec:  # at most k chunks, only visible ones, weight only on selected
            C = r["selected"].shape[-1]
            future = (torch.arange(C)[None, :] + 1) * 4 > r["positions"][:, None]
            assert int(r["selected"].sum(-1).max()) <= 2
            assert not r["selected"][:, future].any() and torch.all(r["weights"][~r["selected"]] == 0)
            assert r["selected"][:, r["positions"] >= 12].any(-1).all()
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    if kw["method"] == "asentmax":  # the scalers of every attention kind are trained
        for layer in (m.lower[0].attn, m.encoder.layers[0].attn, m.hsa_layers()[0]):
            name = next(n for n, p in m.named_parameters() if p is layer.scaler.beta_proj.weight)
            assert not torch.equal(before[name], layer.scaler.beta_proj.weight), name
