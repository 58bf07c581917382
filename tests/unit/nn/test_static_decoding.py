"""Greedy decoding with a static KV cache (`Transformer.decode_step`, `generate(static_cache=True)`): the same
logits and tokens as the dynamic KV cache and the full forward, over every method × position; its step traced by
torch.compile(fullgraph=True) (the CPU stand-in for a CUDA graph: no host sync, no branch on device values); the
one-line refusals of cuda_graph on CPU tensors, of HSA models and of what the static cache cannot take."""

import os
import sys

# the triton case below runs in Triton's interpreter on CPU, which must be chosen before triton is imported:
# flipped later, it breaks the kernels of every other test module in the run
if "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from helpers.configs import decoder_section, tiny_hsa

from longsparse.nn import METHODS, POSITIONS, ModelConfig, StaticKVCache, Transformer

V = 64
COMBOS = [(m, p) for m in METHODS for p in POSITIONS]


def tiny(method, positions, **kw):
    base = dict(vocab_size=V, d_model=32, n_layers=2, n_heads=4, d_ff=64, method=method, positions=positions, topk=4)
    # input-dependent ASEntmax scales (the scale-aware init starts them all at ≈ 1.05)
    base.update(asentmax_init="reference")
    base.update(kw)
    return ModelConfig.from_dict(decoder_section(**base))


def left_padded(pads, n, seed=1):
    """(ids (B, n), mask (B, n) bool) with pads[b] pads before row b's real tokens."""
    ids = torch.randint(0, V, (len(pads), n), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(len(pads), n, dtype=torch.bool)
    for b, s in enumerate(pads):
        mask[b, :s] = False
    return ids, mask


def static_cache(model, ids, mask, new_tokens):
    """A static cache holding the prompt, with room for ``new_tokens`` more, and the prompt's last logits."""
    cache = model.new_cache()
    logits = model(ids, attention_mask=mask, cache=cache, logits_for="last")[:, -1]
    return StaticKVCache.from_prefill(cache, ids.shape[1] + new_tokens), logits


@pytest.mark.parametrize("method,positions", COMBOS)
def test_static_steps_equal_the_dynamic_cache_and_the_full_forward(method, positions):
    """Teacher-forced through a left-padded batch (rows of 10, 7 and 3 real tokens): every step's logits of the
    static cache equal the dynamic cache's and the full forward's at that position (float64); the greedy tokens
    of generate(static_cache=True) equal the dynamic cache's and the full forward's."""
    torch.manual_seed(0)
    model = Transformer(tiny(method, positions)).double().eval()
    ids, mask = left_padded((0, 3, 7), 10)
    follow = torch.stack([torch.randperm(V)[:6] for _ in range(3)])  # distinct tokens: no exact top-k ties
    with torch.no_grad():
        static, first = static_cache(model, ids, mask, follow.shape[1])
        dynamic = model.new_cache()
        want = [model(ids, attention_mask=mask, cache=dynamic, logits_for="last")[:, -1]]
        got = [first]
        for t in range(follow.shape[1]):
            want.append(model(follow[:, t : t + 1], cache=dynamic, logits_for="last")[:, -1])
            got.append(model.decode_step(follow[:, t : t + 1], static))
        full_mask = torch.cat((mask, torch.ones_like(follow, dtype=torch.bool)), 1)
        full = model(torch.cat((ids, follow), 1), attention_mask=full_mask)[:, ids.shape[1] - 1 :]
    got, want = torch.stack(got, 1), torch.stack(want, 1)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(got, full, atol=1e-10, rtol=1e-10)
    assert torch.equal(static.next_pos, mask.sum(1) + follow.shape[1])  # positions advanced on the device
    assert static.slot.tolist() == [10 + follow.shape[1]] and static.capacity == 10 + follow.shape[1]
    if method == "topk" and positions in ("nope", "nape"):
        return  # greedy tokens repeat, and NoPE heads' tied top-k logits are decided by 1-ulp differences
    dyn = model.generate(ids, 7, attention_mask=mask)
    assert torch.equal(model.generate(ids, 7, attention_mask=mask, static_cache=True), dyn)
    assert torch.equal(model.generate(ids, 7, attention_mask=mask, use_cache=False), dyn)


@pytest.mark.parametrize("max_new_tokens", [0, 1, 2, 9])
def test_static_generation_lengths_and_eos_equal_the_dynamic_cache(max_new_tokens):
    """max_new_tokens 0 / 1 (no step: the prompt's logits) / 2 / 9; with eos_id the rows that emitted it are
    filled with it as with the dynamic cache; a left-padded row gives what it gives alone."""
    torch.manual_seed(2)
    model = Transformer(tiny("asentmax", "nape")).double()
    ids, mask = left_padded((4, 0), 9, seed=3)
    free = model.generate(ids, max_new_tokens, attention_mask=mask)
    static = model.generate(ids, max_new_tokens, attention_mask=mask, static_cache=True)
    assert static.shape == (2, max_new_tokens) and torch.equal(static, free)
    assert torch.equal(static[:1], model.generate(ids[:1, 4:], max_new_tokens, static_cache=True))
    if max_new_tokens < 2:
        return
    for eos in {int(free[0, 1]), int(free[1, 0])}:
        out = model.generate(ids, max_new_tokens, attention_mask=mask, eos_id=eos, static_cache=True)
        assert torch.equal(out, model.generate(ids, max_new_tokens, attention_mask=mask, eos_id=eos))
        for row, tokens in zip(out, free.tolist()):
            first = tokens.index(eos) if eos in tokens else max_new_tokens
            assert row[: first + 1].tolist() == tokens[: first + 1] and (row[first:] == eos).all()


def test_restored_counters_undo_steps():
    """A CUDA graph's warm-up steps are undone by `restore` (`CapturedStep`): the steps after it give the logits
    they give without the warm-up."""
    torch.manual_seed(4)
    model = Transformer(tiny("entmax", "rope")).double().eval()
    ids, mask = left_padded((2, 0), 6, seed=5)
    follow = torch.randint(0, V, (2, 3))
    with torch.no_grad():
        plain, _ = static_cache(model, ids, mask, 3)
        want = [model.decode_step(follow[:, t : t + 1], plain) for t in range(3)]
        warmed, _ = static_cache(model, ids, mask, 3)
        saved = warmed.counters()
        for _ in range(2):
            model.decode_step(torch.zeros_like(follow[:, :1]), warmed)
            warmed.restore(saved)
        got = [model.decode_step(follow[:, t : t + 1], warmed) for t in range(3)]
    for a, b in zip(got, want):
        assert torch.equal(a, b)


COMPILED = [
    # ~20 s: the Triton interpreter runs every kernel launch of the prefill and the steps
    pytest.param("asentmax", "nape", "triton", torch.float32, id="asentmax-nape-triton", marks=pytest.mark.slow),
    pytest.param("ssmax", "rope", "sdpa", torch.float64, id="ssmax-rope-sdpa"),
]


@pytest.mark.parametrize("method,positions,backend,dtype", COMPILED)
def test_decode_step_compiles_as_one_graph(method, positions, backend, dtype):
    """torch.compile(fullgraph=True) traces `decode_step` whole (a graph break raises): no host sync and no
    Python branch on device values, on the backends CUDA's auto policy gives a decoding step (triton for the
    entmax methods, sdpa for the softmax ones; triton here in its interpreter); its logits equal eager mode's."""
    if backend == "triton":
        pytest.importorskip("triton", reason="triton is not installed")
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("triton was imported before this module could choose its interpreter (TRITON_INTERPRET=1)")
    torch.manual_seed(5)
    cfg = tiny(method, positions, n_heads=2, attn_backend=backend)  # head dim 16: a size the kernels take
    model = Transformer(cfg).to(dtype).eval()
    ids, mask = left_padded((3, 0), 8, seed=6)
    follow = torch.randint(0, V, (2, 3))
    torch._dynamo.reset()
    step = torch.compile(model.decode_step, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        eager, _ = static_cache(model, ids, mask, 3)
        compiled, _ = static_cache(model, ids, mask, 3)
        for t in range(3):
            want = model.decode_step(follow[:, t : t + 1], eager)
            torch.testing.assert_close(step(follow[:, t : t + 1], compiled), want, atol=1e-6, rtol=1e-6)
    assert torch.equal(compiled.key_end, eager.key_end) and torch.equal(compiled.next_pos, eager.next_pos)


def test_bad_static_decoding_input_is_a_one_line_error():
    torch.manual_seed(6)
    model = Transformer(tiny("entmax", "nape")).double()
    ids, mask = left_padded((2, 0), 6, seed=7)
    cases = [
        (dict(cuda_graph=True), "cuda_graph=True needs CUDA tensors: the model and prompt are on cpu"),
        (dict(static_cache=True, use_cache=False), "static_cache=True decodes with a cache; use_cache=False"),
        (dict(static_cache=True, attention_mask=mask.flip(1)), "the static cache takes left-padded prompts"),
    ]
    for kw, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            model.generate(ids, 3, **{"attention_mask": mask, **kw})
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        model.generate(ids, 0, cuda_graph=True)  # refused before anything is decoded, whatever the length
    static, _ = static_cache(model, ids, mask, 2)
    with pytest.raises(ValueError, match=r"token_ids must have shape \(2, 1\), got \(2, 2\)"):
        model.decode_step(ids[:, :2], static)
    with pytest.raises(ValueError, match="the static cache is for inference: run its decoding steps under"):
        model.decode_step(ids[:, :1], static)  # grad enabled, the model's parameters require it


def test_hsa_refuses_static_decoding_with_its_reason():
    from longsparse.hsa import HSAModel

    model = HSAModel(tiny_hsa())
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 9))
    for option in ("static_cache", "cuda_graph"):
        with pytest.raises(ValueError, match=f"HSAModel cannot decode with {option}=True: HSA decodes through its"):
            model.generate(prompt, 2, **{option: True})
