"""Evaluation of an LM run: perplexity vs context length, per-position loss, passkey retrieval.

Perplexity vs context length (``perplexity_by_length``). From the test stream (the held-out works joined with
``<|endoftext|>``) ``n_windows`` evenly spaced, non-overlapping blocks of ``L_max + 1`` tokens are taken
(``M = n_windows · L_max`` target tokens). For every context length L the *same* M target tokens are scored:
each block is cut into consecutive windows of L tokens (inputs ``b[iL : (i+1)L]``, targets
``b[iL+1 : (i+1)L+1]``), with no state carried between windows. So every L
predicts identical tokens and differs only in how much context is available (0 … L−1 tokens before each
prediction): ppl(L) = exp(mean NLL over the M targets). A model that uses longer context has ppl falling
with L; a model that breaks beyond its training length T has ppl rising past L = T.

Per-position loss (``loss_by_position``): for the windows of the longest length, the NLL at every position p
averaged over windows — the curve that shows where (at which distance from the window start) a model breaks.
Reported raw and in buckets [0, T/4), [T/4, T/2), [T/2, T), [T, 2T), … . ``brute_force_loss_by_position``
recomputes it with one forward pass per prefix (the test oracle: a causal model must agree).

Passkey (``passkey_accuracy``): ``longsparse.lm.passkey`` examples whose haystack is held-out text, at total
lengths ``mult · T`` and depths 0, 0.25, …, 1; exact match of all digits (teacher-forced argmax ⇔ greedy), plus
per-digit accuracy and the NLL of the answer digits.
"""

from __future__ import annotations

import math
import random
from typing import Dict, List, Sequence

import torch
import torch.nn.functional as F

from longsparse.lm.passkey import PasskeyMaker


@torch.no_grad()
def token_nll(model, inputs: torch.Tensor, targets: torch.Tensor, batch_tokens: int = 16384) -> torch.Tensor:
    """(W, L) per-token NLL of ``targets`` given ``inputs`` (both (W, L)), in batches of ≈ batch_tokens."""
    model.eval()
    W, L = inputs.shape
    bs = max(1, batch_tokens // L)
    out = []
    for i in range(0, W, bs):
        logits = model(inputs[i : i + bs]).float()
        out.append(F.cross_entropy(logits.flatten(0, 1), targets[i : i + bs].flatten(), reduction="none").view(-1, L))
    return torch.cat(out)


def eval_blocks(stream: torch.Tensor, n_blocks: int, block_len: int) -> torch.Tensor:
    """(n_blocks, block_len + 1): ``n_blocks`` evenly spaced, non-overlapping stretches of the stream."""
    need = block_len + 1
    if len(stream) < n_blocks * need:
        raise ValueError(f"test stream has {len(stream)} tokens; {n_blocks} blocks of {need} need {n_blocks * need}")
    if n_blocks == 1:
        starts = [0]
    else:
        gap = (len(stream) - need) // (n_blocks - 1)
        starts = [k * gap for k in range(n_blocks)]
    return torch.stack([stream[s : s + need] for s in starts])


def windows(blocks: torch.Tensor, L: int):
    """Cut every block into consecutive windows of L targets: inputs/targets (n_blocks · block_len / L, L)."""
    n, need = blocks.shape
    if (need - 1) % L:
        raise ValueError(f"block of {need - 1} targets is not a multiple of L={L}")
    return blocks[:, :-1].reshape(-1, L), blocks[:, 1:].reshape(-1, L)


def perplexity_by_length(
    model,
    stream: torch.Tensor,
    lengths: Sequence[int],
    n_windows: int,
    batch_tokens: int = 16384,
    ref_length: int | None = None,
) -> Dict[int, dict]:
    """{L: {"nll", "ppl", "n_targets"}} on the same ``n_windows · max(lengths)`` target tokens; plus, for the
    longest L, ``"per_position"`` (list of the mean NLL at each position) and, if ``ref_length`` (one of
    ``lengths``) is given, ``"per_position_delta"``: the mean over windows of NLL(token at position p of an
    L_max-window) − NLL(the same token scored in ``ref_length``-windows). The targets are identical, so the
    content of the text cancels and only the effect of the longer context remains (0 for p < ref_length's
    first window; < 0 where the extra context helps, > 0 where it hurts)."""
    Lmax = max(lengths)
    blocks = eval_blocks(stream, n_windows, Lmax)
    res, flat = {}, {}
    for L in sorted(lengths):
        x, y = windows(blocks, L)
        nll = token_nll(model, x, y, batch_tokens)
        flat[L] = nll.reshape(-1)  # block-major order of the targets: the same for every L
        res[L] = {"nll": float(nll.mean()), "ppl": math.exp(float(nll.mean())), "n_targets": nll.numel()}
        if L == Lmax:
            res[L]["per_position"] = nll.mean(0).tolist()
    if ref_length is not None:
        d = (flat[Lmax] - flat[ref_length]).view(-1, Lmax)
        res[Lmax]["per_position_delta"] = d.mean(0).tolist()
    return res


def loss_by_position(model, stream: torch.Tensor, L: int, n_windows: int, batch_tokens: int = 16384) -> torch.Tensor:
    x, y = windows(eval_blocks(stream, n_windows, L), L)
    return token_nll(model, x, y, batch_tokens).mean(0)


@torch.no_grad()
def brute_force_loss_by_position(model, stream: torch.Tensor, L: int, n_windows: int) -> torch.Tensor:
    """Oracle for ``loss_by_position``: for every window and position p, a separate forward pass on the prefix
    ``inputs[:p+1]`` and the NLL of its last prediction."""
    model.eval()
    x, y = windows(eval_blocks(stream, n_windows, L), L)
    out = torch.zeros(L, dtype=torch.float64)
    for w in range(x.shape[0]):
        for p in range(L):
            logits = model(x[w : w + 1, : p + 1])[0, -1].float()
            out[p] += float(-torch.log_softmax(logits, -1)[y[w, p]])
    return (out / x.shape[0]).float()


def bucket_positions(per_position: Sequence[float], T: int) -> List[dict]:
    """Mean NLL in buckets [0, T/4), [T/4, T/2), [T/2, T), [T, 2T), [2T, 4T), … up to the length."""
    n = len(per_position)
    edges = [0, max(1, T // 4), max(1, T // 2), T]
    while edges[-1] < n:
        edges.append(edges[-1] * 2)
    edges[-1] = min(edges[-1], n)
    out = []
    for a, b in zip(edges, edges[1:]):
        if b > a:
            v = sum(per_position[a:b]) / (b - a)
            out.append({"start": a, "end": b, "nll": v, "ppl": math.exp(v)})
    return out


@torch.no_grad()
def passkey_accuracy(
    model,
    tokenizer,
    stream: torch.Tensor,
    lengths: Sequence[int],
    depths: Sequence[float],
    samples: int,
    seed: int = 0,
    n_digits: int = 5,
    batch_tokens: int = 16384,
) -> Dict[int, dict]:
    """{L: {"accuracy", "by_depth": {depth: accuracy}, "n", "digit_accuracy", "answer_nll"}}: exact match of all
    passkey digits; per-digit accuracy and mean NLL of the answer digits (chance: 0.1 and ln 10 ≈ 2.30) as
    graded measures that still compare models which never get all five digits right."""
    model.eval()
    maker = PasskeyMaker(tokenizer, n_digits)
    res = {}
    for L in lengths:
        rng = random.Random(f"longsparse:lm:passkey:test:{seed}:{L}")
        exs = [maker.make(stream, L, d, rng) for d in depths for _ in range(samples)]
        ok, dig, nll = [], [], []
        bs = max(1, batch_tokens // L)
        for i in range(0, len(exs), bs):
            chunk = exs[i : i + bs]
            ids = torch.tensor([e.ids for e in chunk], dtype=torch.long)
            logits = model(ids[:, :-1])
            a = chunk[0].answer_start
            ans_logits = logits[:, a - 1 : L - 1].float()
            pred = ans_logits.argmax(-1)
            gold = ids[:, a:]
            ok += (pred == gold).all(1).tolist()
            dig += (pred == gold).float().mean(1).tolist()
            nll += (
                F.cross_entropy(ans_logits.flatten(0, 1), gold.flatten(), reduction="none")
                .view(-1, n_digits)
                .mean(1)
                .tolist()
            )
        by_depth = {}
        for j, d in enumerate(depths):
            part = ok[j * samples : (j + 1) * samples]
            by_depth[str(d)] = sum(part) / len(part)
        res[L] = {
            "accuracy": sum(ok) / len(ok),
            "by_depth": by_depth,
            "n": len(ok),
            "digit_accuracy": sum(dig) / len(dig),
            "answer_nll": sum(nll) / len(nll),
        }
    return res
