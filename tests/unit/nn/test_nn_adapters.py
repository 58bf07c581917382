"""Checkpoints and the nn.MultiheadAttention-style module (the transformers adapter: tests/unit/nn/test_hf.py)."""

import pytest
import torch
from helpers.configs import decoder_section

from longsparse.models import load_checkpoint, read_checkpoint, save_checkpoint
from longsparse.nn import EntmaxMultiheadAttention, ModelConfig, Transformer


def _model(**kw):
    cfg = dict(vocab_size=13, d_model=16, n_layers=2, n_heads=2, d_ff=32, method="asentmax", positions="nape")
    cfg.update(kw)
    return Transformer(ModelConfig.from_dict(decoder_section(**cfg)))


def test_checkpoint_roundtrip(tmp_path):
    torch.manual_seed(0)
    m = _model(learn_alpha=True)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randint(0, 13, (2, 6))).sum().backward()
    opt.step()
    path = tmp_path / "ck.pt"
    save_checkpoint(path, m, optimizer=opt, extra={"step": 7, "note": "x"})
    opt2 = torch.optim.AdamW(_model().parameters(), lr=1e-3)
    m2, extra = load_checkpoint(path, optimizer=None)
    assert extra == {"step": 7, "note": "x"} and m2.cfg == m.cfg
    m3 = _model(learn_alpha=True)
    opt3 = torch.optim.AdamW(m3.parameters(), lr=1e-3)
    load_checkpoint(path, model=m3, optimizer=opt3)
    assert opt3.state_dict()["state"][0]["step"] == 1
    ids = torch.randint(0, 13, (2, 9))
    torch.testing.assert_close(m2(ids), m(ids))
    torch.testing.assert_close(m3(ids), m(ids))
    assert opt2 is not None


def test_checkpoint_never_overwrites_silently(tmp_path):
    m = _model()
    path = tmp_path / "ck.pt"
    save_checkpoint(path, m)
    with pytest.raises(FileExistsError):
        save_checkpoint(path, m)
    save_checkpoint(path, m, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"]  # no temp files left behind


def test_checkpoint_corrupt_and_mismatch(tmp_path):
    m = _model()
    path = tmp_path / "ck.pt"
    save_checkpoint(path, m)
    data = path.read_bytes()
    bad = tmp_path / "truncated.pt"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated.pt"):
        load_checkpoint(bad)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="junk.pt"):
        load_checkpoint(junk)
    other = tmp_path / "plain.pt"
    torch.save({"a": torch.zeros(1)}, other)
    with pytest.raises(ValueError, match="not a longsparse checkpoint"):
        read_checkpoint(other)
    with pytest.raises(ValueError, match="config differs"):
        load_checkpoint(path, model=_model(d_model=32))
    payload = read_checkpoint(path)
    payload["config"]["d_model"] = 32
    wrong = tmp_path / "wrong.pt"
    torch.save(payload, wrong)
    with pytest.raises(ValueError, match="wrong.pt.*do not match"):
        load_checkpoint(wrong)


def test_mha_softmax_matches_torch():
    torch.manual_seed(0)
    E, H = 16, 4
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True)
    ours = EntmaxMultiheadAttention(E, H, batch_first=True, mapping="softmax")
    w, b = ref.in_proj_weight.detach(), ref.in_proj_bias.detach()
    with torch.no_grad():
        for i, lin in enumerate((ours.q_proj, ours.k_proj, ours.v_proj)):
            lin.weight.copy_(w[i * E : (i + 1) * E])
            lin.bias.copy_(b[i * E : (i + 1) * E])
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        ours.out_proj.bias.copy_(ref.out_proj.bias)
    q, kv = torch.randn(2, 5, E), torch.randn(2, 7, E)
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[0, 5:] = True
    am = torch.zeros(5, 7, dtype=torch.bool)
    am[0, 3] = True
    o1, w1 = ref(q, kv, kv, key_padding_mask=kpm, attn_mask=am)
    o2, w2 = ours(q, kv, kv, key_padding_mask=kpm, attn_mask=am)
    torch.testing.assert_close(o2, o1, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(w2, w1, atol=1e-5, rtol=1e-4)
    o3, w3 = ours(q, kv, kv, key_padding_mask=kpm, attn_mask=am, need_weights=False)
    assert w3 is None
    torch.testing.assert_close(o3, o1, atol=1e-5, rtol=1e-4)


def test_mha_entmax_is_sparse_and_causal():
    torch.manual_seed(0)
    mha = EntmaxMultiheadAttention(16, 2, alpha=1.5)
    x = torch.randn(3, 9, 16) * 3
    out, w = mha(x, x, x, is_causal=True, average_attn_weights=False)
    assert out.shape == (3, 9, 16) and w.shape == (3, 2, 9, 9)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 2, 9))
    assert (w.triu(1) == 0).all() and (w.tril() == 0).any()
    out.sum().backward()
    assert torch.isfinite(mha.q_proj.weight.grad).all()
    seq_first = EntmaxMultiheadAttention(16, 2, batch_first=False)
    o, _ = seq_first(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1))
    assert o.shape == (9, 3, 16)
