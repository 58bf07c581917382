"""Per-example retrieval diagnostics of an HSAModel: does the query select the needle's chunk?

For every HSA layer ℓ, example b and query position p (the positions whose outputs predict the answer):

* ``selected[b, ℓ, p]``: some chunk holding a needle token is among the chunks p selects (recall@k; for
  entmax weights: has non-zero weight);
* ``rank[b, ℓ, p]``: 1 + the number of visible chunks scoring strictly higher than the best needle chunk
  (1 = the needle chunk is the top-scored chunk); NaN when no needle chunk is visible to p;
* ``weight[b, ℓ, p]``: total chunk weight on needle chunks.

``recall_at_k`` (B,) averages ``selected`` over layers and positions (NaN-free positions only).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor

from longsparse.hsa.fast import HSAFastEvaluator, select_positions
from longsparse.hsa.model import HSAModel


@torch.no_grad()
def retrieval_diagnostics(model: HSAModel, input_ids: Tensor, query_positions: Sequence[int],
                          needle_positions: Sequence[Sequence[int]], *, fast: bool = True) -> Dict[str, Tensor]:
    """input_ids (B, N) (with the answer tokens teacher-forced if the query positions include them);
    query_positions: absolute positions shared by the rows; needle_positions[b]: the token positions of
    example b's needle (e.g. its value tokens). fast=True runs the exact long-context evaluator (any N);
    fast=False the full forward."""
    B = input_ids.shape[0]
    if len(needle_positions) != B:
        raise ValueError(f"needle_positions needs one list per row ({B}), got {len(needle_positions)}")
    S = model.cfg.chunk_size
    was = model.training
    model.eval()
    try:
        record: List[dict] = []
        if fast:
            HSAFastEvaluator(model, input_ids).logits(query_positions, record)
        else:
            model(input_ids, record=record)
        record = select_positions(record, query_positions)
    finally:
        model.train(was)
    L, P = len(record), len(query_positions)
    rank = torch.full((B, L, P), float("nan"))
    selected = torch.zeros(B, L, P, dtype=torch.bool)
    weight = torch.zeros(B, L, P)
    for b in range(B):
        chunks = sorted({int(p) // S for p in needle_positions[b]})
        for li, r in enumerate(record):
            C = r["scores"].shape[-1]
            cs = [c for c in chunks if c < C]
            if not cs:
                continue
            s = r["scores"][b].float()                           # (P, C), −inf where invisible
            t = torch.tensor(cs)
            st = s[:, t]
            vis = torch.isfinite(st)
            best = st.masked_fill(~vis, float("-inf")).amax(-1, keepdim=True)
            higher = (s > best) & torch.isfinite(s)
            rk = 1 + higher.sum(-1).float()
            rank[b, li] = torch.where(vis.any(-1), rk, torch.full_like(rk, float("nan")))
            selected[b, li] = r["selected"][b][:, t].any(-1)
            weight[b, li] = r["weights"][b][:, t].float().sum(-1)
    valid = ~torch.isnan(rank)
    denom = valid.sum((1, 2)).clamp_min(1)
    recall = (selected & valid).sum((1, 2)).float() / denom
    recall = torch.where(valid.any(2).any(1), recall, torch.full_like(recall, float("nan")))
    return {"selected": selected, "rank": rank, "weight": weight, "recall_at_k": recall}


def answer_positions(batch) -> List[int]:
    """The positions whose logits predict the answer tokens of a fixed-length seq2seq batch
    (prompt_len − 1 … prompt_len + target_len − 2)."""
    p = int(batch.prompt_len[0])
    w = int(batch.target_len.max())
    if not bool((batch.prompt_len == p).all()):
        raise ValueError("answer_positions needs equal prompt lengths in the batch")
    return list(range(p - 1, p + w - 1))


@torch.no_grad()
def needle_diagnostics(model: HSAModel, task, batch, *, fast: bool = True,
                       positions: Optional[Sequence[int]] = None) -> Dict[str, Tensor]:
    """Diagnostics of a RULER batch: needles located by ``task.needle_positions(batch)``; query positions =
    the answer positions (teacher-forced) unless given. Adds ``mean_rank``, ``mean_weight`` (B,)."""
    pos = answer_positions(batch) if positions is None else list(positions)
    n = max(pos) + 1
    out = retrieval_diagnostics(model, batch.input_ids[:, :n], pos, task.needle_positions(batch), fast=fast)
    rank = out["rank"]
    valid = ~torch.isnan(rank)
    out["mean_rank"] = torch.where(valid, rank, torch.zeros_like(rank)).sum((1, 2)) / valid.sum((1, 2)).clamp_min(1)
    out["mean_weight"] = out["weight"].mean((1, 2))
    return out
