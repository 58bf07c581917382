"""Positions and length scalers against float64 brute-force formulas."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers.configs import decoder_section

from longsparse.nn import (
    ASEntmaxScaler,
    ModelConfig,
    RoPE,
    SSMaxScaler,
    StaticASEntmaxScaler,
    Transformer,
    alibi_slopes,
    capture,
    nape_slopes,
    position_setup,
)
from longsparse.nn.scalers import softplus_inverse

torch.set_default_dtype(torch.float32)


def test_rope_matches_complex_rotation():
    torch.manual_seed(0)
    D, theta = 8, 500.0
    x = torch.randn(2, 3, 5, D, dtype=torch.float64)
    pos = torch.tensor([[0, 1, 2, 7, 100], [3, 3, 4, 9, 12345]])
    got = RoPE(D, theta)(x, pos)
    freqs = theta ** (-torch.arange(D // 2, dtype=torch.float64) * 2 / D)
    c = torch.complex(x[..., : D // 2], x[..., D // 2 :])
    rot = c * torch.exp(1j * pos[:, None, :, None].double() * freqs)
    want = torch.cat([rot.real, rot.imag], -1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    # relative: q_i·k_j depends only on i − j
    r = RoPE(D)
    q, k = torch.randn(1, 1, 1, D, dtype=torch.float64), torch.randn(1, 1, 1, D, dtype=torch.float64)
    a = (r(q, torch.tensor([[10]])) * r(k, torch.tensor([[4]]))).sum()
    b = (r(q, torch.tensor([[1006]])) * r(k, torch.tensor([[1000]]))).sum()
    assert abs(a - b) < 1e-9


def test_alibi_and_nape_slopes_and_scaled_heads():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2 ** (-h) for h in range(1, 9)], dtype=torch.float32))
    s, sc = position_setup("nape", 8)
    assert torch.allclose(s, torch.tensor([1, 1 / 2, 1 / 3, 1 / 4, 0, 0, 0, 0]))
    assert sc.tolist() == [False] * 4 + [True] * 4
    s, _ = position_setup("nape", 4, "geometric")
    assert torch.allclose(s, torch.tensor([1, 0.5, 0, 0]))
    for p in ("nope", "rope"):
        s, sc = position_setup(p, 4)
        assert s is None and sc.all()
    s, sc = position_setup("alibi", 4)
    assert sc.all() and (s > 0).all()
    with pytest.raises(ValueError, match="even"):
        nape_slopes(3)
    with pytest.raises(ValueError, match="unknown positions"):
        position_setup("xpos", 4)


def test_ssmax_scale_formula():
    sc = SSMaxScaler(torch.tensor([True, False, True]))
    with torch.no_grad():
        sc.beta.copy_(torch.tensor([0.5, 2.0]))
    pos = torch.tensor([[0, 1, 5, 1000]])
    got = sc(torch.zeros(1, 4, 3, dtype=torch.float64), pos)
    lp = torch.log(pos.double() + 2)
    want = torch.stack([0.5 * lp[0], torch.ones(4, dtype=torch.float64), 2.0 * lp[0]])[None]
    torch.testing.assert_close(got, want)


def test_asentmax_scale_formula_and_inits():
    torch.manual_seed(0)
    d = 6
    scal = torch.tensor([False, True, True])
    sc = ASEntmaxScaler(d, scal, init="reference").double()
    h = torch.randn(2, 5, d, dtype=torch.float64)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 70, 700, 7000, 70000]])
    got = sc(h, pos).detach()
    Wb, bb, Wg, bg = (
        t.detach() for t in (sc.beta_proj.weight, sc.beta_proj.bias, sc.gamma_proj.weight, sc.gamma_proj.bias)
    )
    _unused = sc.beta_proj.weight, sc.beta_proj.bias, sc.gamma_proj.weight, sc.gamma_proj.bias
    want = torch.ones(2, 3, 5, dtype=torch.float64)
    for b in range(2):
        for i in range(5):
            for j, head in enumerate([1, 2]):
                beta = math.log1p(math.exp(float(h[b, i] @ Wb[j] + bb[j])))
                gamma = 2 * math.tanh(float(h[b, i] @ Wg[j] + bg[j]))
                want[b, head, i] = 1 + beta * math.log(pos[b, i] + 2) ** gamma
    torch.testing.assert_close(got, want)
    assert sc.beta_proj.weight.std().item() == pytest.approx(0.02, rel=0.5) and (sc.beta_proj.bias == 0).all()
    aware = ASEntmaxScaler(d, torch.ones(3, dtype=torch.bool))
    assert aware.init == "scale_aware" and (aware.beta_proj.weight == 0).all()
    assert F.softplus(aware.beta_proj.bias).allclose(torch.full((3,), 0.05))
    s = aware(torch.randn(1, 4, d), torch.tensor([[0, 10, 100, 10000]]))
    assert torch.allclose(s, torch.full_like(s, 1.05))
    assert softplus_inverse(0.05) == pytest.approx(math.log(math.expm1(0.05)))


def test_asentmax_scaler_gradients_match_the_formula():
    """The scaler computes both projections as one product; its gradients (h and both projections) equal those
    of the formula with each projection on its own (float64 autograd)."""
    torch.manual_seed(0)
    d = 6
    sc = ASEntmaxScaler(d, torch.tensor([False, True, True]), init="reference").double()
    h = torch.randn(2, 5, d, dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 70, 700, 7000, 70000]])
    up = torch.randn(2, 3, 5, dtype=torch.float64)
    (sc(h, pos) * up).sum().backward()
    params = [sc.beta_proj.weight, sc.beta_proj.bias, sc.gamma_proj.weight, sc.gamma_proj.bias]
    h2 = h.detach().clone().requires_grad_()
    Wb, bb, Wg, bg = (t.detach().clone().requires_grad_() for t in params)
    beta = F.softplus(h2 @ Wb.T + bb)
    gamma = 2 * torch.tanh(h2 @ Wg.T + bg)
    scaled = (1 + beta * torch.log(pos.double() + 2).unsqueeze(-1) ** gamma).transpose(1, 2)  # (B, 2, N)
    want = torch.cat((torch.ones(2, 1, 5, dtype=torch.float64), scaled), dim=1)
    (want * up).sum().backward()
    for got, ref in zip([h.grad] + [t.grad for t in params], [h2.grad, Wb.grad, bb.grad, Wg.grad, bg.grad]):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_static_asentmax_scale_formula():
    sc = StaticASEntmaxScaler(torch.tensor([True, True]), init="scale_aware").double()
    with torch.no_grad():
        sc.beta_bias.copy_(torch.tensor([0.3, -1.0]))
        sc.gamma_bias.copy_(torch.tensor([0.2, -0.4]))
    pos = torch.tensor([[0, 3, 99]])
    got = sc(None, pos).detach()
    sc.requires_grad_(False)
    for hd in range(2):
        beta = math.log1p(math.exp(float(sc.beta_bias[hd])))
        gamma = 2 * math.tanh(float(sc.gamma_bias[hd]))
        for i, p in enumerate([0, 3, 99]):
            assert got[0, hd, i].item() == pytest.approx(1 + beta * math.log(p + 2) ** gamma, rel=1e-12)


@pytest.mark.parametrize("positions", ["nope", "rope", "alibi", "nape"])
@pytest.mark.parametrize("method", ["ssmax", "asentmax"])
def test_attention_map_matches_bruteforce(method, positions):
    """The layer's attention map = mapping((s_i q_i)·k_j/√d − m_h(i − j)), scale only on the scalable heads."""
    torch.manual_seed(1)
    cfg = ModelConfig.from_dict(
        decoder_section(
            vocab_size=11,
            d_model=16,
            n_layers=1,
            n_heads=4,
            d_ff=32,
            method=method,
            positions=positions,
            asentmax_init="reference",
        )
    )
    model = Transformer(cfg).double()
    ids = torch.randint(0, 11, (1, 9))
    with capture(model, what=("attn", "scale")) as cap:
        model(ids)
    attn = model.blocks[0].attn
    h = model.blocks[0].pre_attn_norm(model.embed(ids) * math.sqrt(16))
    q = attn.q_proj(h).view(1, 9, 4, 4).transpose(1, 2)
    k = attn.k_proj(h).view(1, 9, 4, 4).transpose(1, 2)
    pos = torch.arange(9)
    if positions == "rope":
        q, k = attn.rope(q, pos), attn.rope(k, pos)
    slopes, scalable = position_setup(positions, 4)
    lp = torch.log(pos.double() + 2)
    if method == "ssmax":
        s = torch.ones(4, 9, dtype=torch.float64) * lp  # β = 1 at init
    else:
        sc = attn.scaler
        Hs = int(scalable.sum())
        beta = F.softplus(h @ sc.beta_proj.weight.T + sc.beta_proj.bias)[0].T  # (Hs, 9)
        gamma = 2 * torch.tanh(h @ sc.gamma_proj.weight.T + sc.gamma_proj.bias)[0].T
        s = 1 + beta * lp**gamma
        assert s.shape == (Hs, 9)
    full = torch.ones(4, 9, dtype=torch.float64)
    full[scalable] = s.detach() if method == "asentmax" else s[scalable]
    torch.testing.assert_close(cap[0]["scale"][0].double(), full.float().double(), atol=1e-6, rtol=1e-6)
    z = (q[0] * full[..., None]) @ k[0].transpose(-1, -2) / 2.0
    if slopes is not None:
        z = z - slopes.double()[:, None, None] * (pos[:, None] - pos[None, :]).double()
    z = z.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    if method == "ssmax":
        p = torch.softmax(z, -1)
    else:
        from entmax import entmax15

        p = entmax15(z, dim=-1)
    torch.testing.assert_close(cap[0]["attn"][0].double(), p.detach(), atol=1e-6, rtol=1e-5)
