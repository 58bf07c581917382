"""The `adasplash` backend: the adasplash package's α-entmax kernels (CUDA), opt-in: only used when named (see
attention/cuda.py, which runs them)."""

from __future__ import annotations

import os
from typing import Optional

import torch

from longsparse.attention import cuda
from longsparse.attention.backends.registry import Backend
from longsparse.attention.call import AttentionCall
from longsparse.attention.capabilities import ALPHA_ENTMAX, Capabilities

_NOT_EXPRESSIBLE = "not expressible in adasplash"

# adasplash 0.2.x: one α in (1, 2] for all heads, logits scaled by 1/√D (scale and q-scales are folded into q),
# N a power of two ≥ 64 (its block-mask tile) and equal for queries and keys, D one of 16 ... 256
CAPABILITIES = Capabilities(
    devices=("cuda",),
    dtypes=(torch.float16, torch.bfloat16, torch.float32),
    head_dims=(16, 32, 64, 128, 256),
    value_head_dim=False,
    mappings=ALPHA_ENTMAX,
    alpha=(1.0, 2.0),
    alpha_tensor="none",
    attn_mask=False,
    alibi=False,
    decoding=False,
    min_length=64,
    power_of_two_length=True,
    notes={
        "devices": "adasplash needs CUDA",
        "value_head_dim": "adasplash takes one head dim",
        "attn_mask": _NOT_EXPRESSIBLE,
        "alibi": _NOT_EXPRESSIBLE,
        "decoding": _NOT_EXPRESSIBLE,
    },
)


def package_reason(call: AttentionCall) -> Optional[str]:
    """Not data: an environment switch, and whether the optional package is installed."""
    if os.environ.get("LONGSPARSE_ADASPLASH", "1") == "0":
        return "disabled by LONGSPARSE_ADASPLASH=0"
    return cuda.module()[1]


BACKEND = Backend(
    "adasplash",
    "the adasplash package's α-entmax kernels (CUDA); opt-in",
    (CAPABILITIES,),
    cuda.run,
    package_reason,
    "adasplash installed; LONGSPARSE_ADASPLASH ≠ 0",
)
