"""Introspection without editing model code.

    with capture(model, what=("attn", "scale", "support", "entropy")) as cap:
        model(ids)
    cap[layer]            # dict for the last forward call of that layer
    cap.calls[layer]      # list of dicts, one per forward call (e.g. per decoding step)

Each dict holds, for the query rows of that call:
  "attn"    (B, H, Nq, Nk) attention map — a dense recompute of the layer's own mapping
            (longsparse.attention.map_scores) on the same q, k, bias, masks;
  "scale"   (B, H, Nq) the per-query q-scale (ones for methods without a length scaler);
  "support" (B, H, Nq) number of keys with p > 0;
  "entropy" (B, H, Nq) normalised entropy H(p)/log(n), n = keys the query may attend to
            (0 where n ≤ 1).
Everything is detached and stored on the CPU. Rows of fully masked (padding) queries are zeros.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterable, List, Optional

import torch
from torch import Tensor, nn

from longsparse.nn.attention import Attention, dense_logits

CAPTURE_KINDS = ("attn", "scale", "support", "entropy")


class Capture:
    def __init__(self, what: Iterable[str]):
        self.what = tuple(what)
        bad = [w for w in self.what if w not in CAPTURE_KINDS]
        if bad:
            raise ValueError(f"unknown capture kind(s) {bad}; choose from {', '.join(CAPTURE_KINDS)}")
        self.calls: Dict[int, List[Dict[str, Tensor]]] = {}

    def __getitem__(self, layer: int) -> Dict[str, Tensor]:
        if layer not in self.calls:
            raise KeyError(f"nothing captured for layer {layer}; captured layers: {sorted(self.calls)}")
        return self.calls[layer][-1]

    @property
    def layers(self) -> List[int]:
        return sorted(self.calls)

    @torch.no_grad()
    def record(
        self, attn: Attention, *, q: Tensor, k: Tensor, q_scale: Optional[Tensor], attn_mask: Optional[Tensor]
    ) -> None:
        rec: Dict[str, Tensor] = {}
        B, H, Nq, _ = q.shape
        if "scale" in self.what:
            rec["scale"] = torch.ones(B, H, Nq) if q_scale is None else q_scale.detach().float().cpu()
        if any(w in self.what for w in ("attn", "support", "entropy")):
            p = attn.probabilities(
                q.detach(), k.detach(), None if q_scale is None else q_scale.detach(), attn_mask
            ).detach()
            if "attn" in self.what:
                rec["attn"] = p.cpu()
            if "support" in self.what:
                rec["support"] = (p > 0).sum(-1).cpu()
            if "entropy" in self.what:
                allowed = torch.isfinite(
                    dense_logits(q.detach(), k.detach(), scale=attn.scale, attn_mask=attn_mask)
                ).sum(-1)
                h = -torch.where(p > 0, p * p.clamp_min(1e-300).log(), p.new_zeros(())).sum(-1)
                n = allowed.to(p.dtype)
                rec["entropy"] = torch.where(n > 1, h / n.clamp_min(2).log(), torch.zeros_like(h)).float().cpu()
        self.calls.setdefault(attn.layer_idx, []).append(rec)


@contextlib.contextmanager
def capture(model: nn.Module, what: Iterable[str] = CAPTURE_KINDS, layers: Optional[Iterable[int]] = None):
    """Record attention statistics of every longsparse Attention layer in ``model`` (or only the
    given layer indices) while the context is open."""
    cap = Capture(what)
    mods = [m for m in model.modules() if isinstance(m, Attention)]
    if not mods:
        raise ValueError("model has no longsparse.nn.Attention layers to capture")
    wanted = None if layers is None else set(layers)
    chosen = [m for m in mods if wanted is None or m.layer_idx in wanted]
    for m in chosen:
        if m._capture is not None:
            raise RuntimeError("capture() contexts cannot be nested on the same layer")
    try:
        for m in chosen:
            m._capture = cap
        yield cap
    finally:
        for m in chosen:
            m._capture = None
