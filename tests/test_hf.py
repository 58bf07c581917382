"""The Hugging Face transformers adapter (longsparse.nn.hf) on tiny models built from configs."""

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers (optional extra) is not installed")

from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

from longsparse.nn.hf import (
    NoRotaryEmbedding,
    add_asentmax_scalers,
    apply_papers_config,
    from_pretrained,
    register_hf_attention,
)

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 128
# no BOS/EOS, so that greedy generation never stops early or pads finished rows
_TOKENS = {"vocab_size": VOCAB, "pad_token_id": 0, "bos_token_id": None, "eos_token_id": None}


def _llama(impl="sdpa", alpha=None, **kw):
    register_hf_attention()
    shape = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
    }
    cfg = LlamaConfig(attn_implementation=impl, **_TOKENS, **{**shape, **kw})
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).eval()
    if alpha is not None:
        m.config.entmax_alpha = alpha
    return m


def _gemma2(impl="eager", **kw):
    register_hf_attention()
    cfg = Gemma2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        attn_implementation=impl,
        **_TOKENS,
        **kw,
    )
    torch.manual_seed(0)
    return Gemma2ForCausalLM(cfg).eval()


def _batch(B=2, L=10, pad=3):
    """(ids, mask): row 0 left-padded by ``pad`` tokens."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[0, :pad] = 0
    ids[0, :pad] = 0
    return ids, mask


def _randomise_scalers(model, std=0.5):
    """Non-zero scaler weights, so that the scale depends on h and on the query position (the
    scale-aware init starts at a constant 1.05)."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "longsparse_scaler" in name and name.endswith("weight"):
                p.copy_(torch.randn(p.shape, generator=g) * std)


@torch.no_grad()
def _greedy(model, ids, mask, n):
    """(tokens (B, n), logits (B, n, V)): greedy decoding by full forwards without a cache."""
    seq, msk, logits = ids, mask, []
    for _ in range(n):
        logits.append(model(seq, attention_mask=msk, use_cache=False).logits[:, -1])
        nxt = logits[-1].argmax(-1, keepdim=True)
        seq, msk = torch.cat([seq, nxt], 1), torch.cat([msk, torch.ones_like(nxt)], 1)
    return seq[:, ids.shape[1] :], torch.stack(logits, 1)


@torch.no_grad()
def _generate(model, ids, mask, n, cache):
    """(tokens, logits) of ``generate`` (greedy) with the given cache implementation."""
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=n,
        do_sample=False,
        cache_implementation=cache,
        return_dict_in_generate=True,
        output_logits=True,
    )
    return out.sequences[:, ids.shape[1] :], torch.stack(out.logits, 1)


def _assert_same_decoding(got, want, what=""):
    assert torch.equal(got[0], want[0]), what
    torch.testing.assert_close(got[1], want[1], atol=1e-4, rtol=1e-4, msg=lambda m: f"{what}: {m}")


# ----------------------------------------------------------------------------- the adapter


def test_entmax_adapter_matches_sdpa_at_alpha_1_and_generates():
    assert register_hf_attention() == ("entmax", "asentmax")
    ids, mask = _batch()
    sdpa, ent1 = _llama("sdpa"), _llama("entmax", alpha=1.0)  # α = 1 is softmax: must equal sdpa
    with torch.no_grad():
        ref = sdpa(ids, attention_mask=mask).logits
        got = ent1(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[1], ref[1], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[0, 3:], ref[0, 3:], atol=1e-5, rtol=1e-4)
    for impl in ("entmax", "asentmax"):
        m = _llama(impl)
        if impl == "asentmax":
            with pytest.raises(ValueError, match="add_asentmax_scalers"):
                m(ids)
            assert add_asentmax_scalers(m, init="reference") == 2
        out = m(ids, attention_mask=mask).logits
        out.sum().backward()
        assert torch.isfinite(out).all()
        if impl == "asentmax":
            assert m.model.layers[0].self_attn.longsparse_scaler.beta_proj.weight.grad is not None
        _assert_same_decoding(_generate(m, ids, mask, 6, None), _greedy(m, ids, mask, 6), impl)


@pytest.mark.parametrize("impl", ["entmax", "asentmax"])
def test_static_cache_generation_equals_greedy(impl):
    # Without padding, transformers' sdpa mask builder returns no mask for the static-cache prefill and
    # the keys are the whole preallocated buffer with the queries at its start.
    m = _llama(impl)
    if impl == "asentmax":
        add_asentmax_scalers(m, init="reference")
    ids, _ = _batch(pad=0)
    ones = torch.ones_like(ids)
    want = _greedy(m, ids, ones, 6)
    _assert_same_decoding(_generate(m, ids, ones, 6, "static"), want, "all-ones mask")
    _assert_same_decoding(_generate(m, ids, None, 6, "static"), want, "no mask")


def test_gemma2_sliding_window_caches_equal_greedy():
    m = _gemma2("entmax", attn_logit_softcapping=None, sliding_window=4)
    for pad in (0, 3):
        ids, mask = _batch(L=8, pad=pad)
        want = _greedy(m, ids, mask, 8)  # generation runs past the window
        for cache in (None, "static"):
            _assert_same_decoding(_generate(m, ids, mask, 8, cache), want, f"pad {pad}, cache {cache}")


def test_softcap_and_dropout_are_refused():
    ids, _ = _batch(pad=0)
    m = _gemma2("entmax")  # Gemma-2 soft-caps attention logits by default (50)
    with pytest.raises(ValueError, match="soft-capping.*attn_logit_softcapping = None"):
        m(ids)
    m = _llama("entmax", attention_dropout=0.1).train()
    with pytest.raises(ValueError, match="attention dropout"):
        m(ids)
    m.eval()(ids)  # no dropout outside training
    with pytest.raises(ValueError, match="attention dropout"):
        apply_papers_config(_llama(attention_dropout=0.1))


def test_asentmax_scalers_survive_save_and_load(tmp_path):
    m = _llama("asentmax", alpha=1.3)
    add_asentmax_scalers(m, init="reference")
    ids, mask = _batch()
    m.save_pretrained(tmp_path)
    back = from_pretrained(tmp_path)
    assert type(back) is LlamaForCausalLM and back.config._attn_implementation == "asentmax"
    assert back.config.entmax_alpha == 1.3 and back.config.longsparse == m.config.longsparse
    sd, sd2 = m.state_dict(), back.state_dict()
    assert sd.keys() == sd2.keys() and any("longsparse_scaler" in k for k in sd)
    for k in sd:
        assert torch.equal(sd[k], sd2[k]), k
    with torch.no_grad():
        assert torch.equal(back(ids, attention_mask=mask).logits, m(ids, attention_mask=mask).logits)
    # a plain transformers load never comes back as silent softmax: it stops before loading any weight, in one
    # line that names the right loader, with longsparse's attention registered or not
    with pytest.raises(ValueError, match=r"load this model with longsparse\.nn\.hf\.from_pretrained\(path\)") as e:
        LlamaForCausalLM.from_pretrained(tmp_path)
    assert "\n" not in str(e.value)
    # a folder saved before that (config.json naming the registered attention) fails at its first forward
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "attn_implementation": "asentmax"}))
    plain = LlamaForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="longsparse.nn.hf.from_pretrained"):
        plain(ids)


def test_from_pretrained_needs_longsparse_settings(tmp_path):
    _llama().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no longsparse settings"):
        from_pretrained(tmp_path)


# ----------------------------------------------------------------------------- the papers' configuration


def test_papers_config_layout():
    m = apply_papers_config(_llama())
    assert m.config._attn_implementation == "asentmax" and m.config.longsparse["positions"] == "nape"
    assert isinstance(m.model.rotary_emb, NoRotaryEmbedding)
    for layer in m.model.layers:
        attn = layer.self_attn
        torch.testing.assert_close(attn._longsparse_slopes, torch.tensor([1.0, 0.5, 0.0, 0.0]))
        assert attn.longsparse_scaler.scaled_heads.tolist() == [2, 3]  # the NoPE heads only
    # NoPE on the rotary side: the attention sees q and k as projected
    x = torch.randn(1, 5, 64)
    cos, sin = m.model.rotary_emb(x, torch.arange(5).unsqueeze(0))
    assert torch.equal(cos, torch.ones(1, 5, 16)) and torch.equal(sin, torch.zeros(1, 5, 16))
    g = apply_papers_config(_gemma2(), method="entmax", positions="alibi", alpha=[1.5, 1.5, 2.0, 2.0])
    assert g.config.attn_logit_softcapping is None and set(g.config.layer_types) == {"full_attention"}
    assert not any("longsparse_scaler" in k for k in g.state_dict())
    with pytest.raises(ValueError, match="already has longsparse attention"):
        apply_papers_config(m)
    with pytest.raises(ValueError, match="even number of heads"):
        apply_papers_config(_llama(num_attention_heads=1, num_key_value_heads=1))
    with pytest.raises(ValueError, match="unknown method"):
        apply_papers_config(_llama(), method="softmax")
    with pytest.raises(ValueError, match="per-head alpha needs 4"):
        apply_papers_config(_llama(), alpha=[1.5, 2.0])
    for bad in (dict(delta=float("nan")), dict(delta=-1.0), dict(gamma_range=float("inf"))):
        # refused here, not as NaN queries at the first forward
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be a finite number >= 0"):
            apply_papers_config(_llama(), **bad)


def test_papers_config_trains():
    m = apply_papers_config(_llama()).train()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (4, 16), generator=g)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = m(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert m.model.layers[0].self_attn.longsparse_scaler.beta_proj.weight.grad.abs().sum() > 0
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("build", [_llama, _gemma2], ids=["llama", "gemma2"])
def test_papers_config_generation_and_left_padding(build):
    m = apply_papers_config(build())
    _randomise_scalers(m)
    ids, mask = _batch()
    want = _greedy(m, ids, mask, 6)
    for cache in (None, "static"):
        _assert_same_decoding(_generate(m, ids, mask, 6, cache), want, f"cache {cache}")
    with torch.no_grad():  # a left-padded row equals the same tokens unpadded (no position_ids passed)
        padded = m(ids, attention_mask=mask).logits[0, 3:]
        alone = m(ids[:1, 3:]).logits[0]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("build", [_llama, _gemma2], ids=["llama", "gemma2"])
def test_papers_config_survives_save_and_load(build, tmp_path):
    m = apply_papers_config(build(), alpha=1.25)
    _randomise_scalers(m)
    ids, mask = _batch()
    with torch.no_grad():
        before = m(ids, attention_mask=mask).logits
    m.save_pretrained(tmp_path)
    back = from_pretrained(tmp_path)
    assert type(back) is type(m) and back.config.longsparse == m.config.longsparse
    assert isinstance(back.model.rotary_emb, NoRotaryEmbedding)
    with torch.no_grad():
        assert torch.equal(back(ids, attention_mask=mask).logits, before)
    _assert_same_decoding(_generate(back, ids, mask, 4, None), _generate(m, ids, mask, 4, None))
