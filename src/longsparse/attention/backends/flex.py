"""The `flex` backend: torch FlexAttention, compiled, for softmax and adaptive temperature (attention/flex.py):
ALiBi, causal offsets and key ranges inside the fused kernel. CUDA (forward and backward) and CPU inference."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch

from longsparse.attention import flex
from longsparse.attention.backends.registry import Backend
from longsparse.attention.call import AttentionCall
from longsparse.attention.capabilities import Capabilities

_NO_DENSE_MASK = "flex takes the causal mask and key ranges (key_start / key_end), not a dense mask"

CUDA_CAPABILITIES = Capabilities(
    devices=("cuda",),
    dtypes=(torch.float16, torch.bfloat16, torch.float32),
    min_head_dim=16,
    mappings=("softmax", "adatemp"),
    attn_mask=False,
    key_ranges=True,
    notes={
        "min_head_dim": "FlexAttention's CUDA kernels need ≥ 16",
        "mapping topk": "needs each row's kept set from all its logits (use sdpa or chunked)",
        "attn_mask": _NO_DENSE_MASK,
    },
)
# torch's CPU FlexAttention has no backward and returns no log-sum-exp (adaptive temperature's entropy pass)
CPU_CAPABILITIES = replace(
    CUDA_CAPABILITIES,
    devices=("cpu",),
    min_head_dim=1,
    mappings=("softmax",),
    grad=False,
    notes={
        "mapping topk": CUDA_CAPABILITIES.notes["mapping topk"],
        "mapping adatemp": "needs the log-sum-exp for its entropy pass, which CPU FlexAttention lacks",
        "attn_mask": _NO_DENSE_MASK,
        "grad": "torch's CPU FlexAttention has no backward (flex differentiates on CUDA)",
    },
)


def build_reason(call: AttentionCall) -> Optional[str]:
    """Not data: whether this torch build has FlexAttention and can compile it for the call's device."""
    return flex.build_reason(call.device_type)


BACKEND = Backend(
    "flex",
    "torch FlexAttention (compiled) for softmax and adaptive temperature: ALiBi, causal offsets and key "
    "ranges in the fused kernel (CUDA; CPU inference)",
    (CUDA_CAPABILITIES, CPU_CAPABILITIES),
    flex.flex_attention_run,
    build_reason,
    "FlexAttention in this torch; CUDA: Triton for torch.compile; CPU: AVX2, not macOS",
)
