"""The backends of the C++ CPU kernel: `fused_cpu`, flash-style (key tiles with scale, ALiBi, causal mask and
key ranges, α-entmax solved per row, p·v gathered from the support, recomputing backward; attention/chunked.py),
and `fused_dense`, the kernel's in-place scores pass on all logits at once with p kept for the backward (no
recompute; attention/fused_dense.py): short rows with a gradient."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from longsparse import cpu_kernel
from longsparse.attention.backends.registry import Backend
from longsparse.attention.call import AttentionCall
from longsparse.attention.capabilities import ALPHA_ENTMAX, Capabilities
from longsparse.attention.chunked import fused_attention
from longsparse.attention.fused_dense import fused_dense_attention

DENSE_CAPABILITIES = Capabilities(
    devices=("cpu",),
    mappings=ALPHA_ENTMAX,
    alpha_tensor="per_head",
    attn_mask=False,
    notes={
        "devices": "the kernel reads CPU memory only",
        "mappings": "the kernel solves α-entmax rows",
        "attn_mask": "the kernel applies only the causal mask",
    },
)
# the flash-style kernel also reads key ranges itself, and takes one head dim for q, k and v
CPU_CAPABILITIES = replace(
    DENSE_CAPABILITIES,
    key_ranges=True,
    value_head_dim=False,
    notes={**DENSE_CAPABILITIES.notes, "value_head_dim": "the kernel takes one head dim"},
)
KERNEL_CHECKS = "LONGSPARSE_KERNEL ≠ 0; the C++ kernel built"


def kernel_reason(call: AttentionCall) -> Optional[str]:
    """Not data: an environment switch, and whether the C++ extension could be built on this machine."""
    if not cpu_kernel.enabled():
        return "disabled by LONGSPARSE_KERNEL=0"
    if cpu_kernel.get() is None:
        return "not available: the C++ kernel could not be built (see the warning)"
    return None


FUSED_CPU = Backend(
    "fused_cpu",
    "flash-style C++ kernel: key tiles, α-entmax solved per row, p·v from the support (CPU): O(block × tile) memory",
    (CPU_CAPABILITIES,),
    fused_attention,
    kernel_reason,
    KERNEL_CHECKS,
)
FUSED_DENSE = Backend(
    "fused_dense",
    "all logits at once through the C++ kernel, p kept for the backward (CPU; short rows)",
    (DENSE_CAPABILITIES,),
    fused_dense_attention,
    kernel_reason,
    KERNEL_CHECKS,
)
