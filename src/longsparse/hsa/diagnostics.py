"""Per-example retrieval diagnostics of an HSAModel: does the query select the needle's chunk?

For every HSA layer ℓ, example b and query position p (the positions whose outputs predict the answer):

* ``selected[b, ℓ, p]``: some chunk holding a needle token is among the chunks p selects (recall@k; for
  entmax weights: has non-zero weight);
* ``rank[b, ℓ, p]``: 1 + the number of visible chunks scoring strictly higher than the best needle chunk
  (1 = the needle chunk is the top-scored chunk); NaN when no needle chunk is visible to p;
* ``weight[b, ℓ, p]``: total chunk weight on needle chunks.
* ``logits[b, p]``: the model's logits at the query positions (from the same pass).

``recall_at_k`` (B,) averages ``selected`` over layers and positions (NaN-free positions only).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor

from longsparse.hsa.fast import HSAFastEvaluator, select_positions
from longsparse.hsa.model import HSAModel
from longsparse.stats import wilson_interval


@torch.no_grad()
def retrieval_diagnostics(
    model: HSAModel,
    input_ids: Tensor,
    query_positions: Sequence[int],
    needle_positions: Sequence[Sequence[int]],
    *,
    fast: bool = True,
) -> Dict[str, Tensor]:
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
            logits = HSAFastEvaluator(model, input_ids).logits(query_positions, record)
        else:
            logits = model(input_ids, record=record)[:, list(query_positions)]
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
            s = r["scores"][b].float()  # (P, C), −inf where invisible
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
    return {"selected": selected, "rank": rank, "weight": weight, "recall_at_k": recall, "logits": logits}


def answer_positions(batch) -> List[int]:
    """The positions whose logits predict the answer tokens of a fixed-length seq2seq batch
    (prompt_len − 1 … prompt_len + target_len − 2)."""
    p = int(batch.prompt_len[0])
    w = int(batch.target_len.max())
    if not bool((batch.prompt_len == p).all()):
        raise ValueError("answer_positions needs equal prompt lengths in the batch")
    return list(range(p - 1, p + w - 1))


@torch.no_grad()
def needle_diagnostics(
    model: HSAModel, task, batch, *, fast: bool = True, positions: Optional[Sequence[int]] = None
) -> Dict[str, Tensor]:
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


@torch.no_grad()
def score_needles(
    model: HSAModel, task, length: int, samples: int, *, seed: int = 0, split: str = "test", batch_size: int = 1
) -> dict:
    """Needle diagnostics of ``samples`` examples of ``length``, drawn from the same seeded stream (and in the same
    batches) as ``longsparse.tasks.scoring.score_length``, so they describe the very examples it scores.

    One teacher-forced pass of the exact fast evaluator per batch gives, per example (answer positions = those
    predicting the answer tokens, i.e. without the one predicting EOS): ``recall`` (fraction of
    (HSA layer, answer position) pairs whose selection holds a needle chunk), ``full_recall`` (all of them do),
    ``rank`` and ``weight`` (means over layers and answer positions) and the teacher-forced exact match (argmax
    equals the target at every answer position, EOS included) — equal to greedy exact match, since greedy
    decoding produces the target iff every step's argmax given the correct prefix is the next target token.
    Returns JSON-able summaries incl. exact match given full recall and given a miss.

    A model without retrieval (``retrieval = "none"``, the sliding-window-only baseline) never selects a needle
    chunk: recall 0, needle weight 0, every example counts as a miss, and the rank is undefined (NaN)."""
    import math
    import time

    rng = task.rng(seed, split)
    was = model.training
    model.eval()
    rec, rk, wt, full, ex = [], [], [], [], []
    t0 = time.perf_counter()
    try:
        done = 0
        while done < samples:
            n = min(batch_size, samples - done)
            batch = task.batch(length, n, rng=rng)
            d = needle_diagnostics(model, task, batch)
            w = int(batch.target.shape[1])
            pred = d["logits"][:, :w].argmax(-1).cpu()
            mask = torch.arange(w)[None, :] < batch.target_len[:, None]
            ex += ((pred == batch.target) | ~mask).all(1).tolist()
            # retrieval is judged at the positions that predict answer tokens, not at the one predicting EOS
            # (the last target token), which needs no retrieval
            P = max(1, w - 1)
            sel, rank, weight = d["selected"][..., :P], d["rank"][..., :P], d["weight"][..., :P]
            valid = ~torch.isnan(rank)
            nval = valid.sum((1, 2))
            full += ((sel | ~valid).all(2).all(1) & (nval > 0)).tolist()
            rec += torch.where(
                nval > 0,
                (sel & valid).sum((1, 2)).float() / nval.clamp_min(1),
                torch.full_like(nval, float("nan"), dtype=torch.float),
            ).tolist()
            rk += (torch.where(valid, rank, torch.zeros_like(rank)).sum((1, 2)) / nval.clamp_min(1)).tolist()
            wt += weight.mean((1, 2)).tolist()
            if model.cfg.retrieval == "none":  # no HSA layer records a selection (rank: set below)
                rec[-n:] = [0.0] * n
                wt[-n:] = [0.0] * n
            done += n
    finally:
        model.train(was)

    def mean(xs):
        xs = [x for x in xs if not (isinstance(x, float) and math.isnan(x))]
        return sum(xs) / len(xs) if xs else None

    def rate(flags):
        k, n = sum(flags), len(flags)
        lo, hi = wilson_interval(k, n)
        return {"n": n, "k": k, "rate": (k / n) if n else None, "ci": [lo, hi]}

    hit = [e for e, f in zip(ex, full) if f]
    miss = [e for e, f in zip(ex, full) if not f]
    no_ret = model.cfg.retrieval == "none"
    return {
        "n": len(ex),
        "query_positions": "answer tokens (EOS excluded)",
        "retrieval": model.cfg.retrieval,
        "recall_at_k": mean(rec),
        "full_recall": rate(full),
        "mean_rank": float("nan") if no_ret else mean(rk),
        "mean_needle_weight": mean(wt),
        "exact_match_teacher_forced": rate(ex),
        "exact_match_given_recall": rate(hit),
        "exact_match_given_miss": rate(miss),
        "topk": model.cfg.topk,
        "weights": model.cfg.weights,
        "seconds": round(time.perf_counter() - t0, 3),
    }
