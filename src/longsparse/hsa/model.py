"""The HSA decoder (docs/method.md §8, paper [B]).

    tokens → embed·√d → n_lower × [sliding-window block] → mid-depth states x_mid
    chunk memory (built once from x_mid, shared by every upper HSA layer):
        chunk c = positions [cS, (c+1)S); encoder input = x_mid of the chunk + a learned CLS appended;
        ``encoder_layers`` bidirectional blocks (RoPE with in-chunk positions 0..S, CLS at S);
        tokens_c = norm(encoder token outputs)   (the keys/values of the chunk, projected per layer)
        landmark_c = norm(CLS output | mean of encoder outputs | mean of x_mid of the chunk)
    n_upper layers in groups of ``upper_group_size``: [HSA block, sliding-window block × (g − 1)]
    → RMSNorm → untied LM head.

Blocks use the Gemma-2 "sandwich" norms of ``longsparse.nn``. With h = pre_norm(x):

    sliding-window block:  x ← x + n₁(SWA(h));                x ← x + n₂(MLP(n₃(x)))
    HSA block, standard:   x ← x + n₁(SWA(h)) + n₄(HSA(h));   x ← x + n₂(MLP(n₃(x)))
    HSA block, bypass:     x ← x + n₁(SWA(h));                x ← x + n₂(MLP(n₃(x + n₄(HSA(h)))))

n₁, n₂ of the sliding-window and encoder blocks and n₁ of the HSA block's local path start at gain
``branch_gain`` (0.01; HSAConfig) instead of 1, so that at initialisation these blocks are near identity
and the token identity survives into the chunk keys/values; n₂, n₄ of HSA blocks start at 1.
The local sliding-window path always stays on the residual stream (as in [B]); the retrieved
output HSA(h) is either added to it (standard) or only feeds the MLP input (bypass: x_out = x +
MLP(norm(x + HSA(x))) of docs/method.md §8 with the local path alongside).

HSA(h) at a token t with position p_t:
    q_r = W_qr·h_t  (retrieval="token")  or  W_qr·mean(h over the previous chunk) (retrieval="chunk"),
          times log(n_visible(t) + 1)^γ if ``length_scale`` is on;
    s_tc = q_r·W_kr·landmark_c / √d_r for visible chunks c ((c+1)S <= p_t, see ops.visible_chunks);
    (w_t, selected_t) = ops.chunk_weights(s_t)  — top-k + stick-breaking/softmax, or α-entmax;
    per head: o_tc = map_j(q_t·k_cj / √d_h) v_cj   over the S tokens of chunk c (NoPE, or RoPE
          with absolute positions); HSA(h)_t = W_o · Σ_c w_tc o_tc.
Retrieval selection and chunk weights are shared by all heads of a layer.

Layers. Every token attention is a ``longsparse.nn.Attention`` (its q/k/v/o projections, RoPE or ALiBi slopes,
length scaler and α) calling ``longsparse.attention``, so ``map`` above, and the softmax of the sliding windows
and the chunk encoder, is the config's ``method`` (softmax, entmax, asentmax, ...; default softmax as in [B]), and
the sliding windows and encoder use the config's ``positions`` (default RoPE; ALiBi without a direction,
−m·|i − j|, in the bidirectional encoder). Sliding-window and encoder blocks are ``longsparse.nn`` blocks.
Retrieval (landmark scores, chunk selection and weights) is HSA's own (``ops.chunk_weights``).

retrieval = "none" (the sliding-window-only baseline): HSA blocks have no retrieval branch (x ← x + n₁(SWA(h));
x ← x + n₂(MLP(n₃(x)))), no chunk memory is built and the chunk encoder has no layers, so the model is a pure
sliding-window decoder of n_lower + n_upper layers with the same widths.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor, nn

from longsparse.attention import attention
from longsparse.hsa.config import HSAConfig
from longsparse.hsa.fast import HSAFastEvaluator
from longsparse.hsa.ops import (
    ChunkMemory,
    chunk_weights,
    length_scale,
    sample_gumbel,
    sliding_window_attention,
    visible_chunks,
)
from longsparse.nn.attention import Attention
from longsparse.nn.generation import GreedyGeneration
from longsparse.nn.model import Block, GeGLU, RMSNorm
from longsparse.nn.scalers import ASEntmaxScaler


def _pad_rows(t: Tensor, n: int, dim: int, value=0) -> Tensor:
    """``t`` with ``n`` entries of ``value`` appended along ``dim``."""
    if n == 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat((t, t.new_full(shape, value)), dim)


class TokenAttention(Attention):
    """A ``longsparse.nn.Attention`` of an HSA model: its projections, positions (``positions``, default the
    config's), length scaler and α; the subclasses define which keys each query attends to and call
    ``longsparse.attention`` with the layer's mapping."""

    def __init__(self, cfg: HSAConfig, positions: Optional[str] = None):
        super().__init__(cfg.attention_config(positions))

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} defines no forward")

    def split(self, x: Tensor) -> Tensor:  # (..., N, H·Dh) → (..., H, N, Dh)
        return x.unflatten(-1, (self.n_heads, self.head_dim)).transpose(-2, -3)

    def merge(self, x: Tensor) -> Tensor:  # (B, H, N, Dh) → (B, N, H·Dh)
        return x.transpose(1, 2).flatten(2)

    def attention_kwargs(self) -> dict:
        """Everything this layer passes to ``longsparse.attention`` besides q, k, v, q_scale and masks."""
        return dict(
            scale=self.scale,
            chunk_size=self.cfg.attention.attn_chunk_size,
            backend=self.cfg.attention.attn_backend,
            **self.mapping_kwargs(),
        )

    def query_scale(self, h: Tensor, n_keys: Tensor) -> Optional[Tensor]:
        """The length scaler's q multipliers (B, H, N) for the queries h (B, N, d) that attend to n_keys (N,)
        keys each, or None without a scaler. A scaler is a function of the position i of a causal query, which
        attends to i + 1 keys: it is given i = n_keys − 1."""
        if self.scaler is None:
            return None
        return self.scaler(h, (n_keys - 1).to(h.device).expand(h.shape[0], -1))


class SlidingWindowAttention(TokenAttention):
    """Causal attention over the last ``window`` tokens (itself included)."""

    def __init__(self, cfg: HSAConfig):
        super().__init__(cfg)
        self.window = cfg.window

    def forward(self, h: Tensor, positions: Tensor, padding=None, cache=None, n_query: Optional[int] = None) -> Tensor:
        """h (B, N, d) of a contiguous span whose tokens sit at the absolute positions ``positions`` (N,)
        → (B, N, d). ``padding``, ``cache``, ``n_query``: the ``longsparse.nn`` block's call; not supported."""
        if padding is not None or cache is not None or n_query is not None:
            raise ValueError("sliding-window attention takes no padding, KV cache or n_query")
        q, k, v = self.split(self.q_proj(h)), self.split(self.k_proj(h)), self.split(self.v_proj(h))
        if self.rope is not None:
            q, k = self.rope(q, positions), self.rope(k, positions)
        q_scale = self.query_scale(h, positions.clamp_max(self.window - 1) + 1)
        out = sliding_window_attention(
            q, k, v, self.window, q_scale=q_scale, alibi_slopes=self.alibi_slopes, **self.attention_kwargs()
        )
        return self.o_proj(self.merge(out))


class ChunkEncoderAttention(TokenAttention):
    """Bidirectional attention among the S tokens of a chunk and its CLS (in-chunk positions 0..S)."""

    def forward(
        self, h: Tensor, positions: Optional[Tensor] = None, padding=None, cache=None, n_query: Optional[int] = None
    ) -> Tensor:
        """h (M, S + 1, d) → (M, S + 1, d). ``positions``, ``padding``, ``cache``, ``n_query``: the
        ``longsparse.nn`` block's call; the positions are the in-chunk ones, the rest is not supported."""
        if padding is not None or cache is not None or n_query is not None:
            raise ValueError("chunk-encoder attention takes no padding, KV cache or n_query")
        L = h.shape[1]
        pos = torch.arange(L, device=h.device)
        q, k, v = self.split(self.q_proj(h)), self.split(self.k_proj(h)), self.split(self.v_proj(h))
        if self.rope is not None:
            q, k = self.rope(q, pos), self.rope(k, pos)
        out = attention(  # non-causal ALiBi is symmetric, −m_h·|i − j| (attention/logits.py)
            q,
            k,
            v,
            is_causal=False,
            q_scale=self.query_scale(h, torch.full_like(pos, L)),
            alibi_slopes=self.alibi_slopes,
            **self.attention_kwargs(),
        )
        return self.o_proj(self.merge(out))


class SWABlock(Block):
    """A ``longsparse.nn`` block whose attention is a sliding window."""

    def __init__(self, cfg: HSAConfig):
        super().__init__(cfg.attention_config(), 0, attn=SlidingWindowAttention(cfg))

    def forward(self, x: Tensor, positions: Tensor, memory=None, record=None) -> Tensor:
        return super().forward(x, positions)


class EncoderBlock(Block):
    """A ``longsparse.nn`` block whose attention is bidirectional over one chunk (+ CLS)."""

    def __init__(self, cfg: HSAConfig):
        super().__init__(cfg.attention_config(), 0, attn=ChunkEncoderAttention(cfg))

    def forward(self, x: Tensor) -> Tensor:  # x (M, S+1, d)
        return super().forward(x, None)


class ChunkEncoder(nn.Module):
    def __init__(self, cfg: HSAConfig):
        super().__init__()
        self.cfg = cfg
        self.cls = nn.Parameter(torch.zeros(cfg.d_model))
        n_layers = 0 if cfg.retrieval == "none" else cfg.encoder_layers  # no memory, no encoder
        self.layers = nn.ModuleList(EncoderBlock(cfg) for _ in range(n_layers))
        self.token_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.landmark_norm = RMSNorm(cfg.d_model, cfg.norm_eps)

    def forward(self, mid: Tensor):
        """mid (B, C, S, d) → landmarks (B, C, d), tokens (B, C, S, d)."""
        B, C, S, d = mid.shape
        x = mid.reshape(B * C, S, d)
        if self.layers:
            x = torch.cat((x, self.cls.to(x.dtype).expand(B * C, 1, d)), 1)
            for layer in self.layers:
                x = layer(x)
            tok, cls = x[:, :S], x[:, S]
        else:
            tok, cls = x, None
        lm = self.cfg.landmark
        if lm == "encoder_cls":
            land = cls
        elif lm == "encoder_mean":
            land = tok.mean(1)
        else:
            land = mid.reshape(B * C, S, d).mean(1)
        return self.landmark_norm(land).view(B, C, d), self.token_norm(tok).view(B, C, S, d)


class HSAAttention(TokenAttention):
    """Chunk retrieval + attention inside the selected chunks (see the module docstring). The projections,
    positions (``hsa_positions``), scaler and mapping of the attention inside chunks are the
    ``longsparse.nn.Attention`` ones; ``hsa_cfg`` is the model's HSAConfig (``cfg``: the attention's ModelConfig)."""

    def __init__(self, cfg: HSAConfig):
        super().__init__(cfg, cfg.hsa_positions)
        self.hsa_cfg = cfg
        self.q_ret = nn.Linear(cfg.d_model, cfg.retrieval_dim, bias=False)
        self.k_ret = nn.Linear(cfg.d_model, cfg.retrieval_dim, bias=False)
        self.ret_scale = 1.0 / math.sqrt(cfg.retrieval_dim)
        self.warmup_selection = False
        if cfg.length_scale == "learned":
            self.gamma = nn.Parameter(torch.tensor(float(cfg.length_gamma)))
        else:
            self.register_buffer("gamma", torch.tensor(float(cfg.length_gamma)), persistent=False)

    # -- retrieval ------------------------------------------------------------------------------------
    def retrieval_query(self, h: Tensor, positions: Tensor) -> Tensor:
        cfg = self.hsa_cfg
        S = cfg.chunk_size
        if cfg.retrieval == "token":
            q = self.q_ret(h)
        else:
            # per-chunk: the tokens of chunk j share the query W_qr·mean(h over chunk j−1)
            j = torch.div(positions, S, rounding_mode="floor")
            r = j - j[0]
            R = int(r[-1]) + 1
            sums = h.new_zeros(h.shape[0], R, h.shape[2]).index_add_(1, r, h)
            cnt = torch.zeros(R, dtype=h.dtype, device=h.device).index_add_(0, r, torch.ones_like(r, dtype=h.dtype))
            means = sums / cnt[None, :, None]
            prev = r - 1
            qm = self.q_ret(means)  # (B, R, dr)
            q = torch.where((prev >= 0)[None, :, None], qm[:, prev.clamp_min(0)], torch.zeros_like(qm[:, :1]))
        if cfg.length_scale != "none":
            q = q * length_scale(positions, S, self.gamma).to(q.dtype)[None, :, None]
        return q

    def scores(self, h: Tensor, positions: Tensor, memory: ChunkMemory) -> Tensor:
        q = self.retrieval_query(h, positions)
        k = self.k_ret(memory.landmarks)
        return torch.matmul(q, k.transpose(-1, -2)) * self.ret_scale  # (B, N, C)

    def select(self, h: Tensor, positions: Tensor, memory: ChunkMemory):
        cfg = self.hsa_cfg
        s = self.scores(h, positions, memory)
        vis = visible_chunks(positions, memory.n_chunks, cfg.chunk_size)[None]
        noise = None
        if self.training and cfg.gumbel_noise > 0:
            noise = cfg.gumbel_noise * sample_gumbel(s.shape, s.device).to(s.dtype)
        weights, topk = cfg.weights, cfg.topk
        if self.training and self.warmup_selection:  # HSAConfig.select_warmup (set by HSAModel)
            weights, topk = "softmax", cfg.select_warmup_topk
        w, sel = chunk_weights(
            s,
            vis,
            weights=weights,
            topk=topk,
            alpha=cfg.entmax_alpha,
            cap=cfg.entmax_cap if weights == "entmax" else None,
            noise=noise,
        )
        return s, vis, w, sel

    # -- forward --------------------------------------------------------------------------------------
    def forward(self, h: Tensor, positions: Tensor, memory: ChunkMemory, record: Optional[list] = None) -> Tensor:
        B, N, _ = h.shape
        cfg = self.hsa_cfg
        if memory.n_chunks == 0:
            return h.new_zeros(B, N, cfg.d_model) if record is None else self._record_empty(record, h)
        s, vis, w, sel = self.select(h, positions, memory)
        if record is not None:
            record.append(
                dict(
                    scores=s.masked_fill(~vis, float("-inf")).detach(),
                    weights=w.detach(),
                    selected=sel.detach(),
                    positions=positions.detach(),
                )
            )
        q = self.split(self.q_proj(h))  # (B, H, N, Dh)
        if self.rope is not None:
            q = self.rope(q, positions)
        q_scale = self.query_scale(h, torch.full_like(positions, cfg.chunk_size))
        if cfg.hsa_impl == "dense" and memory.tokens is not None:
            out = self._by_chunk(q, q_scale, w, sel, memory)
        else:
            out = self._by_query(q, q_scale, s, w, sel, memory)
        return self.o_proj(self.merge(out))

    def _record_empty(self, record, h):
        z = h.new_zeros(h.shape[0], h.shape[1], 0)
        record.append(dict(scores=z, weights=z, selected=z.bool(), positions=None))
        return h.new_zeros(h.shape[0], h.shape[1], self.hsa_cfg.d_model)

    def chunk_kv(self, tokens: Tensor, chunk_ids: Tensor) -> Tuple[Tensor, Tensor]:
        """Keys and values (B, U, H, S, Dh) of the chunks ``chunk_ids`` (U,) from their token states tokens
        (B, U, S, d); RoPE (``hsa_positions``) with the tokens' absolute positions."""
        k, v = self.split(self.k_proj(tokens)), self.split(self.v_proj(tokens))
        if self.rope is not None:
            B, U, H, S, Dh = k.shape
            pos = chunk_ids[:, None] * S + torch.arange(S, device=k.device)  # (U, S)
            k = self.rope(k.reshape(B * U, H, S, Dh), pos.expand(B, U, S).reshape(B * U, S)).view(B, U, H, S, Dh)
        return k, v

    def _by_chunk(self, q: Tensor, q_scale: Optional[Tensor], w: Tensor, sel: Tensor, memory: ChunkMemory) -> Tensor:
        """Chunk-major (``hsa_impl="dense"``, training): the queries in blocks of S rows, each block against
        every chunk that one of its queries selected — one S × S attention per (block, chunk) pair; the rows
        that did not select the chunk get weight 0 from it. q (B, H, N, Dh), q_scale (B, H, N), w and sel
        (B, N, C) → (B, H, N, Dh)."""
        B, H, N, Dh = q.shape
        S, C = self.hsa_cfg.chunk_size, memory.n_chunks
        G = -(-N // S)
        pad = G * S - N
        b, g, c = _pad_rows(sel, pad, 1, False).view(B, G, S, C).any(2).nonzero(as_tuple=True)
        if b.numel() == 0:
            return q.new_zeros(B, H, N, Dh)
        k, v = self.chunk_kv(memory.tokens, torch.arange(C, device=q.device))  # (B, C, H, S, Dh)
        qb = _pad_rows(q, pad, 2).view(B, H, G, S, Dh).transpose(1, 2)  # (B, G, H, S, Dh)
        qs = None if q_scale is None else _pad_rows(q_scale, pad, 2, 1.0).view(B, H, G, S).transpose(1, 2)[b, g]
        o = attention(qb[b, g], k[b, c], v[b, c], is_causal=False, q_scale=qs, **self.attention_kwargs())
        wb = _pad_rows(w, pad, 1).view(B, G, S, C)[b, g, :, c]  # (P, S)
        out = q.new_zeros(B * G, H, S, Dh).index_add_(0, b * G + g, o * wb[:, None, :, None].to(o.dtype))
        return out.view(B, G, H, S, Dh).transpose(1, 2).reshape(B, H, G * S, Dh)[:, :, :N]

    def _by_query(
        self, q: Tensor, q_scale: Optional[Tensor], s: Tensor, w: Tensor, sel: Tensor, memory: ChunkMemory
    ) -> Tensor:
        """Query-major (``hsa_impl="gather"``, the long-context evaluator): each query against its selected
        chunks only — one 1 × S attention per (query, selected chunk), O(N·K·S); chunk keys/values are
        computed once per distinct chunk."""
        B, H, N, Dh = q.shape
        K = int(sel.sum(-1).max()) if sel.numel() else 0
        if K == 0:
            return q.new_zeros(B, H, N, Dh)
        idx = torch.where(sel, s, torch.full_like(s, float("-inf"))).topk(K, -1).indices  # (B, N, K)
        gsel = sel.gather(-1, idx)
        first = torch.where(gsel[..., :1], idx[..., :1], torch.zeros_like(idx[..., :1]))
        idx = torch.where(gsel, idx, first)  # unselected slots: a harmless valid id
        wg = torch.where(gsel, w.gather(-1, idx), torch.zeros_like(w[..., :1]))
        tokens, chunk_ids, slot = memory.chunk_table(idx)
        k, v = self.chunk_kv(tokens, chunk_ids)  # (B, U, H, S, Dh)
        S = k.shape[3]
        rows = torch.arange(B, device=q.device)[:, None, None]
        kg, vg = (t[rows, slot].reshape(B * N * K, H, S, Dh) for t in (k, v))
        qg = q.transpose(1, 2)[:, :, None].expand(B, N, K, H, Dh).reshape(B * N * K, H, 1, Dh)
        qs = (
            None if q_scale is None else q_scale.transpose(1, 2)[:, :, None].expand(B, N, K, H).reshape(B * N * K, H, 1)
        )
        o = attention(qg, kg, vg, is_causal=False, q_scale=qs, **self.attention_kwargs()).view(B, N, K, H, Dh)
        return (o * wg[..., None, None].to(o.dtype)).sum(2).transpose(1, 2)


class HSABlock(nn.Module):
    def __init__(self, cfg: HSAConfig):
        super().__init__()
        d = cfg.d_model
        self.cfg = cfg
        self.pre_attn_norm, self.post_attn_norm = RMSNorm(d, cfg.norm_eps), RMSNorm(d, cfg.norm_eps)
        self.pre_mlp_norm, self.post_mlp_norm = RMSNorm(d, cfg.norm_eps), RMSNorm(d, cfg.norm_eps)
        self.attn = SlidingWindowAttention(cfg) if cfg.hsa_local else None
        if cfg.retrieval == "none":  # sliding-window-only baseline: the local path alone
            self.post_hsa_norm, self.hsa = None, None
        else:
            self.post_hsa_norm = RMSNorm(d, cfg.norm_eps)
            self.hsa = HSAAttention(cfg)
        self.mlp = GeGLU(d, cfg.d_ff)

    def forward(
        self, x: Tensor, positions: Tensor, memory: Optional[ChunkMemory], record: Optional[list] = None
    ) -> Tensor:
        h = self.pre_attn_norm(x)
        if self.hsa is None:
            x = x + self.post_attn_norm(self.attn(h, positions))
            return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))
        r = self.post_hsa_norm(self.hsa(h, positions, memory, record))
        if self.attn is not None:
            x = x + self.post_attn_norm(self.attn(h, positions))
        if self.cfg.fusion == "standard":
            x = x + r
            return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))
        return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x + r)))


class HSAModel(GreedyGeneration, nn.Module):
    """Hierarchical sparse attention decoder. ``forward(input_ids, attention_mask=None, record=None)``
    → logits (B, N, V). Rows may be right-padded (causal: pads never influence real positions);
    ``record``: a list that receives, per HSA layer, dict(scores, weights, selected, positions).

    ``generate`` is the decoder's greedy decoding (``longsparse.nn.GreedyGeneration``), its incremental path the
    long-context evaluator (``cached_decoding``). Chunks and sliding windows are laid out by absolute position, so
    a left-padded batch is decoded one row at a time without its pads (``decodes_padded_rows = False``)."""

    decodes_padded_rows = False
    static_decoding_refusal = (
        "HSA decodes through its long-context evaluator, whose steps select chunks and grow their chunk memory "
        "(no step of fixed shapes)"
    )

    def __init__(self, cfg: HSAConfig):
        super().__init__()
        if not isinstance(cfg, HSAConfig):
            raise TypeError(f"expected an HSAConfig, got {type(cfg).__name__}")
        cfg.validate()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embed_scale = math.sqrt(cfg.d_model)
        self.lower = nn.ModuleList(SWABlock(cfg) for _ in range(cfg.n_lower))
        self.encoder = ChunkEncoder(cfg)
        self.upper = nn.ModuleList(HSABlock(cfg) if cfg.is_hsa_layer(i) else SWABlock(cfg) for i in range(cfg.n_upper))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.select_warmup > 0:  # training forward passes so far (HSAConfig.select_warmup)
            self.register_buffer("select_steps", torch.zeros((), dtype=torch.long))
        self.reset_parameters()

    @property
    def config(self) -> HSAConfig:
        return self.cfg

    def reset_parameters(self) -> None:
        cfg = self.cfg
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, cfg.init_std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for m in self.modules():  # the length scalers' own initialisation wins (as in nn.Transformer)
            if isinstance(m, ASEntmaxScaler):
                m.reset_parameters()
        # the CLS starts small (init_std, like the encoder branches at branch_gain) so that its output, the
        # landmark, is dominated by what the encoder pooled from the chunk rather than by a constant vector
        nn.init.normal_(self.encoder.cls, 0.0, cfg.init_std)
        for norm in self.branch_norms():
            nn.init.constant_(norm.weight, float(cfg.branch_gain))

    def branch_norms(self) -> List[RMSNorm]:
        """The post-branch RMSNorms initialised at ``branch_gain`` (see HSAConfig): sliding-window blocks,
        encoder blocks and the local path of HSA blocks."""
        out = []
        for b in list(self.lower) + list(self.encoder.layers) + list(self.upper):
            if isinstance(b, HSABlock):
                if b.attn is not None:
                    out.append(b.post_attn_norm)
            else:
                out += [b.post_attn_norm, b.post_mlp_norm]
        return out

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def hsa_layers(self) -> List[HSAAttention]:
        return [b.hsa for b in self.upper if isinstance(b, HSABlock) and b.hsa is not None]

    # -- pieces (the long-context evaluator runs them on spans) ---------------------------------------
    def run_lower(self, input_ids: Tensor, start: int = 0) -> Tensor:
        """Mid-depth states of the tokens ``input_ids`` sitting at positions start, start+1, ... ."""
        positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
        x = self.embed(input_ids) * self.embed_scale
        for block in self.lower:
            x = block(x, positions)
        return x

    def encode_chunks(self, mid: Tensor):
        """mid (B, C·S, d) (chunk-aligned) → landmarks (B, C, d), tokens (B, C, S, d)."""
        B, N, d = mid.shape
        S = self.cfg.chunk_size
        return self.encoder(mid.view(B, N // S, S, d))

    def build_memory(self, mid: Tensor) -> ChunkMemory:
        if self.cfg.retrieval == "none":  # nothing reads the memory: an empty one, no encoder pass
            return ChunkMemory(mid.new_zeros(mid.shape[0], 0, mid.shape[2]), None)
        C = mid.shape[1] // self.cfg.chunk_size
        land, tok = self.encode_chunks(mid[:, : C * self.cfg.chunk_size])
        return ChunkMemory(land, tok)

    def run_upper(self, x: Tensor, positions: Tensor, memory: ChunkMemory, record: Optional[list] = None) -> Tensor:
        for block in self.upper:
            x = block(x, positions, memory, record)
        return x

    def head(self, x: Tensor) -> Tensor:
        return self.lm_head(self.final_norm(x))

    def forward(
        self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, record: Optional[list] = None
    ) -> Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (B, N), got {tuple(input_ids.shape)}")
        if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(
                f"attention_mask must have shape {tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}"
            )
        if self.cfg.select_warmup > 0:
            warm = self.training and int(self.select_steps) < self.cfg.select_warmup
            for layer in self.hsa_layers():
                layer.warmup_selection = warm
            if self.training:
                self.select_steps += 1
        mid = self.run_lower(input_ids)
        memory = self.build_memory(mid)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.head(self.run_upper(mid, positions, memory, record))

    def cached_decoding(self, prompt_ids: Tensor, mask: Tensor):
        """Greedy decoding's incremental path (``longsparse.nn.GreedyGeneration.generate``): the long-context
        evaluator (``HSAFastEvaluator``: chunk landmarks kept, the upper layers run only on the receptive field of
        the new position; exact). ``mask`` is all real here (``decodes_padded_rows`` is False)."""
        return HSAFastEvaluator(self, prompt_ids)
