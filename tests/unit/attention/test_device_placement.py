"""Tensors made inside the library follow their inputs' device.

Without a GPU these tests make the *default* device "meta" while every input lives on the CPU: a tensor that
the code creates without ``device=`` then lands on meta, and mixing it with the CPU inputs raises, as a CPU
tensor mixed with CUDA inputs does on a GPU. The results must equal those computed without the trick.
"""

import dataclasses

import pytest
import torch

import longsparse as ls
from longsparse.attention import BACKENDS
from longsparse.attention.call import make_call
from longsparse.nn import METHODS, POSITIONS, ModelConfig
from longsparse.nn.model import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")

MAPPINGS = [("softmax", {}), ("entmax", {"alpha": 1.5}), ("sparsemax", {}), ("topk", {"topk": 8}), ("adatemp", {})]


def _attention_and_grads(q, k, v, **kw):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = ls.attention(q, k, v, **kw)
    out.backward(torch.ones_like(out))
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.mark.parametrize("mapping,extra", MAPPINGS)
@pytest.mark.parametrize("bias", ["none", "alibi", "q_scale"])
@pytest.mark.parametrize("backend", ["auto", *(name for name in BACKENDS if name not in ("triton", "adasplash"))])
def test_attention_makes_nothing_on_the_default_device(mapping, extra, bias, backend):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 80, 16, generator=g) for _ in range(3))
    if bias == "alibi":
        extra = {**extra, "alibi_slopes": torch.tensor([0.5, 0.25, 0.0, 0.0])}
    elif bias == "q_scale":
        extra = {**extra, "q_scale": 0.5 + torch.rand(2, 4, 80, generator=g)}
    if backend != "auto":
        grad_qkv = (t.detach().requires_grad_() for t in (q, k, v))  # the call _attention_and_grads makes
        reason = BACKENDS[backend].supports(make_call(*grad_qkv, mapping=mapping, **extra))
        if reason is not None:
            pytest.skip(f"{backend}: {reason}")
    want = _attention_and_grads(q, k, v, mapping=mapping, backend=backend, **extra)
    with torch.device("meta"):  # the default device inside the block
        got = _attention_and_grads(q, k, v, mapping=mapping, backend=backend, **extra)
    for a, b in zip(got, want):
        assert a.device.type == "cpu"
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("positions", POSITIONS)
def test_model_makes_nothing_on_the_default_device(method, positions):
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig.from_dict(
            dict(
                vocab_size=50,
                d_model=32,
                n_heads=4,
                n_layers=2,
                d_ff=64,
                attention=dict(method=method, positions=positions),
            )
        )
    )
    x = torch.randint(0, 50, (2, 40))
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 30:] = False
    long_x = torch.randint(0, 50, (1, 300))  # no gradient: the chunked attention path
    want = model(x, attention_mask=mask)
    with torch.no_grad():
        want_long = model(long_x)
    with torch.device("meta"):  # the default device inside the block
        got = model(x, attention_mask=mask)
        got.backward(torch.ones_like(got))
        with torch.no_grad():
            got_long = model(long_x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_long, want_long)


def test_fused_cpu_kernel_is_never_chosen_for_other_devices():
    # the kernel reads raw data pointers: given CUDA tensors it crashed the process (segmentation fault)
    q = torch.randn(1, 2, 8, 4)
    call = make_call(q, q, q)
    for device_type in ("cuda", "meta"):
        reason = BACKENDS["fused_cpu"].supports(dataclasses.replace(call, device_type=device_type))
        assert reason is not None and device_type in reason
