"""Hugging Face transformers adapters (transformers is an optional extra).

The papers' configuration on a Llama / Gemma-2-style decoder is one call:

    from longsparse.nn.hf import apply_papers_config, from_pretrained
    model = apply_papers_config(LlamaForCausalLM(config))    # NAPE + ASEntmax, alpha = 1.5
    model.save_pretrained(folder)
    model = from_pretrained(folder)                          # settings and scaler weights come back

``apply_papers_config`` turns the model's attention into α-entmax (``method="entmax"``) or ASEntmax
(``method="asentmax"``) through transformers' AttentionInterface, and its positions into NAPE (docs/method.md §3:
ALiBi with slopes 1/h on the first H/2 heads, NoPE on the rest, the rotary embedding removed), NoPE,
ALiBi, or the model's own RoPE. The ASEntmax scalers (``longsparse.nn.scalers.ASEntmaxScaler``) sit on
the heads that ``longsparse.nn.positions.position_setup`` marks scalable (under NAPE the NoPE heads) as
the submodule ``longsparse_scaler`` of every attention module, so they train with the model and are in
its state dict. The settings are stored in ``config.longsparse`` (a JSON dict) and the attention
implementation in ``config.json``, so ``save_pretrained`` keeps both; ``from_pretrained`` here rebuilds
the model from them. A plain transformers ``from_pretrained`` refuses such a folder before loading anything:
config.json names the attention ``"<method> from longsparse: load this model with
longsparse.nn.hf.from_pretrained(path)"`` (`saved_attention_name`), which transformers reports as an unsupported
``attn_implementation`` in one line. (Folders saved before that name was used load in transformers when longsparse
registered its attention, and then their first forward raises with the same advice.)

Lower level: ``register_hf_attention()`` registers "entmax" and "asentmax" (α from
``config.entmax_alpha``, default 1.5; float or per-head list) for ``attn_implementation=...``, and
``add_asentmax_scalers(model)`` attaches scalers to every head while keeping the model's positions.

Masks (docs/hf.md, "Which masks reach which path"). The mask builder registered with the attention
functions (`hf_attention_mask`, transformers' AttentionMaskInterface) keeps causal attention with padding
in the form the fused kernels read: when the mask transformers asks for is plain causal (no sliding window,
packed sequences or custom mask function) and each row's real tokens are one run (left, right or both), it
returns the 2-D padding mask (B, used) and the attention function passes ``is_causal`` with the run as
``key_start`` / ``key_end`` (B,) — no dense mask, so the Triton kernels (CUDA) and fused_cpu take the call.
Any other mask is the dense boolean (B, 1, L, S) mask, as transformers' sdpa builder makes it, and a
one-time `HFDenseMaskWarning` per reason says why, with the backend `explain_attention` gives that call.

Invariants of the attention functions:
* A 2-D mask covers the keys in use: ``used`` = the query offset + L. With a static cache the keys are
  the whole preallocated buffer and the queries sit at ``used - L``; the slots from ``used`` on are
  unwritten, so the keys are cut to ``used`` and causality is bottom-right again (queries at the end).
  No mask (None) means causal with no padding and the queries at the end of the keys; the builder
  returns None only then (never for a static cache that is not full).
* A 2-D mask that `hf_attention_mask` built carries its key ranges (attribute ``_KEY_RANGES``), found
  once per forward with one host sync; one built elsewhere is checked again in the attention function.
* ALiBi adds −m·(i − j) with i the query's index counted as if the queries were the last keys. Only
  the key index j matters: the query term is a constant per row, and softmax and α-entmax are both
  invariant to adding a constant to a row (τ absorbs it). Keys are in cache order (oldest first), so
  left padding and static caches give the same distances between real tokens.
* The scaler's query position i is ``position_ids`` (real tokens before the query in its row). With an
  ASEntmax scaler, a forward pre-hook on the base model fills ``position_ids`` from a 2-D
  ``attention_mask`` when the caller gave none, so left-padded rows equal unpadded ones.
* Under autocast q, k and v reach longsparse attention in the autocast dtype (as torch's SDPA gets
  them); outside it as the model computed them.
* Attention-logit soft-capping and attention dropout are not supported: they raise instead of being
  ignored (as transformers' sdpa integration does for softcap).
"""

from __future__ import annotations

import inspect
import json
import os
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from longsparse.attention import attention, explain_attention
from longsparse.attention.policy import check_backend_name
from longsparse.nn.attention import key_padding
from longsparse.nn.positions import NAPE_SLOPES, POSITIONS, position_setup
from longsparse.nn.scalers import ASENTMAX_INITS, ASEntmaxScaler, check_scaler_constants

HF_NAMES = ("entmax", "asentmax")
METHODS = HF_NAMES
CONFIG_KEY = "longsparse"  # config attribute holding the settings dict
_READY = "_longsparse_ready"  # set on attention modules that _setup configured


def _import_transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError(
            "longsparse.nn.hf needs the optional dependency transformers (pip install transformers)"
        ) from e
    return transformers


# ----------------------------------------------------------------------------- attention functions


def _alpha(module: nn.Module, device: torch.device):
    cfg = getattr(module, "config", None)
    settings = getattr(cfg, CONFIG_KEY, None) or {}
    a = settings.get("alpha")
    if a is None:
        a = getattr(module, "longsparse_alpha", None)
    if a is None:
        a = getattr(cfg, "entmax_alpha", 1.5)
    if isinstance(a, (list, tuple)):
        a = torch.tensor(a, dtype=torch.float32, device=device)
    return a


def _slopes(module: nn.Module, device: torch.device) -> Tensor | None:
    """The module's ALiBi slopes (H,) in float32 on ``device``; None without ALiBi. Kept out of the
    buffers so that ``model.to(torch.bfloat16)`` does not round them."""
    s = getattr(module, "_longsparse_slopes", None)
    if s is not None and s.device != device:
        s = s.to(device)
        module._longsparse_slopes = s
    return s


def _query_positions(kwargs: dict[str, Any], B: int, L: int, S: int, device: torch.device) -> Tensor:
    """(B, L) 0-based positions of the queries: ``position_ids``, else ``cache_position``, else the
    last L of S (queries at the end of the keys)."""
    pos = kwargs.get("position_ids")
    if pos is None:
        pos = kwargs.get("cache_position")
    if pos is None:
        pos = torch.arange(S - L, S, device=device)
    pos = pos.to(device)
    if pos.dim() == 1:
        pos = pos.unsqueeze(0)
    return pos[..., -L:].expand(B, L)


class HFDenseMaskWarning(UserWarning):
    """A Hugging Face model's attention got a dense (B, 1, L, S) mask: it runs on the chunked PyTorch
    backends (the Triton kernels take no attn_mask). Issued once per reason."""


_WARNED: set[str] = set()  # the dense-mask reasons already warned about (one warning each per process)
_KEY_RANGES = "_longsparse_key_ranges"  # on a 2-D mask from hf_attention_mask: its key_start / key_end kwargs
_DENSE_REASON = "_longsparse_dense_reason"  # on a dense mask from hf_attention_mask: why it is dense


def _warn_dense_once(reason: str, query: Tensor, key: Tensor, value: Tensor, attention_kwargs: dict) -> None:
    """One HFDenseMaskWarning per reason and process, naming the backend that `explain_attention` gives this call
    and why it is not triton."""
    if reason in _WARNED:
        return
    _WARNED.add(reason)
    choice = explain_attention(query, key, value, **attention_kwargs)
    passed = choice.passed_over.get("triton")
    warnings.warn(
        f"longsparse attention of a Hugging Face model gets a dense (B, 1, L, S) mask ({reason}): "
        f"explain_attention gives it to {choice.backend} ({choice.why})"
        + (f", not triton ({passed})" if passed else "")
        + "; causal attention with one run of real tokens per row (left and / or right padding) reaches the "
        "Triton kernels and fused_cpu as key ranges (docs/hf.md)",
        HFDenseMaskWarning,
        stacklevel=4,
    )


class _UnreadMask:
    """What `hf_attention_mask` gives for a sliding-window mask while ``config.layer_types`` has no sliding
    layer (Gemma-2 builds one every forward whatever its layers are): nothing is built, and an attention
    call that gets it raises."""

    def __repr__(self) -> str:
        return "<sliding-window mask not built: config.layer_types has no sliding_attention layer>"


_UNREAD = _UnreadMask()


def _dense_reason(mask_function, local_size, kv_offset: int) -> str | None:
    """Why the mask transformers asks for is not causal + padding (None: it is)."""
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

    if local_size is not None or kv_offset:
        return "a sliding-window layer"
    if mask_function is bidirectional_mask_function:
        return "bidirectional attention (config.is_causal = False)"
    if mask_function is not causal_mask_function:
        return "not plain causal: packed sequences (position_ids restarting in a row), a block-wise or custom mask"
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return _TRACED
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return "captured in a CUDA graph: whether the padding is one run per row is data-dependent"
    return None


_TRACED = "traced by torch.compile: whether the padding is one run per row is data-dependent"


def hf_attention_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | Tensor = 0,
    kv_offset: int = 0,
    mask_function=None,
    attention_mask: Tensor | None = None,
    local_size: int | None = None,
    config=None,
    **kwargs,
):
    """The mask builder registered for "entmax" / "asentmax" in transformers' AttentionMaskInterface
    (called by ``create_causal_mask`` and its siblings once per forward and mask kind, with their keywords).

    Causal with each row's real tokens one run (``attention_mask`` (B, ≥ used) the 2-D padding mask, or
    None): None when no key is padding and the keys are exactly the ``used`` = q_offset + q_length keys in
    use; else the (B, used) bool padding mask carrying its key ranges (`_KEY_RANGES`). Anything else: the
    dense (B, 1, q_length, kv_length) bool mask of transformers' sdpa builder (causal skip off), carrying
    why (`_DENSE_REASON`). A sliding-window mask that no layer of ``config.layer_types`` reads: `_UNREAD`."""
    from transformers.masking_utils import prepare_padding_mask, sdpa_mask

    if mask_function is None:
        from transformers.masking_utils import causal_mask_function as mask_function
    layer_types = getattr(config, "layer_types", None)
    if local_size is not None and layer_types is not None and "sliding_attention" not in layer_types:
        return _UNREAD
    reason = _dense_reason(mask_function, local_size, kv_offset)
    if reason == _TRACED and attention_mask is None and isinstance(q_offset, int) and q_offset + q_length == kv_length:
        return None  # no padding and no unwritten cache slots: nothing data-dependent to decide
    if reason is None:
        used = int(q_offset) + q_length  # one host sync for a static cache's offset tensor
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if used > kv_length:
            reason = f"{q_offset} cached + {q_length} new tokens but {kv_length} keys"
        elif padding is None:
            if used == kv_length:
                return None
            mask = torch.ones(batch_size, used, dtype=torch.bool, device=kwargs.get("device", "cpu"))
            setattr(mask, _KEY_RANGES, {})
            return mask
        else:
            mask = padding[:, :used].to(torch.bool)  # a new tensor object: the attribute never lands on the caller's
            pad = key_padding(mask)
            if pad is None and used == kv_length:
                return None
            if pad is None or pad.one_run:
                setattr(mask, _KEY_RANGES, {} if pad is None else pad.attention_kwargs())
                return mask
            reason = "padding that is not one run of real tokens per row (e.g. a right-padded prompt extended)"
    kwargs["allow_is_causal_skip"] = False
    kwargs.pop("allow_is_bidirectional_skip", None)
    dense = sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        local_size=local_size,
        **kwargs,
    )
    setattr(dense, _DENSE_REASON, reason)
    return dense


def _mask_kwargs(attention_mask, key: Tensor, value: Tensor, L: int, module: nn.Module, is_causal):
    """(key, value, attention kwargs, why the mask is dense or None) for the mask the model passed (see the module
    docstring's invariants)."""
    S = key.shape[2]
    if attention_mask is _UNREAD:
        raise ValueError(
            "a sliding-window layer got the mask that longsparse did not build because config.layer_types "
            "lists no sliding_attention layer; make config.layer_types name every layer's kind"
        )
    if attention_mask is None:
        # the queries are the last L keys
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True)) and L > 1
        return key, value, {"is_causal": causal}, None
    if attention_mask.dim() == 2:
        used = attention_mask.shape[-1]
        if used > S:
            raise ValueError(f"the padding mask covers {used} keys, the cache holds {S}")
        key, value = key[:, :, :used], value[:, :, :used]  # the slots past `used` are unwritten (static cache)
        ranges, reason = getattr(attention_mask, _KEY_RANGES, None), None
        if ranges is None:  # a 2-D mask not from hf_attention_mask (e.g. moved to another device): check it
            pad = key_padding(attention_mask.to(torch.bool))
            if pad is not None and not pad.one_run:
                reason = "a 2-D padding mask with more than one run of real tokens in a row"
            ranges = {} if pad is None else pad.attention_kwargs()
        return key, value, {"is_causal": L > 1, **ranges}, reason
    if attention_mask.shape[-1] < S:
        raise ValueError(f"attention mask covers {attention_mask.shape[-1]} keys, the cache holds {S}")
    # generate copies the masks it prepares for a static cache (.contiguous()), which drops the reason
    reason = getattr(attention_mask, _DENSE_REASON, "a 4-D mask given by the caller, or a copy of one")
    mask = attention_mask[..., :S]
    if mask.dtype != torch.bool:
        # eager-style additive mask: 0 = attend, the dtype's minimum (or −inf) = masked
        mask = mask > torch.finfo(mask.dtype).min / 2
    return key, value, {"is_causal": False, "attn_mask": mask}, reason


def _hf_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    *,
    scaled: bool = False,
    **kwargs,
):
    """query (B, H, L, D), key/value (B, Hkv, S, D), attention_mask None, (B, used ≤ S) bool padding or
    (B, 1, L, ≥S) bool / additive → ((B, L, H, D), None)."""
    softcap = kwargs.get("softcap")
    if softcap is not None:
        raise ValueError(
            f"longsparse attention does not support attention-logit soft-capping (softcap={softcap}); "
            "set config.attn_logit_softcapping = None"
        )
    if dropout:
        raise ValueError(
            f"longsparse attention does not support attention dropout (p={dropout}); set config.attention_dropout = 0.0"
        )
    cfg = getattr(module, "config", None)
    settings = getattr(cfg, CONFIG_KEY, None)
    if settings is not None and not getattr(module, _READY, False):
        raise ValueError(
            "this model's config carries longsparse settings but the model was built without them "
            "(by transformers' own from_pretrained?); load it with longsparse.nn.hf.from_pretrained"
        )
    B, _, L, _ = query.shape
    key, value, mask_kwargs, dense_reason = _mask_kwargs(attention_mask, key, value, L, module, is_causal)
    if torch.is_autocast_enabled(query.device.type):
        # The model's rotary (or NoPE) multiply leaves q and k in float32 and v in the autocast dtype; torch's
        # SDPA would get all three in the autocast dtype, and the Triton kernels take only one dtype.
        dtype = torch.get_autocast_dtype(query.device.type)
        query, key, value = (t.to(dtype) for t in (query, key, value))
    S = key.shape[2]
    q_scale = None
    if scaled:
        scaler = getattr(module, "longsparse_scaler", None)
        h = module.__dict__.pop("_longsparse_hidden", None)
        if scaler is None or h is None:
            raise ValueError(
                "attn_implementation='asentmax' needs ASEntmax scalers: call "
                "longsparse.nn.hf.add_asentmax_scalers(model) or apply_papers_config(model) first"
            )
        pos = _query_positions(kwargs, B, L, S, query.device)
        q_scale = scaler(h[:, -L:].to(query.dtype), pos)
    attention_kwargs = dict(
        mapping="entmax",
        alpha=_alpha(module, query.device),
        scale=scaling,
        alibi_slopes=_slopes(module, query.device),
        q_scale=q_scale,
        backend=(settings or {}).get("backend", "auto"),
        **mask_kwargs,
    )
    if dense_reason is not None:
        _warn_dense_once(dense_reason, query, key, value, attention_kwargs)
    out = attention(query, key, value, **attention_kwargs)
    return out.transpose(1, 2).contiguous(), None


def entmax_attention_forward(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, is_causal=None, **kwargs
):
    """transformers AttentionInterface function: α-entmax attention (α from config.entmax_alpha or the
    longsparse settings)."""
    return _hf_attention(module, query, key, value, attention_mask, scaling, dropout, is_causal, scaled=False, **kwargs)


def asentmax_attention_forward(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, is_causal=None, **kwargs
):
    """transformers AttentionInterface function: ASEntmax (needs add_asentmax_scalers or apply_papers_config)."""
    return _hf_attention(module, query, key, value, attention_mask, scaling, dropout, is_causal, scaled=True, **kwargs)


def register_hf_attention() -> tuple:
    """Register "entmax" and "asentmax" with transformers' AttentionInterface, each with `hf_attention_mask`
    as its mask builder in AttentionMaskInterface. Idempotent. Raises ImportError without transformers."""
    _import_transformers()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register("entmax", entmax_attention_forward)
    AttentionInterface.register("asentmax", asentmax_attention_forward)
    for name in HF_NAMES:
        AttentionMaskInterface.register(name, hf_attention_mask)
    return HF_NAMES


# ----------------------------------------------------------------------------- model surgery


def _is_attention_module(m: nn.Module) -> bool:
    return type(m).__name__.endswith("Attention") and hasattr(m, "q_proj") and hasattr(m, "config")


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    """The model's attention modules; raises if there are none or longsparse already configured them."""
    mods = [m for m in model.modules() if _is_attention_module(m)]
    if not mods:
        raise ValueError("no attention modules (with q_proj and config) found in the model")
    if any(getattr(m, _READY, False) for m in mods):
        raise ValueError("the model already has longsparse attention; apply the configuration to a fresh model")
    return mods


def _stash_hidden(module, args, kwargs):
    """Forward pre-hook of an attention module: keep its input h (B, L, d_model) for the scaler."""
    module._longsparse_hidden = kwargs.get("hidden_states", args[0] if args else None)


_FORWARD_PARAMS: dict[type, list[str]] = {}


def _fill_position_ids(module, args, kwargs):
    """Forward pre-hook of the base model: without ``position_ids`` but with a 2-D ``attention_mask``
    (B, past + L), position_ids = the number of real tokens before each of the last L tokens, as
    ``generate`` computes them; the model's default (0…L−1 for every row) would count left padding."""
    names = _FORWARD_PARAMS.get(type(module))
    if names is None:
        names = list(inspect.signature(type(module).forward).parameters)[1:]
        _FORWARD_PARAMS[type(module)] = names
    given = dict(zip(names, args))
    given.update(kwargs)
    mask = given.get("attention_mask")
    if given.get("position_ids") is not None or not isinstance(mask, Tensor) or mask.dim() != 2:
        return None
    x = given.get("input_ids")
    if x is None:
        x = given.get("inputs_embeds")
    if x is None:
        return None
    pos = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, -x.shape[1] :]
    if "position_ids" in names[: len(args)]:
        args = list(args)
        args[names.index("position_ids")] = pos
        return tuple(args), kwargs
    return args, {**kwargs, "position_ids": pos}


class NoRotaryEmbedding(nn.Module):
    """Stands in for a model's rotary embedding: returns cos = 1, sin = 0 (each (B or 1, L, dim)), so
    ``apply_rotary_pos_emb`` leaves q and k unchanged — NoPE. Has no parameters or buffers."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = int(dim)

    def forward(self, x: Tensor, position_ids: Tensor | None = None, *args, **kwargs):
        n, L = (x.shape[0], x.shape[1]) if position_ids is None else (position_ids.shape[0], position_ids.shape[-1])
        one = torch.ones((), dtype=x.dtype, device=x.device).expand(n, L, self.dim)
        return one, torch.zeros_like(one)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


def _remove_rotary(model: nn.Module, positions: str) -> int:
    found = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RotaryEmbedding"):
                inv = getattr(child, "inv_freq", None)
                dim = 2 * inv.numel() if isinstance(inv, Tensor) else model.config.head_dim
                setattr(parent, name, NoRotaryEmbedding(dim))
                found += 1
    if not found:
        raise ValueError(
            f"positions={positions!r} removes the model's rotary embedding, but "
            f"{type(model).__name__} has none (a Llama / Gemma-2-style model has one)"
        )
    return found


def _make_settings(
    method: str,
    positions: str,
    alpha,
    nape_variant: str,
    init: str,
    delta: float,
    gamma_range: float,
    n_heads: int,
    backend: str = "auto",
) -> dict[str, Any]:
    check_backend_name(backend)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if positions not in POSITIONS:
        raise ValueError(f"unknown positions {positions!r}; choose one of {', '.join(POSITIONS)}")
    if nape_variant not in NAPE_SLOPES:
        raise ValueError(f"unknown NAPE slope variant {nape_variant!r}; choose one of {', '.join(NAPE_SLOPES)}")
    if init not in ASENTMAX_INITS:
        raise ValueError(f"unknown ASEntmax init {init!r}; choose one of {', '.join(ASENTMAX_INITS)}")
    if alpha is not None:
        if isinstance(alpha, Tensor):
            alpha = alpha.tolist()
        values = list(alpha) if isinstance(alpha, (list, tuple)) else [alpha]
        if isinstance(alpha, (list, tuple)) and len(values) != n_heads:
            raise ValueError(f"a per-head alpha needs {n_heads} values (one per attention head), got {len(values)}")
        if not all(isinstance(a, (int, float)) and float(a) >= 1 and float(a) < float("inf") for a in values):
            raise ValueError(f"alpha must be a finite number >= 1 (1 is softmax) or a list of them; got {alpha}")
        alpha = [float(a) for a in values] if isinstance(alpha, (list, tuple)) else float(alpha)
    check_scaler_constants(delta, gamma_range)
    scaler = {"init": init, "delta": float(delta), "gamma_range": float(gamma_range)} if method == "asentmax" else None
    settings = {
        "method": method,
        "positions": positions,
        "alpha": alpha,
        "nape_variant": nape_variant,
        "scaler": scaler,
    }
    if backend != "auto":  # settings saved before the key existed read as auto
        settings["backend"] = backend
    return settings


def _setup(model: nn.Module, settings: dict[str, Any]) -> int:
    """Configure ``model`` from ``settings`` (the dict of ``config.longsparse``); returns the number
    of attention modules. The settings are written to the config so that save_pretrained keeps them."""
    register_hf_attention()
    mods = _attention_modules(model)
    cfg = model.config
    method, positions = settings["method"], settings["positions"]
    slopes, scalable = position_setup(positions, cfg.num_attention_heads, settings.get("nape_variant", "harmonic"))
    if positions != "rope":
        _remove_rotary(model, positions)
    sc = settings.get("scaler")
    for m in mods:
        ref = m.q_proj.weight
        m._longsparse_slopes = None if slopes is None else slopes.to(ref.device)
        if method == "asentmax":
            m.longsparse_scaler = ASEntmaxScaler(
                cfg.hidden_size, scalable, init=sc["init"], delta=sc["delta"], gamma_range=sc["gamma_range"]
            ).to(ref.device, ref.dtype)
            m.register_forward_pre_hook(_stash_hidden, with_kwargs=True)
        setattr(m, _READY, True)
    if method == "asentmax":
        getattr(model, "base_model", model).register_forward_pre_hook(_fill_position_ids, with_kwargs=True)
    setattr(cfg, CONFIG_KEY, settings)
    # transformers reads this key of config.json as the attention implementation (the running model dispatches on
    # config._attn_implementation, set below): a name no one registers makes transformers' own from_pretrained stop
    # at once, before loading weights, with a message that says how to load it, instead of loading as softmax or
    # listing the scaler weights as unexpected keys. longsparse's from_pretrained passes the real name.
    cfg.attn_implementation = saved_attention_name(method)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(method)
    else:
        cfg._attn_implementation = method
    return len(mods)


def saved_attention_name(method: str) -> str:
    """What config.json names as the attention of a model with longsparse attention ``method``: not a registered
    name, so a plain transformers load fails in one line that says what to do."""
    return f"{method} from longsparse: load this model with longsparse.nn.hf.from_pretrained(path)"


def add_asentmax_scalers(
    model: nn.Module, init: str = "scale_aware", delta: float = 1.0, gamma_range: float = 2.0
) -> int:
    """Attach an ASEntmaxScaler (all heads scaled) to every attention module of a transformers model,
    switch its attention to "asentmax" and keep its own positions (α stays ``config.entmax_alpha``,
    default 1.5). Returns how many were attached. The scalers are in the state dict and the settings in
    ``config.longsparse``: reload a saved model with ``longsparse.nn.hf.from_pretrained``."""
    settings = _make_settings(
        "asentmax", "rope", None, "harmonic", init, delta, gamma_range, model.config.num_attention_heads
    )
    return _setup(model, settings)


def apply_papers_config(
    model: nn.Module,
    method: str = "asentmax",
    positions: str = "nape",
    alpha: float | Sequence[float] = 1.5,
    *,
    nape_variant: str = "harmonic",
    init: str = "scale_aware",
    delta: float = 1.0,
    gamma_range: float = 2.0,
    full_attention: bool = True,
    backend: str = "auto",
) -> nn.Module:
    """Give a Llama / Gemma-2-style transformers decoder the configuration of the papers, in place;
    returns the model.

    method: "asentmax" (α-entmax with the per-query ASEntmax scale of q) or "entmax" (α-entmax).
    positions: "nape" (ALiBi with slopes 1/h on the first H/2 heads — ``nape_variant="geometric"``:
    2^−(h−1) — NoPE on the rest), "nope", "alibi" (standard slopes) or "rope" (the model's own).
    Every choice but "rope" removes the rotary embedding. alpha: float ≥ 1 or one per query head.
    init / delta / gamma_range: the ASEntmax scaler (docs/method.md §2); it scales the NoPE heads under NAPE,
    all heads otherwise. full_attention: turn sliding-window layers into full attention (the papers'
    models have none, and a window would cap how far the NoPE heads reach).
    Attention-logit soft-capping (Gemma-2) is switched off: the papers' models have none and
    longsparse attention does not support it. A model with attention dropout is refused.
    backend: the ``longsparse.attention`` backend of every attention call, "auto" (its policy: the Triton
    kernels on CUDA) or a backend's name (``config.longsparse["backend"]``, read at every call).
    The settings go to ``config.longsparse``; reload a saved model with ``from_pretrained``.
    """
    _import_transformers()
    cfg = model.config
    mods = _attention_modules(model)
    if getattr(cfg, "attention_dropout", 0.0):
        raise ValueError(
            f"longsparse attention does not support attention dropout "
            f"(config.attention_dropout={cfg.attention_dropout}); set it to 0.0"
        )
    settings = _make_settings(
        method, positions, alpha, nape_variant, init, delta, gamma_range, cfg.num_attention_heads, backend
    )
    if getattr(cfg, "attn_logit_softcapping", None) is not None:
        cfg.attn_logit_softcapping = None
    if full_attention and "sliding_attention" in (getattr(cfg, "layer_types", None) or ()):
        cfg.layer_types = ["full_attention" if t == "sliding_attention" else t for t in cfg.layer_types]
    for m in mods:
        if hasattr(m, "attn_logit_softcapping"):
            m.attn_logit_softcapping = None
        if full_attention and getattr(m, "sliding_window", None) is not None:
            m.sliding_window = None
    if full_attention and getattr(cfg, "sliding_window", None) is not None and not hasattr(cfg, "layer_types"):
        cfg.sliding_window = None  # a model whose every layer is sliding (Mistral-style)
    _setup(model, settings)
    return model


# ----------------------------------------------------------------------------- loading


def _checkpoint_tensors(path: str, keys: Sequence[str], hub_kwargs: dict[str, Any]) -> dict[str, Tensor]:
    """The tensors ``keys`` from the safetensors checkpoint (single file or sharded) at ``path``."""
    from safetensors import safe_open
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, cached_file

    def find(name):
        if os.path.isdir(path):
            f = os.path.join(path, name)
            return f if os.path.isfile(f) else None
        return cached_file(path, name, _raise_exceptions_for_missing_entries=False, **hub_kwargs)

    index = find(SAFE_WEIGHTS_INDEX_NAME)
    if index is not None:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files: dict[str, list[str]] = {}
        for k in keys:
            if k in weight_map:
                files.setdefault(weight_map[k], []).append(k)
    else:
        files = {SAFE_WEIGHTS_NAME: list(keys)}
    out: dict[str, Tensor] = {}
    for name, wanted in files.items():
        file = find(name)
        if file is None:
            raise ValueError(f"{path} has no {name}: longsparse.nn.hf.from_pretrained reads safetensors checkpoints")
        with safe_open(file, framework="pt") as f:
            present = set(f.keys())
            out.update({k: f.get_tensor(k) for k in wanted if k in present})
    missing = [k for k in keys if k not in out]
    if missing:
        raise ValueError(
            f"{path} lacks {len(missing)} longsparse weights (e.g. {missing[0]}); "
            "was it saved after apply_papers_config / add_asentmax_scalers?"
        )
    return out


def from_pretrained(path: str | os.PathLike, model_class: type | None = None, **kwargs) -> nn.Module:
    """Load a transformers model saved after ``apply_papers_config`` / ``add_asentmax_scalers``: the
    model with its longsparse settings (``config.longsparse``) and scaler weights. ``model_class``
    defaults to the class named in the config's ``architectures``; ``kwargs`` go to its
    ``from_pretrained`` (dtype, device_map, revision, ...)."""
    transformers = _import_transformers()
    register_hf_attention()
    path = os.fspath(path)
    hub_kwargs = {k: kwargs[k] for k in ("revision", "cache_dir", "token", "local_files_only") if k in kwargs}
    config = kwargs.pop("config", None) or transformers.AutoConfig.from_pretrained(path, **hub_kwargs)
    settings = getattr(config, CONFIG_KEY, None)
    if settings is None:
        raise ValueError(f"{path} has no longsparse settings in its config; load it with transformers directly")
    if model_class is None:
        archs = getattr(config, "architectures", None) or []
        model_class = getattr(transformers, archs[0], None) if archs else None
        if model_class is None:
            raise ValueError(
                f"cannot tell the model class of {path} (config.architectures = {archs}); pass model_class="
            )
    # The scaler weights are loaded below, once the scalers exist; a subclass only tells transformers
    # not to report them as unexpected keys. The model is handed back as model_class itself.
    ignore = set(getattr(model_class, "_keys_to_ignore_on_load_unexpected", None) or ()) | {r"\.longsparse_"}
    shim = type(
        model_class.__name__,
        (model_class,),
        {"__module__": model_class.__module__, "_keys_to_ignore_on_load_unexpected": ignore},
    )
    requested = kwargs.pop("attn_implementation", settings["method"])
    if requested != settings["method"]:
        raise ValueError(
            f"{path} was saved with attention {settings['method']!r}; attn_implementation={requested!r} would drop it"
        )
    model = shim.from_pretrained(path, config=config, attn_implementation=settings["method"], **kwargs)
    model.__class__ = model_class
    _setup(model, settings)
    keys = [k for k in model.state_dict() if ".longsparse_" in k]
    if keys:
        model.load_state_dict(_checkpoint_tensors(path, keys, hub_kwargs), strict=False)
    return model
