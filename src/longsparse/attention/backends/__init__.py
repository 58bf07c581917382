"""The named attention backends, one module each: its capabilities as data (`Capabilities`, checked by
`attention/capabilities.py`'s `check`, rendered as the table in docs/architecture.md) and how it runs an
`AttentionCall`. Every backend is tested equal to `reference` (values and gradients) by tests/unit/attention/test_backends.py,
over every registered backend: registering one enrols it.

    reference   all logits at once, autograd differentiates everything (also α, ALiBi slopes, a float mask)
    chunked     query blocks with a recomputing backward, pure PyTorch: O(block × Nk) memory, any mapping
    fused_cpu   the C++ kernel, flash-style: key tiles with scale, ALiBi and causal mask, α-entmax solved per
                row, p·v gathered from the support, recomputing backward (CPU)
    fused_dense the kernel's in-place scores pass on all logits at once, p kept for the backward (no recompute):
                short rows with a gradient
    sdpa        torch SDPA for softmax-form mappings: softmax; top-k and adaptive temperature after a
                no-grad pass over the logits (the kept set / θ enter SDPA's mask and q)
    triton      α-entmax flash attention in Triton (attention/triton_entmax.py): CUDA, or CPU tensors
                in Triton's interpreter (TRITON_INTERPRET=1) when named
    adasplash   the adasplash package's α-entmax kernels (CUDA); opt-in, see attention/cuda.py
    flex        torch FlexAttention, compiled, for softmax and adaptive temperature (attention/flex.py):
                ALiBi, causal offsets and key ranges inside the fused kernel (CUDA; CPU inference)

Key ranges (``key_start`` / ``key_end`` of the call, left / right padding): a backend whose capabilities say
``key_ranges=True`` reads them itself; every other one is checked and run with the call's ranges folded into
``attn_mask`` (`AttentionCall.with_key_ranges_as_mask`, a (B, 1, 1, Nk) bool mask built once per call). A
backend that takes no mask then refuses the call, and its reason says that the key ranges became a mask.
"""

from longsparse.attention.backends import adasplash, chunked, flex, fused, reference, sdpa, triton
from longsparse.attention.backends.registry import BACKENDS, Backend, capability_table, register
from longsparse.attention.capabilities import Capabilities, check

for _backend in (
    reference.BACKEND,
    chunked.BACKEND,
    fused.FUSED_CPU,
    fused.FUSED_DENSE,
    sdpa.BACKEND,
    triton.BACKEND,
    adasplash.BACKEND,
    flex.BACKEND,
):
    register(_backend)

__all__ = ["BACKENDS", "Backend", "Capabilities", "capability_table", "check", "register"]
