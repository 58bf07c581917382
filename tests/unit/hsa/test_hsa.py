"""HSA model (longsparse.hsa): causality for every switch combination, the exact long-context path,
the chunk visibility rule, chunk weighting (top-k stick-breaking / softmax, entmax), the bypass and
standard residual formulas, training steps for every ablation, diagnostics and config validation."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from helpers.configs import HSA_VOCAB, tiny_hsa

from longsparse.hsa import (
    HSAConfig,
    HSAFastEvaluator,
    HSAModel,
    chunk_weights,
    hsa_fast_logits,
    length_scale,
    needle_diagnostics,
    retrieval_diagnostics,
    sliding_window_attention,
    visible_chunks,
)
from longsparse.hsa.model import HSABlock
from longsparse.hsa.ops import ChunkMemory

V = HSA_VOCAB


pytestmark = pytest.mark.usefixtures("one_thread")


def make(seed=0, dtype=torch.float64, **kw) -> HSAModel:
    torch.manual_seed(seed)
    return HSAModel(tiny_hsa(**kw)).to(dtype).eval()


def ids(B, N, seed=0):
    return torch.randint(4, V, (B, N), generator=torch.Generator().manual_seed(seed))


LANDMARK_ENC = [("encoder_cls", 1), ("encoder_mean", 2), ("mean", 0)]
COMBOS = list(
    itertools.product(
        LANDMARK_ENC,
        ["bypass", "standard"],
        ["stickbreaking", "softmax", "entmax"],
        ["token", "chunk"],
        ["nope", "rope"],
    )
)


def combo_kw(lm_enc, fusion, weights, retrieval, pos):
    return dict(
        landmark=lm_enc[0],
        encoder_layers=lm_enc[1],
        fusion=fusion,
        weights=weights,
        retrieval=retrieval,
        hsa_positions=pos,
        length_scale="learned" if weights == "entmax" else "none",
    )


# ---------------------------------------------------------------------------------------------- causality
@pytest.mark.parametrize("lm_enc,fusion,weights,retrieval,pos", COMBOS)
def test_causal_every_switch_combination(lm_enc, fusion, weights, retrieval, pos):
    m = make(**combo_kw(lm_enc, fusion, weights, retrieval, pos))
    x = ids(2, 29)
    out = m(x)
    for t in (9, 20, 28):
        y = x.clone()
        y[:, t] = (y[:, t] - 4 + 7) % (V - 4) + 4  # a different real token
        out2 = m(y)
        assert torch.equal(out[:, :t], out2[:, :t]), f"changing token {t} changed an earlier output"
        assert not torch.allclose(out[:, t:], out2[:, t:])  # and the model does depend on it


@pytest.mark.parametrize(
    "kw",
    [
        dict(upper_group_size=2),
        dict(hsa_local=False),
        dict(n_lower=0),
        dict(weights="entmax", entmax_cap=2, length_scale="fixed"),
    ],
)
def test_causal_other_layouts(kw):
    m = make(**kw)
    x = ids(1, 33)
    out = m(x)
    y = x.clone()
    y[:, 17] = 4 if int(x[0, 17]) != 4 else 5
    assert torch.equal(out[:, :17], m(y)[:, :17])


def test_retrieval_reaches_beyond_the_window():
    """The only route from token 2 to position 40 (window 5, 1 lower + 2 upper local layers = 12 back)
    is chunk retrieval: changing it must change the output (and cannot if HSA is cut out)."""
    m = make(topk=16)
    x = ids(1, 41)
    y = x.clone()
    y[0, 2] = 4 if int(x[0, 2]) != 4 else 5
    assert not torch.allclose(m(x)[:, 40], m(y)[:, 40])
    for blk in m.upper:
        if isinstance(blk, HSABlock):
            torch.nn.init.zeros_(blk.hsa.o_proj.weight)
    assert torch.allclose(m(x)[:, 40], m(y)[:, 40], atol=1e-12)


@pytest.mark.parametrize("n_lower,n_upper,group", [(1, 2, 1), (2, 1, 1), (0, 2, 2)])
def test_retrieval_none_never_reads_beyond_the_window(n_lower, n_upper, group):
    """Sliding-window-only baseline (retrieval='none'): every layer is a window-5 sliding-window layer, so position
    t reads tokens t − (n_lower + n_upper)·(window − 1) … t only. A token one step further back must not change the
    output (the same model with retrieval on does change), one inside the receptive field must; the exact fast path
    (no chunk memory) agrees with the full forward."""
    W = 5
    m = make(retrieval="none", n_lower=n_lower, n_upper=n_upper, upper_group_size=group, window=W)
    assert m.hsa_layers() == [] and len(m.encoder.layers) == 0
    R = (n_lower + n_upper) * (W - 1)
    x = ids(2, 61, seed=3)
    t = 60
    out = m(x)
    far, near = t - R - 1, t - R
    y = x.clone()
    y[:, far] = (y[:, far] - 4 + 7) % (V - 4) + 4
    for cut in range(far + 1):  # every token beyond the window, one at a time
        z = x.clone()
        z[:, cut] = (z[:, cut] - 4 + 7) % (V - 4) + 4
        assert torch.equal(m(z)[:, t], out[:, t]), f"token {cut} (distance {t - cut} > {R}) changed position {t}"
    z = x.clone()
    z[:, near] = (z[:, near] - 4 + 7) % (V - 4) + 4
    assert not torch.allclose(m(z)[:, t], out[:, t]), "a token inside the receptive field must matter"
    torch.testing.assert_close(hsa_fast_logits(m, x, [0, 17, 59, 60]), out[:, [0, 17, 59, 60]])
    torch.manual_seed(0)
    ret = (
        HSAModel(tiny_hsa(n_lower=n_lower, n_upper=n_upper, upper_group_size=group, window=W, topk=16)).double().eval()
    )
    assert not torch.allclose(ret(y)[:, t], ret(x)[:, t]), "with retrieval on, the far token is reachable"


def test_retrieval_none_trains_and_scores_needles():
    from longsparse.hsa import score_needles
    from longsparse.tasks import get_task

    m = make(dtype=torch.float32, retrieval="none").train()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    x = ids(4, 40, seed=5)
    labels = torch.roll(x, -1, 1)
    labels[:, -1] = -100
    losses = []
    for _ in range(3):
        loss = F.cross_entropy(m(x).flatten(0, 1), labels.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    task = get_task("passkey", None, value_len=1, num_values=16, min_distance=8)
    torch.manual_seed(0)
    m = HSAModel(
        HSAConfig(
            vocab_size=task.vocab_size,
            d_model=32,
            n_heads=2,
            d_ff=48,
            n_lower=1,
            n_upper=1,
            chunk_size=4,
            window=5,
            retrieval="none",
        )
    ).eval()
    nd = score_needles(m, task, 64, 4)
    assert nd["retrieval"] == "none" and nd["recall_at_k"] == 0.0 and nd["mean_needle_weight"] == 0.0
    assert nd["full_recall"]["k"] == 0 and nd["exact_match_given_miss"]["n"] == 4 and math.isnan(nd["mean_rank"])


# ------------------------------------------------------------------------------------- exact fast path
@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(weights="softmax", retrieval="chunk", hsa_positions="rope"),
        dict(weights="entmax", length_scale="learned", landmark="encoder_mean", encoder_layers=2),
        dict(weights="entmax", entmax_cap=3, landmark="mean", encoder_layers=0, fusion="standard"),
        dict(n_lower=2, n_upper=4, upper_group_size=2, topk=3, retrieval="chunk"),
    ],
)
def test_fast_logits_equal_full_forward(kw):
    m = make(**kw)
    x = ids(2, 203, seed=1)
    full = m(x)
    pos = [0, 3, 57, 150, 199, 202]
    fast = hsa_fast_logits(m, x, pos, segment_len=24, max_cached_chunks=5)  # tiny cache: recomputation
    torch.testing.assert_close(fast, full[:, pos], rtol=0, atol=1e-10)
    last = hsa_fast_logits(m, x, [202])
    torch.testing.assert_close(last, full[:, [202]], rtol=0, atol=1e-10)


def test_fast_path_records_same_selection_and_gather_equals_dense():
    m = make(weights="softmax", topk=3)
    x = ids(1, 120, seed=2)
    rec_full, rec_fast = [], []
    dense = m(x, record=rec_full)
    m.cfg.hsa_impl = "gather"
    torch.testing.assert_close(m(x), dense, rtol=0, atol=1e-10)
    m.cfg.hsa_impl = "dense"
    HSAFastEvaluator(m, x).logits([119], rec_fast)
    for a, b in zip(rec_full, rec_fast):
        assert torch.equal(a["selected"][:, 119], b["selected"][:, -1, : a["selected"].shape[-1]])


def test_fast_path_float32_long_input_runs_in_bounded_work():
    m = make(dtype=torch.float32)
    x = ids(1, 4000, seed=3)
    ev = HSAFastEvaluator(m, x, segment_len=512)
    out = ev.logits([3999])
    assert out.shape == (1, 1, V) and torch.isfinite(out).all()
    assert ev.landmarks.shape[1] == 1000
    torch.testing.assert_close(out, m(x)[:, [3999]], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw", [dict(), dict(weights="entmax", retrieval="chunk")])
def test_generate_cached_equals_uncached_and_handles_left_padding(kw):
    m = make(**kw)
    p = ids(2, 30, seed=4)
    a = m.generate(p, 9, use_cache=True)
    b = m.generate(p, 9, use_cache=False)
    assert torch.equal(a, b) and a.shape == (2, 9)
    # left padding: row 1 padded with 3 pads decodes like the unpadded row
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), p[1:, :27]], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.bool), torch.ones(1, 27, dtype=torch.bool)], 1)
    two = m.generate(
        torch.cat([p[:1], padded]), 5, attention_mask=torch.cat([torch.ones(1, 30, dtype=torch.bool), mask])
    )
    assert torch.equal(two[1], m.generate(p[1:, :27], 5)[0])
    assert torch.equal(two[0], a[0, :5])


def greedy_by_full_forward(m, prompt, steps):
    """Greedy tokens (B, steps) by argmax of the full forward over everything so far, step by step."""
    seq = prompt
    with torch.no_grad():
        for _ in range(steps):
            seq = torch.cat([seq, m(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    return seq[:, prompt.shape[1] :]


@pytest.mark.parametrize("kw", [dict(), dict(method="entmax", positions="nape", weights="entmax", retrieval="chunk")])
def test_cached_generation_is_greedy_argmax_of_the_full_forward_step_by_step(kw):
    """HSA's incremental decoding (the long-context evaluator) gives, at every step, the full forward's logits
    of the last position (float64), so its greedy tokens are the full forward's argmax decoding — across chunk
    boundaries, for left-padded rows (decoded one at a time without their pads) and with EOS."""
    m = make(**kw)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # weights far from init, so greedy decoding does not loop at once
        for p in m.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    prompt = ids(2, 13, seed=7)  # 3 complete chunks of 4, then 12 steps complete 3 more
    reference = greedy_by_full_forward(m, prompt, 12)
    decoding = m.cached_decoding(prompt, torch.ones_like(prompt, dtype=torch.bool))
    seq = prompt
    for t in range(12):
        with torch.no_grad():
            torch.testing.assert_close(decoding.last_logits(), m(seq)[:, -1], rtol=0, atol=1e-10)
        decoding.extend(reference[:, t : t + 1])
        seq = torch.cat([seq, reference[:, t : t + 1]], 1)
    assert torch.equal(m.generate(prompt, 12), reference)
    assert torch.equal(m.generate(prompt, 12, use_cache=False), reference)
    # left padding: row 0 has 5 pads before its 8 real tokens
    padded = prompt.clone()
    padded[0, :5] = 0
    mask = torch.ones_like(padded, dtype=torch.bool)
    mask[0, :5] = False
    alone = greedy_by_full_forward(m, prompt[:1, 5:], 12)
    for use_cache in (True, False):
        out = m.generate(padded, 12, attention_mask=mask, use_cache=use_cache)
        assert torch.equal(out[0], alone[0]) and torch.equal(out[1], reference[1])
    # EOS: a row is filled with it from its first EOS on
    eos = int(reference[0, 4])
    out = m.generate(prompt, 12, eos_id=eos)
    for row, tokens in zip(out, reference.tolist()):
        first = tokens.index(eos) if eos in tokens else 12
        assert row[:first].tolist() == tokens[:first] and (row[first:] == eos).all()


# ------------------------------------------------------------------------------ visibility and weighting
def test_visibility_rule():
    S = 4
    pos = torch.arange(13)
    vis = visible_chunks(pos, 3, S)
    for t in range(13):
        for c in range(3):
            assert bool(vis[t, c]) == ((c + 1) * S <= t)
    assert vis[4].tolist() == [True, False, False] and vis[3].tolist() == [False, False, False]


@pytest.mark.parametrize("weights,cap", [("stickbreaking", None), ("softmax", None), ("entmax", None), ("entmax", 2)])
def test_invisible_chunks_get_zero_weight_and_are_never_selected(weights, cap):
    g = torch.Generator().manual_seed(0)
    S, C, N = 4, 6, 26
    pos = torch.arange(N)
    vis = visible_chunks(pos, C, S)
    s = torch.randn(3, N, C, generator=g, dtype=torch.float64)
    s = torch.where(vis, s, s + 1e4)  # invisible chunks score far higher
    noise = torch.randn(3, N, C, generator=g, dtype=torch.float64) * 5
    for nz in (None, noise):
        w, sel = chunk_weights(s, vis[None], weights=weights, topk=2, cap=cap, noise=nz)
        assert torch.all(w[:, ~vis] == 0) and not sel[:, ~vis].any()
        assert torch.all(w >= 0) and torch.all(sel.sum(-1) <= (2 if weights != "entmax" or cap else C))
        nvis = vis.sum(-1)
        assert torch.all(w[:, nvis == 0] == 0)
        if weights != "stickbreaking":
            torch.testing.assert_close(w.sum(-1)[:, nvis > 0], torch.ones(3, int((nvis > 0).sum()), dtype=s.dtype))
        else:
            assert torch.all(w.sum(-1) <= 1 + 1e-12)


def test_model_never_selects_incomplete_or_future_chunks():
    for kw in (dict(), dict(weights="entmax"), dict(retrieval="chunk", weights="softmax", topk=5)):
        m = make(**kw)
        rec = []
        m(ids(2, 37), record=rec)
        for r in rec:
            p = r["positions"]
            C = r["selected"].shape[-1]
            c = torch.arange(C)
            future = (c[None, :] + 1) * 4 > p[:, None]
            assert not r["selected"][:, future].any() and torch.all(r["weights"][:, future] == 0)
            assert r["selected"][:, p >= 8].any(-1).all()  # something visible ⇒ something selected


def test_topk_picks_the_best_visible_and_stickbreaking_formula():
    vis = torch.tensor([[True, True, True, True, False]])
    s = torch.tensor([[0.5, 2.0, -1.0, 1.0, 9.0]], dtype=torch.float64)
    w, sel = chunk_weights(s, vis, weights="stickbreaking", topk=2)
    assert sel.tolist() == [[False, True, False, True, False]]
    b1, b3 = torch.sigmoid(s[0, 1]), torch.sigmoid(s[0, 3])
    # recency order: chunk 3 (most recent) breaks the stick first
    torch.testing.assert_close(
        w[0], torch.stack([s.new_zeros(()), b1 * (1 - b3), s.new_zeros(()), b3, s.new_zeros(())])
    )
    w2, _ = chunk_weights(s, vis, weights="softmax", topk=2)
    e = torch.softmax(s[0, [1, 3]], 0)
    torch.testing.assert_close(w2[0, [1, 3]], e)


def test_entmax_selection_sparse_sums_to_one_and_cap():
    g = torch.Generator().manual_seed(1)
    C = 40
    s = torch.randn(200, C, generator=g, dtype=torch.float64) * 3
    vis = torch.rand(200, C, generator=g) < 0.7
    vis[:, 0] = True
    w, sel = chunk_weights(s, vis, weights="entmax", alpha=1.5)
    torch.testing.assert_close(w.sum(-1), torch.ones(200, dtype=s.dtype))
    assert torch.equal(sel, w > 0)
    assert (sel.sum(-1) < vis.sum(-1)).float().mean() > 0.9  # sparse: most rows drop some chunks
    # exact α-entmax over the visible scores: p_j = [(α−1)s_j − τ]₊^{1/(α−1)}, so √p + s/2 is constant on the support
    for r in range(5):
        sup = sel[r]
        c = w[r, sup].sqrt() - 0.5 * s[r, sup]
        torch.testing.assert_close(c, c[0].expand_as(c))
        assert torch.all(0.5 * s[r, vis[r] & ~sup] + c[0] <= 1e-9)  # below the threshold τ = −c: no mass
    for cap in (1, 2, 3):
        wc, selc = chunk_weights(s, vis, weights="entmax", alpha=1.5, cap=cap)
        assert torch.all(selc.sum(-1) <= cap)
        torch.testing.assert_close(wc.sum(-1), torch.ones(200, dtype=s.dtype))
        same = sel.sum(-1) <= cap  # cap not binding ⇒ identical to uncapped
        torch.testing.assert_close(wc[same], w[same])


def test_length_scale_multiplies_the_retrieval_query():
    pos = torch.tensor([0, 3, 4, 15, 16, 1000])
    sc = length_scale(pos, 4, 1.5)
    n = torch.tensor([1, 1, 1, 3, 4, 250], dtype=torch.float32)
    torch.testing.assert_close(sc, torch.log(n + 1) ** 1.5)
    m = make(weights="entmax", length_scale="learned", length_gamma=0.7)
    hsa = m.hsa_layers()[0]
    assert isinstance(hsa.gamma, torch.nn.Parameter) and float(hsa.gamma.detach()) == pytest.approx(0.7)
    h = torch.randn(1, 40, 32, dtype=torch.float64)
    p = torch.arange(40)
    q = hsa.retrieval_query(h, p)
    torch.testing.assert_close(
        q,
        hsa.q_ret(h)
        * (torch.log(torch.div(p, 4, rounding_mode="floor").clamp_min(1).double() + 1) ** 0.7)[None, :, None],
    )


def test_per_chunk_query_is_shared_and_is_the_previous_chunk_mean():
    m = make(retrieval="chunk")
    hsa = m.hsa_layers()[0]
    h = torch.randn(2, 20, 32, dtype=torch.float64)
    q = hsa.retrieval_query(h, torch.arange(20))
    assert torch.all(q[:, :4] == 0)
    for j in range(1, 5):
        exp = hsa.q_ret(h[:, (j - 1) * 4 : j * 4].mean(1))
        for t in range(j * 4, j * 4 + 4):
            torch.testing.assert_close(q[:, t], exp)


def test_sliding_window_attention_matches_dense_band():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 53, 8, generator=g, dtype=torch.float64) for _ in range(3))
    for W in (1, 5, 8, 30, 60):
        i = torch.arange(53)
        d = i[:, None] - i[None, :]
        z = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~((d >= 0) & (d < W)), float("-inf"))
        torch.testing.assert_close(sliding_window_attention(q, k, v, W, 1 / math.sqrt(8)), torch.softmax(z, -1) @ v)


# ------------------------------------------------------------------------------------------- fusion
@pytest.mark.parametrize("fusion", ["bypass", "standard"])
def test_residual_formulas(fusion):
    torch.manual_seed(0)
    cfg = tiny_hsa(fusion=fusion)
    blk = HSABlock(cfg).double()
    for p in blk.parameters():  # non-trivial norm weights
        if p.dim() == 1:
            torch.nn.init.uniform_(p, 0.5, 1.5)
    x = torch.randn(2, 21, 32, dtype=torch.float64)
    pos = torch.arange(21)
    mem = ChunkMemory(torch.randn(2, 5, 32, dtype=torch.float64), torch.randn(2, 5, 4, 32, dtype=torch.float64))
    h = blk.pre_attn_norm(x)
    loc = blk.post_attn_norm(blk.attn(h, pos))
    r = blk.post_hsa_norm(blk.hsa(h, pos, mem))

    def mlp(z):
        return blk.post_mlp_norm(blk.mlp(blk.pre_mlp_norm(z)))

    if fusion == "bypass":
        expected = x + loc + mlp(x + loc + r)  # x_out = x' + MLP(norm(x' + HSA)), x' = x + local
    else:
        expected = x + loc + r + mlp(x + loc + r)
    torch.testing.assert_close(blk(x, pos, mem), expected)
    # bypass: with the MLP's output zeroed the HSA output never reaches the residual stream
    torch.nn.init.zeros_(blk.mlp.down_proj.weight)
    out = blk(x, pos, mem)
    if fusion == "bypass":
        torch.testing.assert_close(out, x + loc)
    else:
        torch.testing.assert_close(out, x + loc + r)
        assert not torch.allclose(out, x + loc)


# ------------------------------------------------------------------------------------------ training
ABLATIONS = [
    dict(),
    dict(landmark="mean", encoder_layers=0),
    dict(landmark="encoder_mean", encoder_layers=2),
    dict(fusion="standard"),
    dict(weights="softmax"),
    dict(weights="entmax"),
    dict(weights="entmax", entmax_cap=2, gumbel_noise=1.0, length_scale="fixed"),
    dict(weights="entmax", length_scale="learned"),
    dict(topk=1),
    dict(chunk_size=8),
    dict(window=3),
    dict(retrieval="chunk"),
    dict(hsa_positions="rope"),
    dict(gumbel_noise=0.5),
    dict(upper_group_size=2),
    dict(hsa_local=False),
]


@pytest.mark.parametrize("kw", ABLATIONS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_train_steps_finite_for_every_ablation(kw):
    m = make(dtype=torch.float32, **kw).train()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    x = ids(4, 40, seed=5)
    labels = torch.roll(x, -1, 1)
    labels[:, -1] = -100
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    losses = []
    for _ in range(3):
        loss = F.cross_entropy(m(x).flatten(0, 1), labels.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        for n, p in m.named_parameters():
            assert p.grad is None or torch.isfinite(p.grad).all(), n
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    hsa = m.hsa_layers()[0]
    assert not torch.equal(
        before[[n for n, p in m.named_parameters() if p is hsa.q_ret.weight][0]], hsa.q_ret.weight
    ), "the retrieval query gets no gradient"
    if kw.get("length_scale") == "learned":
        assert hsa.gamma.grad is not None and torch.isfinite(hsa.gamma.grad)


def test_gumbel_noise_only_in_training():
    m = make(gumbel_noise=5.0, topk=1)
    x = ids(1, 40)
    assert torch.equal(m(x), m(x))  # eval: deterministic
    m.train()
    torch.manual_seed(0)
    a = m(x)
    torch.manual_seed(1)
    assert not torch.allclose(a, m(x))


def test_select_warmup_uses_softmax_topk_then_the_configured_selection():
    m = make(select_warmup=2, select_warmup_topk=4, topk=2, weights="stickbreaking").train()
    x = ids(1, 40)

    def n_selected(model):
        rec = []
        model(x, record=rec)
        return int(rec[0]["selected"][0, -1].sum()), rec[0]["weights"][0, -1].sum().item()

    assert n_selected(m.eval())[0] == 2 and int(m.select_steps) == 0  # eval mode: the configured selection
    m.train()
    for step in range(2):  # warm-up: softmax over the top 4 (Σw = 1)
        k, wsum = n_selected(m)
        assert k == 4 and wsum == pytest.approx(1.0)
    k, wsum = n_selected(m)  # then top-2 stick-breaking (Σw < 1)
    assert k == 2 and wsum < 1 and int(m.select_steps) == 3
    sd = m.state_dict()
    assert int(sd["select_steps"]) == 3  # saved in checkpoints: resume is exact
    m2 = make(select_warmup=2, select_warmup_topk=4, topk=2, weights="stickbreaking")
    m2.load_state_dict(sd)
    assert int(m2.select_steps) == 3 and "select_steps" not in make().state_dict()


# ---------------------------------------------------------------------------------------- diagnostics
def test_retrieval_diagnostics_consistent_fast_and_full():
    from longsparse.tasks import get_task

    task = get_task("passkey", value_len=2, num_filler=8, min_distance=8, depth=0.1)
    batch = task.batch(60, 3, seed=0, split="test")
    m = make(vocab_size=task.vocab_size, weights="softmax", topk=2)
    d_fast = needle_diagnostics(m, task, batch, fast=True)
    d_full = needle_diagnostics(m, task, batch, fast=False)
    for k in ("selected", "rank", "weight", "recall_at_k"):
        torch.testing.assert_close(d_fast[k], d_full[k], equal_nan=True)
    assert d_fast["selected"].shape == (3, 2, 3)  # B, HSA layers, answer positions
    ok = ~torch.isnan(d_fast["rank"])
    assert ok.all()  # needle early ⇒ always visible
    # top-k (no ties): selected ⇔ rank <= k, and only selected chunks carry weight
    assert torch.equal(d_fast["selected"][ok], d_fast["rank"][ok] <= 2)
    assert torch.all(d_fast["weight"][~d_fast["selected"]] == 0)
    assert torch.all((d_fast["weight"] >= 0) & (d_fast["weight"] <= 1 + 1e-9))


def test_diagnostics_rank_with_planted_scores():
    """Retrieval scores planted to rank chunk 2 first, chunk 5 second: ranks, selection and weights follow."""
    m = make(weights="softmax", topk=1)

    def planted(h, positions, memory):
        s = torch.zeros(h.shape[0], h.shape[1], memory.n_chunks, dtype=h.dtype)
        s[..., 2] = 10.0
        s[..., 5] = 5.0
        return s

    for hsa in m.hsa_layers():
        hsa.scores = planted
    x = ids(1, 48, seed=7)
    d = retrieval_diagnostics(m, x, [20, 47], [[9]])  # needle in chunk 2
    assert d["rank"].shape == (1, 2, 2) and torch.all(d["rank"] == 1) and d["selected"].all()
    torch.testing.assert_close(d["weight"], torch.ones(1, 2, 2))
    assert float(d["recall_at_k"][0]) == 1.0
    d = retrieval_diagnostics(m, x, [20, 47], [[21, 22]])  # chunk 5: invisible at 20, rank 2 at 47
    assert torch.isnan(d["rank"][0, :, 0]).all() and torch.all(d["rank"][0, :, 1] == 2)
    assert not d["selected"].any() and torch.all(d["weight"] == 0) and float(d["recall_at_k"][0]) == 0.0
    d2 = retrieval_diagnostics(m, x, [20, 47], [[21, 22]], fast=False)
    torch.testing.assert_close(d["rank"], d2["rank"], equal_nan=True)


# ----------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(landmark="encoder_cls", encoder_layers=0), "needs encoder_layers"),
        (dict(landmark="nope"), "unknown landmark"),
        (dict(fusion="x"), "unknown fusion"),
        (dict(weights="sparsemax"), "unknown weights"),
        (dict(encoder_layers=3), "0, 1 or 2"),
        (dict(n_upper=3, upper_group_size=2), "multiple"),
        (dict(entmax_cap=2), "only applies"),
        (dict(weights="entmax", gumbel_noise=1.0), "uncapped entmax"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(entmax_alpha=1.0, weights="entmax"), "entmax_alpha"),
        (dict(retrieval="doc"), "unknown retrieval"),
        (dict(branch_gain=-0.1), "branch_gain"),
        (dict(retrieval="off"), "unknown retrieval"),
        (dict(retrieval="none", hsa_local=False), "needs hsa_local"),
        (dict(select_warmup=-1), "select_warmup"),
        (dict(select_warmup_topk=0), "select_warmup_topk"),
        (dict(attention={"topk": 0}), "attention.topk must be a positive integer"),
        (dict(method="flash"), "unknown attention.method 'flash'"),
        (dict(positions="nape", n_heads=3, d_model=33), "positions='nape' needs an even n_heads"),
        (dict(norm_eps=0.0), "norm_eps and init_std must be > 0"),
    ],
)
def test_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        tiny_hsa(**kw)


def test_config_roundtrip():
    c = tiny_hsa(weights="entmax", entmax_cap=3)
    assert HSAConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="unknown HSAConfig"):
        HSAConfig.from_dict({**c.to_dict(), "bogus": 1})


# ------------------------------------------- initialisation (docs/hsa.md: branch_gain)
def test_branch_gain_init_keeps_token_identity_and_in_chunk_gradients():
    """Regression: with the sandwich post-norms at gain 1, the chunk encoder (and the lower sliding-window
    layers) overwrote each token's state with a chunk/window average at init (within-chunk spread of the
    keys/values 0.19 instead of 0.97 at d = 64) and the in-chunk attention's q/k gradients were ~100x
    smaller than with the token states themselves; the encoder/CLS layout then never left chance on passkey.
    With branch_gain the blocks start near identity: same order of gradient with and without the encoder."""
    from longsparse.tasks import IGNORE_INDEX, get_task

    task = get_task("passkey", None, value_len=1, num_values=16, min_distance=32)
    batch = task.batch((64, 64), 16, rng=task.rng(0, "train"))
    base = dict(
        vocab_size=task.vocab_size,
        d_model=64,
        n_heads=4,
        d_ff=128,
        n_upper=1,
        topk=4,
        weights="softmax",
        hsa_local=False,
    )

    def probe(**kw):
        torch.manual_seed(0)
        m = HSAModel(HSAConfig.from_dict({**base, **kw}))
        loss = F.cross_entropy(m(batch.input_ids).flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)
        loss.backward()
        h = m.upper[0].hsa
        with torch.no_grad():
            _, tok = m.encode_chunks(m.run_lower(batch.input_ids)[:, :64])
        spread = float(tok.std(2).mean() / tok.pow(2).mean().sqrt())
        return float(h.q_proj.weight.grad.norm() + h.k_proj.weight.grad.norm()), spread, m

    g_tok, s_tok, _ = probe(n_lower=0, encoder_layers=0, landmark="mean")
    g_enc, s_enc, m = probe(n_lower=2, encoder_layers=1, landmark="encoder_cls")
    g_old, s_old, _ = probe(n_lower=2, encoder_layers=1, landmark="encoder_cls", branch_gain=1.0)
    assert s_tok > 0.9 and s_enc > 0.8 and s_old < 0.5
    assert g_enc > 0.2 * g_tok and g_old < 0.05 * g_tok
    assert all(torch.all(n.weight == 0.01) for n in m.branch_norms())
    assert all(
        torch.all(b.post_hsa_norm.weight == 1) and torch.all(b.post_mlp_norm.weight == 1)
        for b in m.upper
        if isinstance(b, HSABlock)
    )
