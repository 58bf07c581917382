"""The Hugging Face transformers adapter (longsparse.nn.hf) on tiny models built from configs."""

import contextlib
import json
import os
import re
import warnings

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers (optional extra) is not installed")

from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

import longsparse.nn.hf as hf
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


# ----------------------------------------------------------------------------- masks: key ranges, not dense masks


@contextlib.contextmanager
def _attention_calls():
    """Records what reaches ls.attention from the adapter: one dict per call (k's length, the attention
    keywords, the dtypes of q, k, v)."""
    calls = []
    inner = hf.attention

    def recorded(q, k, v, **kw):
        calls.append({"Nk": k.shape[2], "dtypes": {q.dtype, k.dtype, v.dtype}, **kw})
        return inner(q, k, v, **kw)

    hf.attention = recorded
    try:
        yield calls
    finally:
        hf.attention = inner


@contextlib.contextmanager
def _dense_masks():
    """The adapter as it was before key ranges: every mask the dense (B, 1, L, S) bool mask of transformers'
    sdpa builder with its causal skip off (the attention function's 4-D branch is that path)."""

    def dense(*args, **kwargs):
        kwargs["allow_is_causal_skip"] = False
        return sdpa_mask(*args, **kwargs)

    saved = {name: ALL_MASK_ATTENTION_FUNCTIONS[name] for name in hf.HF_NAMES}
    for name in hf.HF_NAMES:
        AttentionMaskInterface.register(name, dense)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", hf.HFDenseMaskWarning)
            yield
    finally:
        for name, fn in saved.items():
            AttentionMaskInterface.register(name, fn)


def _padded_batch(kind):
    """(ids, mask) of 3 rows of 10 tokens: 'right' (training: rows 1, 2 end early), 'left' (generation:
    rows 0, 2 start late) or 'both' (row 2 padded on both sides)."""
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(1, VOCAB, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    if kind == "right":
        mask[1, 7:] = 0
        mask[2, 4:] = 0
    elif kind == "left":
        mask[0, :3] = 0
        mask[2, :6] = 0
    else:
        mask[0, :2] = 0
        mask[1, 8:] = 0
        mask[2, :3] = 0
        mask[2, 7:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def _converted(build, **kw):
    m = apply_papers_config(build(), **kw)
    _randomise_scalers(m)
    return m


@pytest.mark.parametrize("build", [_llama, _gemma2], ids=["llama", "gemma2"])
@pytest.mark.parametrize("kind", ["right", "both"])
def test_padded_training_batch_reaches_attention_as_key_ranges(build, kind):
    m = _converted(build).train()
    ids, mask = _padded_batch(kind)
    labels = ids.masked_fill(mask == 0, -100)

    def step():
        m.zero_grad()
        out = m(ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        return out.logits.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    with _attention_calls() as calls:
        logits, grads = step()
    assert len(calls) == m.config.num_hidden_layers
    for c in calls:
        assert c.get("attn_mask") is None and c["is_causal"] and c["Nk"] == 10
        want_end = mask.shape[1] - mask.flip(1).argmax(1)
        assert torch.equal(c["key_end"], want_end)
        if kind == "both":
            assert torch.equal(c["key_start"], mask.argmax(1))
        else:
            assert c.get("key_start") is None
    with _dense_masks(), _attention_calls() as dense_calls:
        want_logits, want_grads = step()
    assert all(c["attn_mask"] is not None for c in dense_calls)  # the comparison is against the dense path
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)  # every position, pads included
    assert grads.keys() == want_grads.keys()
    for n in grads:
        torch.testing.assert_close(grads[n], want_grads[n], atol=1e-5, rtol=1e-4, msg=lambda s, n=n: f"{n}: {s}")


@pytest.mark.parametrize("build", [_llama, _gemma2], ids=["llama", "gemma2"])
@pytest.mark.parametrize("cache", [None, "static"])
def test_left_padded_generation_reaches_attention_as_key_ranges(build, cache):
    m = _converted(build)
    ids, mask = _padded_batch("left")
    with _attention_calls() as calls:
        got = _generate(m, ids, mask, 5, cache)
    layers = m.config.num_hidden_layers
    assert len(calls) == 5 * layers
    for step in range(5):
        for c in calls[step * layers : (step + 1) * layers]:
            # a static cache's keys are cut to the ones in use: prefill 10, then one more per step
            assert c.get("attn_mask") is None and c["Nk"] == 10 + step, (step, c["Nk"])
            assert c["is_causal"] == (step == 0)
            assert torch.equal(c["key_start"], torch.tensor([3, 0, 6])) and c.get("key_end") is None
    with _dense_masks():
        want = _generate(m, ids, mask, 5, cache)
    _assert_same_decoding(got, want, f"cache {cache}")


@pytest.mark.parametrize("impl", ["entmax", "asentmax"])
def test_unpadded_static_cache_cuts_the_keys_without_a_mask(impl):
    m = _llama(impl)
    if impl == "asentmax":
        add_asentmax_scalers(m, init="reference")
    ids, _ = _batch(pad=0)
    with _attention_calls() as calls:
        got = _generate(m, ids, None, 4, "static")
    assert [c["Nk"] for c in calls[:: m.config.num_hidden_layers]] == [10, 11, 12, 13]
    assert all(c.get("attn_mask") is None and c.get("key_start") is None and c.get("key_end") is None for c in calls)
    with _dense_masks():
        want = _generate(m, ids, None, 4, "static")
    _assert_same_decoding(got, want)


@pytest.mark.parametrize("build", [_llama, _gemma2], ids=["llama", "gemma2"])
def test_packed_sequences_fall_back_to_the_dense_mask_with_one_warning(build):
    m = _converted(build)
    ids, _ = _batch(pad=0)
    packed = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]]).expand(2, -1)
    hf._WARNED.clear()
    with _attention_calls() as calls, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = m(ids, position_ids=packed, use_cache=False).logits
            again = m(ids, position_ids=packed, use_cache=False).logits
    said = [str(w.message) for w in caught if issubclass(w.category, hf.HFDenseMaskWarning)]
    assert len(said) == 1 and "packed sequences" in said[0], said
    # it names the backend explain_attention gives the call, and why not triton
    assert re.search(r"explain_attention gives it to (chunked|reference) \(.+\), not triton \(.+\);", said[0]), said
    assert calls and all(c["attn_mask"].shape == (2, 1, 10, 10) and not c["is_causal"] for c in calls)
    assert torch.equal(got, again)
    with torch.no_grad():  # each packed sequence equals itself alone (no mixing across the boundaries)
        alone = m(ids[:, 4:7], position_ids=packed[:, 4:7], use_cache=False).logits
    torch.testing.assert_close(got[:, 4:7], alone, atol=1e-5, rtol=1e-5)


def test_gemma2_sliding_layers_keep_the_dense_mask_and_no_unread_mask_is_built():
    ids, mask = _padded_batch("left")
    sliding = _gemma2("entmax", attn_logit_softcapping=None, sliding_window=4)  # layer 0 slides, layer 1 is full
    hf._WARNED.clear()
    with _attention_calls() as calls, pytest.warns(hf.HFDenseMaskWarning, match="sliding-window layer"):
        with torch.no_grad():
            sliding(ids, attention_mask=mask)
    assert calls[0]["attn_mask"] is not None and calls[1].get("attn_mask") is None
    # after apply_papers_config every layer is full: the sliding mask Gemma-2 asks for is not built
    full = _converted(_gemma2)
    built = []
    import transformers.masking_utils as mu

    original = mu.sdpa_mask  # the adapter imports it at each call
    mu.sdpa_mask = lambda *a, **kw: built.append(kw) or original(*a, **kw)
    try:
        with torch.no_grad():
            full(ids, attention_mask=mask)
    finally:
        mu.sdpa_mask = original
    assert built == []
    assert hf.hf_attention_mask(3, 10, 10, local_size=4, config=full.config) is hf._UNREAD
    with pytest.raises(ValueError, match="config.layer_types"):
        hf._hf_attention(full.model.layers[0].self_attn, *torch.randn(3, 1, 4, 10, 16).unbind(0), hf._UNREAD)


def test_a_2d_mask_from_elsewhere_is_checked():
    """A 2-D mask that hf_attention_mask did not build (no key ranges attached): one run per row goes as key
    ranges, any other padding as a (B, 1, 1, S) mask, with the warning."""
    m = _llama("entmax")
    attn = m.model.layers[0].self_attn
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 4, 16, generator=g)  # B 2, 4 heads, 4 queries at the last of 6 keys
    k, v = torch.randn(2, 2, 2, 6, 16, generator=g).unbind(0)
    one_run = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    gaps = torch.tensor([[1, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    hf._WARNED.clear()
    with _attention_calls() as calls:
        got = hf._hf_attention(attn, q, k, v, one_run)[0]
        with pytest.warns(hf.HFDenseMaskWarning, match="more than one run"):
            hf._hf_attention(attn, q, k, v, gaps)
    assert torch.equal(calls[0]["key_start"], torch.tensor([2, 0])) and torch.equal(
        calls[0]["key_end"], torch.tensor([6, 4])
    )
    assert calls[1]["attn_mask"].shape == (2, 1, 1, 6) and calls[1]["is_causal"]
    dense = one_run[:, None, None, :] & torch.ones(4, 6, dtype=torch.bool).tril(2)
    with pytest.warns(hf.HFDenseMaskWarning, match="4-D mask given by the caller"):
        want = hf._hf_attention(attn, q, k, v, dense)[0]
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="covers 7 keys, the cache holds 6"):
        hf._hf_attention(attn, q, k, v, torch.ones(2, 7, dtype=torch.bool))


def test_papers_config_names_the_attention_backend(tmp_path):
    with pytest.raises(ValueError, match="unknown attention backend 'fast'"):
        apply_papers_config(_llama(), backend="fast")
    assert "backend" not in apply_papers_config(_llama()).config.longsparse  # auto: nothing stored
    m = apply_papers_config(_llama(), backend="reference")
    ids, mask = _padded_batch("left")
    with _attention_calls() as calls, torch.no_grad():
        m(ids, attention_mask=mask)
    assert [c["backend"] for c in calls] == ["reference"] * 2
    m.save_pretrained(tmp_path)
    back = from_pretrained(tmp_path)
    assert back.config.longsparse["backend"] == "reference"
    back.config.longsparse["backend"] = "auto"  # read at every call
    with _attention_calls() as calls, torch.no_grad():
        back(ids, attention_mask=mask)
    assert [c["backend"] for c in calls] == ["auto"] * 2


def test_autocast_gives_attention_one_dtype():
    """Under autocast q and k leave the NoPE / rotary multiply in float32 and v in bfloat16; the kernels take
    one dtype, so the adapter casts all three to the autocast dtype (as SDPA gets them)."""
    m = _converted(_llama)
    ids, mask = _padded_batch("both")
    with torch.no_grad():
        want = m(ids, attention_mask=mask).logits
        with _attention_calls() as calls, torch.autocast("cpu", dtype=torch.bfloat16):
            got = m(ids, attention_mask=mask).logits
    assert [c["dtypes"] for c in calls] == [{torch.bfloat16}] * 2
    real = mask.bool()
    torch.testing.assert_close(got.float()[real], want[real], atol=0.1, rtol=0.05)


def test_traced_mask_builder_keeps_the_causal_skip_and_falls_back_for_padding(monkeypatch):
    """The mask builder as torch.compile traces it (is_compiling() True; the slow test below compiles): no
    padding with a dynamic cache gives no mask, padding the dense mask with the reason, outputs unchanged."""
    m = _converted(_llama)
    ids, mask = _padded_batch("right")
    with torch.no_grad():
        want, want_padded = m(ids).logits, m(ids, attention_mask=mask).logits
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    hf._WARNED.clear()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _attention_calls() as calls:
            got = m(ids).logits
        assert [(c.get("attn_mask"), c["is_causal"]) for c in calls] == [(None, True)] * 2
        with _attention_calls() as calls:
            got_padded = m(ids, attention_mask=mask).logits
    assert all(c["attn_mask"] is not None and not c["is_causal"] for c in calls)
    assert [str(w.message).count("traced by torch.compile") for w in caught] == [1]
    torch.testing.assert_close(got, want)
    real = mask.bool()
    torch.testing.assert_close(got_padded[real], want_padded[real])


@pytest.mark.slow
def test_compiled_model_keeps_the_causal_skip_and_falls_back_for_padding():
    """Traced by torch.compile, whether padding is one run per row cannot be checked: a padded batch takes the
    dense mask (same outputs), while a batch without padding through a dynamic cache needs no check and keeps
    is_causal with no mask. (Without a cache transformers wraps the mask function for packed sequences whenever
    it is traced, so that batch is dense too.)"""
    m = _converted(lambda: _llama(num_hidden_layers=1))  # dynamo traces each layer: one keeps the test short
    ids, mask = _padded_batch("right")
    compiled = torch.compile(m, backend="eager")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", hf.HFDenseMaskWarning)
        with _attention_calls() as calls:
            got = compiled(ids).logits
        assert [(c.get("attn_mask"), c["is_causal"]) for c in calls] == [(None, True)]
        torch.testing.assert_close(got, m(ids).logits)
        with _attention_calls() as calls:
            got = compiled(ids, attention_mask=mask).logits
        assert len(calls) == 1 and calls[0]["attn_mask"] is not None and not calls[0]["is_causal"]
        real = mask.bool()
        torch.testing.assert_close(got[real], m(ids, attention_mask=mask).logits[real])
