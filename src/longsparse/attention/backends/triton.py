"""The `triton` backend: α-entmax flash attention in Triton (attention/triton_entmax.py): CUDA tensors, or CPU
tensors in Triton's interpreter (TRITON_INTERPRET=1) when named. Its module is imported on first use, so that
importing longsparse never imports Triton (whose interpreter must be chosen before that import)."""

from __future__ import annotations

import importlib
from typing import Dict, Optional

import torch
from torch import Tensor

from longsparse.attention.backends.registry import Backend
from longsparse.attention.call import AttentionCall
from longsparse.attention.capabilities import Capabilities

# The kernels' limits (triton_entmax.HEAD_DIMS / DTYPES, which its own `supports` checks for direct callers;
# tests/unit/attention/test_capabilities.py holds them equal)
CAPABILITIES = Capabilities(
    devices=("cuda", "cpu"),
    dtypes=(torch.float16, torch.bfloat16, torch.float32),
    head_dims=(16, 32, 64, 128),
    value_head_dim=False,
    mappings=("entmax", "sparsemax"),
    alpha=(1.0, 2.0),
    alpha_tensor="per_head",
    attn_mask=False,
    key_ranges=True,
    notes={
        "devices": "the kernels need CUDA (or CPU tensors with TRITON_INTERPRET=1)",
        "value_head_dim": "the kernels take one head dim",
        "attn_mask": "the kernels take key_start / key_end (left / right padding) and is_causal, not a dense mask",
    },
)

_MODULE: Dict[str, object] = {}


def triton_module():
    """(attention/triton_entmax.py as a module or None, why not), imported on first use."""
    if "module" not in _MODULE:
        try:
            _MODULE["module"], _MODULE["why"] = importlib.import_module("longsparse.attention.triton_entmax"), None
        except Exception as exc:  # noqa: BLE001 - any import failure means: not available, and why
            _MODULE["module"], _MODULE["why"] = None, f"not available: {type(exc).__name__}: {exc}"
    return _MODULE["module"], _MODULE["why"]


def kernels_reason(call: AttentionCall) -> Optional[str]:
    """Not data: whether the module imports (Triton installed), and for CPU tensors whether the kernels run in
    the interpreter (decided when they are first built). The module's `supports_call` answers both; it also
    repeats the limits above, with the same words, for direct callers of the kernels."""
    mod, why = triton_module()
    return why if mod is None else mod.supports_call(call)


def run(call: AttentionCall) -> Tensor:
    mod, why = triton_module()
    if mod is None:
        raise RuntimeError(why)
    return mod.run_call(call)


BACKEND = Backend(
    "triton",
    "α-entmax flash attention in Triton (CUDA; CPU under TRITON_INTERPRET=1 when named)",
    (CAPABILITIES,),
    run,
    kernels_reason,
    "Triton imports; CPU tensors only in its interpreter (TRITON_INTERPRET=1)",
)
