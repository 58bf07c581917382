"""HSAConfig: every knob of the hierarchical sparse attention model (docs/method.md §8), validated, and
round-trippable as a plain dict. Its token attention (method, positions, α, scalers, backend) is a
``longsparse.nn.AttentionSettings``, the decoder's, its field ``attention`` (stored as the nested table
``attention``: ``longsparse.nn.config.stored_form``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Dict, Optional

from longsparse.nn.config import AttentionSettings, ModelConfig, from_stored_form, own_attention, stored_form

LANDMARKS = ("encoder_cls", "encoder_mean", "mean")
FUSIONS = ("bypass", "standard")
WEIGHTS = ("stickbreaking", "softmax", "entmax")
RETRIEVALS = ("token", "chunk", "none")
HSA_POSITIONS = ("nope", "rope")
LENGTH_SCALES = ("none", "fixed", "learned")
HSA_IMPLS = ("dense", "gather")


def hsa_attention_defaults() -> AttentionSettings:
    """The token attention of [B]: softmax with RoPE."""
    return AttentionSettings(method="softmax", positions="rope")


@dataclass
class HSAConfig:
    """Hierarchical sparse attention decoder (docs/method.md §8, paper [B]); defaults = the CPU scale of docs/method.md §8.

    Layout: ``n_lower`` sliding-window (RoPE, softmax) layers → chunk memory (``encoder_layers``
    bidirectional layers over each chunk of ``chunk_size`` tokens + a learned CLS) → ``n_upper`` layers
    in groups of ``upper_group_size``: the first layer of each group is an HSA layer (retrieval +
    local sliding-window path), the others plain sliding-window layers.

    landmark: encoder_cls (CLS output; paper) | encoder_mean (mean of the encoder's token outputs) |
      mean (mean of the chunk's mid-depth hidden states, no encoder needed for the landmark).
    fusion: bypass (the HSA output feeds only the MLP input) | standard (added to the residual).
    weights: stickbreaking (paper default; recency ordered) | softmax (over the selected top-k) |
      entmax (α-entmax over all visible chunks, ``entmax_alpha``; ``entmax_cap`` keeps at most that many
      non-zero weights; ``topk`` is then unused).
    retrieval: token (each token its own retrieval query; paper) | chunk (one query per chunk of tokens:
      the mean of the previous chunk's normalised layer inputs, shared by all tokens of the chunk) |
      none (the sliding-window-only baseline: HSA layers keep only their local sliding-window path — no
      retrieval, no chunk memory, so nothing beyond the (n_lower + n_upper)·(window − 1) receptive field is
      read; needs ``hsa_local``; landmark/encoder/selection fields are then unused).
    hsa_positions: nope (paper) | rope (absolute positions inside retrieved chunks).
    attention: the token attention of every layer, a ``longsparse.nn.AttentionSettings`` (one
      ``longsparse.nn.Attention`` per layer, calling ``longsparse.attention``; stored as the table ``attention``):
      ``method`` (mapping + length scaler) in the sliding windows, the chunk encoder and inside retrieved chunks;
      ``positions`` in the sliding windows and the chunk encoder (inside retrieved chunks: ``hsa_positions``);
      ``attention.topk`` is the k of the top-k mapping (``topk`` here counts retrieved chunks). Defaults:
      softmax and RoPE, the model of [B]. Length scalers (ssmax, asentmax) see each query as attending to the
      keys it has: min(t + 1, window) in a sliding window, S + 1 in the chunk encoder, S in a retrieved chunk.
    length_scale: ASEntmax-style multiplier log(n_visible + 1)^γ of the retrieval query: none | fixed γ =
      ``length_gamma`` | learned γ (one per HSA layer, initialised at ``length_gamma``).
    gumbel_noise: scale of Gumbel noise added to retrieval scores *for the discrete selection only*
      (top-k, or the entmax cap) while training; 0 = off.
    select_warmup: a selection curriculum — the first ``select_warmup`` training forward passes (counted by the
      persistent buffer ``HSAModel.select_steps``, so resume is exact) select with softmax weights over the
      top-``select_warmup_topk`` chunks instead of ``weights``/``topk``; afterwards, and always in eval mode,
      the configured selection. 0 = off.
    hsa_local: keep the sliding-window local path inside HSA layers (paper: yes).
    hsa_impl: dense (scores every chunk; O(N²/S·S) — training) | gather (only the selected chunks; what
      the long-context evaluator uses). Both are exact and tested equal.
    branch_gain: initial gain of the post-branch ("sandwich") RMSNorms of the residual branches that mix
      tokens before / beside retrieval: the sliding-window blocks (lower and upper), the chunk-encoder
      blocks and the local path of HSA blocks (the HSA block's retrieval output and MLP keep gain 1).
      A post-norm fixes a branch's output RMS to its gain whatever the weights' init, while the token
      embeddings start at RMS init_std·√d (0.16 at d = 64): with gain 1 every such block overwrites the
      token identity with a near-uniform window/chunk average, the chunk keys/values lose the value tokens
      and the model never leaves chance (docs/reports/2026-11-21-hsa-recipe-search.md). Small gains start these
      blocks near identity (as LayerScale / ReZero do); they are trained.
    """

    STORED_KEYS: ClassVar[tuple] = (
        "vocab_size",
        "d_model",
        "n_heads",
        "head_dim",
        "d_ff",
        "n_lower",
        "n_upper",
        "upper_group_size",
        "encoder_layers",
        "chunk_size",
        "window",
        "topk",
        "landmark",
        "fusion",
        "weights",
        "retrieval",
        "hsa_positions",
        "retrieval_dim",
        "entmax_alpha",
        "entmax_cap",
        "length_scale",
        "length_gamma",
        "gumbel_noise",
        "select_warmup",
        "select_warmup_topk",
        "hsa_local",
        "hsa_impl",
        "norm_eps",
        "init_std",
        "branch_gain",
    )

    vocab_size: int
    d_model: int = 128
    n_heads: int = 4
    head_dim: Optional[int] = None
    d_ff: int = 256
    n_lower: int = 2
    n_upper: int = 2
    upper_group_size: int = 1
    encoder_layers: int = 1
    chunk_size: int = 16
    window: int = 32
    topk: int = 2
    landmark: str = "encoder_cls"
    fusion: str = "bypass"
    weights: str = "stickbreaking"
    retrieval: str = "token"
    hsa_positions: str = "nope"
    retrieval_dim: Optional[int] = None  # default head_dim
    entmax_alpha: float = 1.5
    entmax_cap: Optional[int] = None
    length_scale: str = "none"
    length_gamma: float = 1.0
    gumbel_noise: float = 0.0
    select_warmup: int = 0
    select_warmup_topk: int = 4
    hsa_local: bool = True
    hsa_impl: str = "dense"
    norm_eps: float = 1e-6
    init_std: float = 0.02
    branch_gain: float = 0.01
    attention: AttentionSettings = field(default_factory=hsa_attention_defaults, kw_only=True)

    def __post_init__(self):
        own_attention(self)
        if self.head_dim is None and isinstance(self.n_heads, int) and self.n_heads > 0:
            self.head_dim = self.d_model // self.n_heads
        if self.retrieval_dim is None:
            self.retrieval_dim = self.head_dim
        self.validate()

    @property
    def n_hsa_layers(self) -> int:
        return self.n_upper // self.upper_group_size

    def is_hsa_layer(self, upper_idx: int) -> bool:
        return upper_idx % self.upper_group_size == 0

    def validate(self) -> None:
        def pos_int(name, lo=1):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")

        for name in (
            "vocab_size",
            "d_model",
            "n_heads",
            "head_dim",
            "d_ff",
            "n_upper",
            "upper_group_size",
            "chunk_size",
            "window",
            "topk",
            "retrieval_dim",
        ):
            pos_int(name)
        pos_int("n_lower", 0)
        pos_int("select_warmup", 0)
        pos_int("select_warmup_topk")
        pos_int("encoder_layers", 0)
        if self.encoder_layers > 2:
            raise ValueError(f"encoder_layers must be 0, 1 or 2, got {self.encoder_layers}")
        if self.n_upper % self.upper_group_size:
            raise ValueError(
                f"n_upper ({self.n_upper}) must be a multiple of upper_group_size ({self.upper_group_size})"
            )
        for name, allowed in (
            ("landmark", LANDMARKS),
            ("fusion", FUSIONS),
            ("weights", WEIGHTS),
            ("retrieval", RETRIEVALS),
            ("hsa_positions", HSA_POSITIONS),
            ("length_scale", LENGTH_SCALES),
            ("hsa_impl", HSA_IMPLS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose one of {', '.join(allowed)}")
        if self.retrieval == "none" and not self.hsa_local:
            raise ValueError(
                "retrieval='none' (sliding-window-only baseline) needs hsa_local=True: without "
                "retrieval and without the local path an HSA layer would attend to nothing"
            )
        if self.landmark in ("encoder_cls", "encoder_mean") and self.encoder_layers == 0:
            raise ValueError(
                f"landmark={self.landmark!r} needs encoder_layers >= 1 (use landmark='mean' without an encoder)"
            )
        if not self.entmax_alpha > 1:
            raise ValueError(f"entmax_alpha must be > 1, got {self.entmax_alpha}")
        if self.entmax_cap is not None:
            pos_int("entmax_cap")
            if self.weights != "entmax":
                raise ValueError("entmax_cap only applies to weights='entmax'")
        if not self.gumbel_noise >= 0:
            raise ValueError(f"gumbel_noise must be >= 0, got {self.gumbel_noise}")
        if self.gumbel_noise > 0 and self.weights == "entmax" and self.entmax_cap is None:
            raise ValueError(
                "gumbel_noise perturbs the discrete selection (top-k or the entmax cap); "
                "uncapped entmax has none — set entmax_cap or gumbel_noise=0"
            )
        if not self.length_gamma >= 0:
            raise ValueError(f"length_gamma must be >= 0, got {self.length_gamma}")
        if self.hsa_positions == "rope" and self.head_dim % 2:
            raise ValueError(f"hsa_positions='rope' needs an even head_dim, got {self.head_dim}")
        self.attention.validate(self.n_heads, self.head_dim)
        if self.norm_eps <= 0 or self.init_std <= 0:
            raise ValueError("norm_eps and init_std must be > 0")
        if (
            isinstance(self.branch_gain, bool)
            or not isinstance(self.branch_gain, (int, float))
            or not self.branch_gain >= 0
        ):
            raise ValueError(f"branch_gain must be a number >= 0, got {self.branch_gain!r}")

    def attention_config(self, positions: Optional[str] = None) -> ModelConfig:
        """The ``ModelConfig`` of this model's ``longsparse.nn.Attention`` layers with the given positions
        (default ``positions``; the attention inside retrieved chunks uses ``hsa_positions``). Its ``n_layers``
        is unused (1); its settings are a copy of ``attention``."""
        return ModelConfig(
            vocab_size=self.vocab_size,
            d_model=self.d_model,
            n_layers=1,
            n_heads=self.n_heads,
            head_dim=self.head_dim,
            d_ff=self.d_ff,
            norm_eps=self.norm_eps,
            init_std=self.init_std,
            attention=self.attention if positions is None else replace(self.attention, positions=positions),
        )

    def to_dict(self) -> Dict[str, Any]:
        """The stored form: every key of ``STORED_KEYS``, then ``attention``: every settings field."""
        return stored_form(self, self.STORED_KEYS)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "HSAConfig":
        """The config of its stored form (``to_dict``); strict: unknown keys and values of the wrong type raise
        ValueError naming them; a key left out takes its default."""
        return from_stored_form(cls, d)
