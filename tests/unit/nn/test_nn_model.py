"""Transformer: every method × position trains and generates; cached == full-forward generation."""

import math

import pytest
import torch
from helpers.configs import decoder_section

from longsparse.nn import METHODS, POSITIONS, ModelConfig, Transformer, capture

COMBOS = [(m, p) for m in METHODS for p in POSITIONS]
V = 23


def tiny(method, positions, **kw):
    base = dict(vocab_size=V, d_model=32, n_layers=2, n_heads=4, d_ff=64, method=method, positions=positions, topk=4)
    base.update(kw)
    return ModelConfig.from_dict(decoder_section(**base))


@pytest.mark.parametrize("method,positions", COMBOS)
def test_train_step_and_generate(method, positions):
    torch.manual_seed(0)
    model = Transformer(tiny(method, positions, learn_alpha=method in ("entmax", "asentmax")))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, V, (3, 12))
    logits = model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    opt.step()
    out = model.generate(ids[:, :5], 4)
    assert out.shape == (3, 4) and out.dtype == torch.long and (out >= 0).all() and (out < V).all()


def _no_ties(method, positions):
    # top-k over exactly tied logits (NoPE heads see identical keys for repeated tokens) is decided by
    # 1-ulp differences between the cached and full paths; keep those combos on tie-free sequences.
    return method == "topk" and positions in ("nope", "nape")


@pytest.mark.parametrize("method,positions", COMBOS)
def test_cached_generation_equals_full_forward(method, positions):
    """Greedy tokens with the KV cache (and logits_for='last') == full forward each step, on a
    left-padded batch, generating well past a notional training length of 16."""
    torch.manual_seed(0)
    model = Transformer(tiny(method, positions, vocab_size=64 if _no_ties(method, positions) else V)).double()
    model.eval()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, :3] = False
    if _no_ties(method, positions):
        # teacher-forced, distinct tokens: cached logits == full-forward logits at every step
        seq = torch.stack([torch.randperm(64)[:24] for _ in range(2)])
        full_mask = torch.cat([mask, torch.ones(2, 16, dtype=torch.bool)], 1)
        full = model(seq, attention_mask=full_mask)
        cache = model.new_cache()
        steps = [model(seq[:, :8], attention_mask=mask, cache=cache, logits_for="last")]
        steps += [model(seq[:, t : t + 1], cache=cache, logits_for="last") for t in range(8, 24)]
        torch.testing.assert_close(torch.cat(steps, 1), full[:, 7:], atol=1e-9, rtol=1e-9)
        return
    a = model.generate(ids, 14, attention_mask=mask)
    b = model.generate(ids, 14, attention_mask=mask, use_cache=False)
    assert torch.equal(a, b)
    # a left-padded row generates exactly what the unpadded row does
    c = model.generate(ids[:1, 3:], 14)
    assert torch.equal(a[:1], c)


def test_layer_cache_growth_equals_concatenation():
    """The preallocated cache returns exactly the concatenation of everything appended, across growths and
    appends of several tokens; under autograd it concatenates, so gradients reach every appended key."""
    from longsparse.nn import LayerCache

    torch.manual_seed(0)
    cache, ks, vs = LayerCache(), [], []
    for m in (5, 1, 1, 3, 1, 7, 1, 1, 20):
        k, v = torch.randn(2, 3, m, 4), torch.randn(2, 3, m, 4)
        ks.append(k)
        vs.append(v)
        got_k, got_v = cache.append(k, v)
        assert torch.equal(got_k, torch.cat(ks, 2)) and torch.equal(got_v, torch.cat(vs, 2))
    assert cache.n == 40 and torch.equal(cache.k, torch.cat(ks, 2))
    cache, first = LayerCache(), torch.randn(1, 1, 3, 2, requires_grad=True)
    cache.append(first, first)
    k, _ = cache.append(torch.randn(1, 1, 1, 2, requires_grad=True), torch.randn(1, 1, 1, 2))
    k.sum().backward()
    assert first.grad is not None and torch.equal(first.grad, torch.ones_like(first))


@pytest.mark.parametrize("method,positions", [("asentmax", "nape"), ("ssmax", "rope"), ("entmax", "alibi")])
def test_padding_and_logits_for_last_are_exact(method, positions):
    torch.manual_seed(3)
    model = Transformer(tiny(method, positions)).double()
    ids = torch.randint(0, V, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, :4] = False
    full = model(ids, attention_mask=mask)
    last = model(ids, attention_mask=mask, logits_for="last")
    torch.testing.assert_close(last[:, 0], full[:, -1], atol=1e-12, rtol=1e-12)
    alone = model(ids[1:, 4:])
    torch.testing.assert_close(full[1, 4:], alone[0], atol=1e-12, rtol=1e-12)
    assert torch.isfinite(full).all()  # pad query rows attend to nothing: zeros, never NaN


def test_eos_fills_rest():
    torch.manual_seed(0)
    model = Transformer(tiny("entmax", "nape"))
    ids = torch.randint(0, V, (2, 5))
    free = model.generate(ids, 6)
    eos = int(free[0, 1])
    out = model.generate(ids, 6, eos_id=eos)
    assert out.shape == (2, 6)
    assert (out[0, 1:] == eos).all()


def test_config_validation():
    with pytest.raises(ValueError, match="unknown attention.method .flash."):
        tiny("flash", "nape")
    with pytest.raises(ValueError, match="unknown attention.positions .xpos."):
        tiny("entmax", "xpos")
    with pytest.raises(ValueError, match="even n_heads"):
        tiny("entmax", "nape", n_heads=3)
    with pytest.raises(ValueError, match="asentmax_init"):
        tiny("asentmax", "nape", asentmax_init="zeros")
    with pytest.raises(ValueError, match="learn_alpha"):
        tiny("softmax", "nape", learn_alpha=True)
    with pytest.raises(ValueError, match="d_model"):
        tiny("entmax", "nape", d_model=0)
    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        ModelConfig.from_dict({"vocab_size": 3, "bogus": 1})
    cfg = tiny("asentmax", "rope")
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.head_dim == 8


def test_model_structure():
    cfg = tiny("entmax", "nape")
    m = Transformer(cfg)
    assert m.embed.weight.data_ptr() != m.lm_head.weight.data_ptr()  # untied
    assert m.embed_scale == pytest.approx(math.sqrt(32))
    b = m.blocks[0]
    assert all(hasattr(b, n) for n in ("pre_attn_norm", "post_attn_norm", "pre_mlp_norm", "post_mlp_norm"))
    assert m.blocks[0].attn.scale == pytest.approx(1 / math.sqrt(8))
    assert not any(isinstance(x, torch.nn.Dropout) for x in m.modules())


@pytest.mark.parametrize("method", ["softmax", "entmax", "asentmax", "topk"])
def test_capture(method):
    torch.manual_seed(0)
    model = Transformer(tiny(method, "nape"))
    ids = torch.randint(0, V, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, :2] = False
    with capture(model) as cap:
        model(ids, attention_mask=mask)
    assert cap.layers == [0, 1]
    for layer in cap.layers:
        r = cap[layer]
        p = r["attn"]
        assert p.shape == (2, 4, 12, 12)
        sums = p.sum(-1)
        torch.testing.assert_close(sums[1], torch.ones_like(sums[1]))
        torch.testing.assert_close(sums[0, :, 2:], torch.ones_like(sums[0, :, 2:]))
        assert (sums[0, :, :2] == 0).all()  # padding queries
        assert (p[0, :, :, :2] == 0).all()  # padding keys
        assert (r["support"] == (p > 0).sum(-1)).all()
        assert ((r["entropy"] >= -1e-6) & (r["entropy"] <= 1 + 1e-5)).all()
        assert r["scale"].shape == (2, 4, 12)
        if method in ("entmax", "asentmax", "topk"):
            causal_allowed = torch.arange(12)[None, :] <= torch.arange(12)[:, None]
            assert (p[1][:, causal_allowed] == 0).any()  # sparse: zeros inside the causal window
        if method == "asentmax":
            assert (r["scale"][:, :2] == 1).all()  # ALiBi heads of NAPE are not scaled
            assert (r["scale"][1, 2:] > 1).all()
    assert all(m._capture is None for m in model.attention_layers())
    with capture(model, what=("scale",), layers=[1]) as cap:
        model.generate(ids[1:], 3)
    assert cap.layers == [1] and len(cap.calls[1]) == 3 and set(cap[1]) == {"scale"}
    with pytest.raises(ValueError, match="unknown capture"):
        with capture(model, what=("nope",)):
            pass


@pytest.mark.parametrize("method,positions", [("asentmax", "nape"), ("softmax", "rope"), ("entmax", "alibi")])
def test_right_padding_needs_no_attention_mask(method, positions, monkeypatch):
    """Right-padded rows without a cache (training batches) reach attention with no mask, so the fused backends
    can take them, and their real positions equal the unpadded rows; left padding goes as key_start (its key
    range; tests/unit/attention/test_key_ranges.py)."""
    import longsparse.nn.attention as nn_attention

    seen = []
    real = nn_attention.attention
    monkeypatch.setattr(
        nn_attention,
        "attention",
        lambda *a, **kw: seen.append(kw.get("attn_mask", kw.get("key_start"))) or real(*a, **kw),
    )
    torch.manual_seed(4)
    model = Transformer(tiny(method, positions)).double()
    ids = torch.randint(0, V, (2, 10))
    right = torch.ones(2, 10, dtype=torch.bool)
    right[1, 6:] = False
    out = model(ids, attention_mask=right)
    assert seen and all(m is None for m in seen)
    torch.testing.assert_close(out[1, :6], model(ids[1:, :6])[0], atol=1e-12, rtol=1e-12)
    seen.clear()
    model(ids, attention_mask=right.flip(1))  # left padding: its key range is needed and kept
    assert seen and all(m is not None for m in seen)
