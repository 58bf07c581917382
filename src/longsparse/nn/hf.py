"""Hugging Face transformers adapters (transformers is an optional extra).

    from longsparse.nn.hf import register_hf_attention, add_asentmax_scalers
    register_hf_attention()                       # registers "entmax" and "asentmax"
    model = LlamaForCausalLM(LlamaConfig(..., attn_implementation="entmax"))
    model.config.entmax_alpha = 1.5               # optional (default 1.5); float or per-head list

"entmax" is α-entmax attention on the model's own q, k, v, mask and positions. "asentmax" also
multiplies q by the ASEntmax scale of each query; it needs the scalers that
``add_asentmax_scalers(model)`` attaches to every attention module (as the submodule
``longsparse_scaler``, trained with the model). Their input h_i is the attention module's input
hidden state (in Llama-style models the normalised layer input), captured by a forward pre-hook;
the query position i is the ``position_ids`` the model passes (or the cache position).
Masks come from the sdpa mask builder (boolean, True = attend; None means plain causal).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from longsparse.attention import attention
from longsparse.nn.scalers import ASEntmaxScaler

HF_NAMES = ("entmax", "asentmax")


def _alpha(module):
    a = getattr(module, "longsparse_alpha", None)
    if a is None:
        a = getattr(getattr(module, "config", None), "entmax_alpha", 1.5)
    if isinstance(a, (list, tuple)):
        a = torch.tensor(a, dtype=torch.float32)
    return a


def _hf_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                  attention_mask: Optional[Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                  is_causal: Optional[bool] = None, *, scaled: bool = False, **kwargs):
    B, H, L, D = query.shape
    S = key.shape[2]
    mask, causal = None, False
    if attention_mask is not None:
        mask = attention_mask[..., -S:]
        if mask.dtype != torch.bool:
            # eager-style additive mask: large negative = masked
            mask = mask > torch.finfo(mask.dtype).min / 2
    else:
        causal = (is_causal if is_causal is not None else getattr(module, "is_causal", True)) and L > 1
    q_scale = None
    if scaled:
        scaler = getattr(module, "longsparse_scaler", None)
        h = getattr(module, "_longsparse_hidden", None)
        if scaler is None or h is None:
            raise ValueError("attn_implementation='asentmax' needs ASEntmax scalers: call "
                             "longsparse.nn.hf.add_asentmax_scalers(model) first")
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = kwargs.get("cache_position")
        if pos is None:
            pos = torch.arange(S - L, S, device=query.device)
        pos = pos.to(query.device)
        if pos.dim() == 1:
            pos = pos.unsqueeze(0)
        pos = pos[..., -L:].expand(B, L)
        q_scale = scaler(h[:, -L:].to(query.dtype), pos)
    out = attention(query, key, value, mapping="entmax", alpha=_alpha(module), is_causal=causal,
                    scale=scaling, q_scale=q_scale, attn_mask=mask)
    return out.transpose(1, 2).contiguous(), None


def entmax_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             is_causal=None, **kwargs):
    """transformers AttentionInterface function: α-entmax attention (α from config.entmax_alpha)."""
    return _hf_attention(module, query, key, value, attention_mask, scaling, dropout, is_causal,
                         scaled=False, **kwargs)


def asentmax_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                               is_causal=None, **kwargs):
    """transformers AttentionInterface function: ASEntmax (needs add_asentmax_scalers)."""
    return _hf_attention(module, query, key, value, attention_mask, scaling, dropout, is_causal,
                         scaled=True, **kwargs)


def register_hf_attention() -> tuple:
    """Register "entmax" and "asentmax" with transformers' AttentionInterface (and the sdpa mask
    builder for them in AttentionMaskInterface). Raises ImportError without transformers."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:
        raise ImportError("longsparse.nn.hf needs the optional dependency transformers "
                          "(pip install transformers)") from e
    AttentionInterface.register("entmax", entmax_attention_forward)
    AttentionInterface.register("asentmax", asentmax_attention_forward)
    for name in HF_NAMES:
        AttentionMaskInterface.register(name, sdpa_mask)
    return HF_NAMES


def _is_attention_module(m: nn.Module) -> bool:
    return type(m).__name__.endswith("Attention") and hasattr(m, "q_proj") and hasattr(m, "config")


def _stash_hidden(module, args, kwargs):
    h = kwargs.get("hidden_states", args[0] if args else None)
    module._longsparse_hidden = h


def add_asentmax_scalers(model: nn.Module, init: str = "scale_aware", delta: float = 1.0,
                         gamma_range: float = 2.0) -> int:
    """Attach an ASEntmaxScaler (all heads scaled) to every attention module of a transformers
    model; returns how many were attached."""
    n = 0
    for m in model.modules():
        if _is_attention_module(m) and not hasattr(m, "longsparse_scaler"):
            cfg = m.config
            H = cfg.num_attention_heads
            ref = m.q_proj.weight
            m.longsparse_scaler = ASEntmaxScaler(cfg.hidden_size, torch.ones(H, dtype=torch.bool), init=init,
                                                 delta=delta, gamma_range=gamma_range).to(ref.device, ref.dtype)
            m.register_forward_pre_hook(_stash_hidden, with_kwargs=True)
            n += 1
    if n == 0:
        raise ValueError("no attention modules (with q_proj and config) found in the model")
    return n
