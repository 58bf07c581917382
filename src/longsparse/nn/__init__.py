"""Modules: positions (NoPE, RoPE, ALiBi, NAPE), length scalers (SSMax, ASEntmax), Attention and its settings
(AttentionSettings, shared by every architecture's config), the Gemma-2-style Transformer decoder, greedy
generation (GreedyGeneration: the decoder's with its KV cache or a static one whose step a CUDA graph captures;
HSA's too), introspection and
adapters (nn.MultiheadAttention-style; Hugging Face transformers in longsparse.nn.hf)."""

from longsparse.nn.attention import Attention, LayerCache, StaticLayerCache, dense_logits
from longsparse.nn.config import METHODS, AttentionSettings, ModelConfig
from longsparse.nn.generation import (
    CapturedStep,
    Decoding,
    FullForwardDecoding,
    GreedyGeneration,
    KVCacheDecoding,
    StaticCacheDecoding,
)
from longsparse.nn.introspect import CAPTURE_KINDS, Capture, capture
from longsparse.nn.mha import EntmaxMultiheadAttention
from longsparse.nn.model import GeGLU, KVCache, RMSNorm, StaticKVCache, Transformer
from longsparse.nn.positions import POSITIONS, RoPE, alibi_slopes, nape_slopes, position_setup
from longsparse.nn.scalers import ASENTMAX_INITS, ASEntmaxScaler, SSMaxScaler, StaticASEntmaxScaler

__all__ = [
    "ModelConfig",
    "AttentionSettings",
    "Transformer",
    "GreedyGeneration",
    "Decoding",
    "FullForwardDecoding",
    "KVCacheDecoding",
    "StaticCacheDecoding",
    "CapturedStep",
    "Attention",
    "KVCache",
    "LayerCache",
    "StaticKVCache",
    "StaticLayerCache",
    "RMSNorm",
    "GeGLU",
    "RoPE",
    "alibi_slopes",
    "nape_slopes",
    "position_setup",
    "SSMaxScaler",
    "ASEntmaxScaler",
    "StaticASEntmaxScaler",
    "capture",
    "Capture",
    "EntmaxMultiheadAttention",
    "dense_logits",
    "METHODS",
    "POSITIONS",
    "ASENTMAX_INITS",
    "CAPTURE_KINDS",
]
