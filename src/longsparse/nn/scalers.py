"""Length scalers: per-query multipliers of q (never of the position bias), shape (B, H, Nq).

With i the absolute 0-based position of the query (in a padded batch: the number of real tokens
before it in its row):

* ``SSMaxScaler``:     s_{h,i} = β_h · log(i + 2), β_h learned per head, init 1.
* ``ASEntmaxScaler``:  s_{h,i} = δ + softplus(W_β h_i + b_β)_h · log(i + 2)^{γ_r·tanh(W_γ h_i + b_γ)_h},
  h_i the normalised layer input, W_β, W_γ: d_model → #scaled heads, δ = 1, γ_r = 2.
* ``StaticASEntmaxScaler`` (ablation): s_{h,i} = δ + β_h · log(i + 2)^{γ_h} with
  β_h = softplus(b_β,h), γ_h = γ_r·tanh(b_γ,h) (ASEntmax with W = 0).

Only the heads in ``scalable`` are scaled (under NAPE the NoPE heads); the others get scale 1.

ASEntmax initialisations (docs/method.md §2): "reference" — weights N(0, 0.02), zero biases (scale at step 0
anywhere from ~1 to ~20); "scale_aware" — zero weights, b_β = softplus⁻¹(0.05), b_γ = 0, so the
scale starts at ≈ 1.05 everywhere. The default is "scale_aware" (the reference init was reported to
leave MQMTAR stuck on its plateau).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ASENTMAX_INITS = ("scale_aware", "reference")


def softplus_inverse(y: float) -> float:
    if y <= 0:
        raise ValueError(f"softplus⁻¹ needs y > 0, got {y}")
    return y + math.log(-math.expm1(-y))


def log_position(positions: Tensor, dtype: torch.dtype) -> Tensor:
    """log(i + 2) for 0-based positions i."""
    return torch.log(positions.to(dtype) + 2.0)


class _Scaler(nn.Module):
    def __init__(self, scalable: Tensor):
        super().__init__()
        scalable = torch.as_tensor(scalable, dtype=torch.bool)
        if scalable.dim() != 1:
            raise ValueError("scalable must be a 1-D boolean mask over heads")
        self.n_heads = int(scalable.numel())
        self.register_buffer("scaled_heads", torch.nonzero(scalable).flatten(), persistent=False)
        self.n_scaled = int(self.scaled_heads.numel())

    def _expand(self, s: Tensor) -> Tensor:
        """(B, n_scaled, Nq) → (B, H, Nq) with ones for the unscaled heads."""
        if self.n_scaled == self.n_heads:
            return s
        B, _, N = s.shape
        full = torch.ones(B, self.n_heads, N, dtype=s.dtype, device=s.device)
        return full.index_copy(1, self.scaled_heads.to(s.device), s)


class SSMaxScaler(_Scaler):
    """β_h · log(i + 2); ``forward(h, positions)`` with positions (B, Nq) → (B, H, Nq)."""

    def __init__(self, scalable: Tensor, init: float = 1.0):
        super().__init__(scalable)
        self.beta = nn.Parameter(torch.full((self.n_scaled,), float(init)))

    def forward(self, h: Optional[Tensor], positions: Tensor) -> Tensor:
        dtype = self.beta.dtype if h is None else h.dtype
        lp = log_position(positions, dtype).unsqueeze(1)  # (B, 1, Nq)
        return self._expand(self.beta.to(dtype).view(1, -1, 1) * lp)


def check_scaler_constants(delta, gamma_range, names=("delta", "gamma_range")) -> None:
    """ValueError naming the first bad constant of the ASEntmax scale: δ and γ_r must be finite numbers ≥ 0 (a NaN
    would only show at the first forward, as NaN queries)."""
    for name, value in zip(names, (delta, gamma_range)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= float(value) < math.inf:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


class ASEntmaxScaler(_Scaler):
    """Adaptive-scalable entmax scale δ + softplus(W_β h + b_β)·log(i+2)^{γ_r·tanh(W_γ h + b_γ)}."""

    def __init__(
        self, d_model: int, scalable: Tensor, init: str = "scale_aware", delta: float = 1.0, gamma_range: float = 2.0
    ):
        super().__init__(scalable)
        if init not in ASENTMAX_INITS:
            raise ValueError(f"unknown ASEntmax init {init!r}; choose one of {', '.join(ASENTMAX_INITS)}")
        check_scaler_constants(delta, gamma_range)
        self.delta, self.gamma_range, self.init = float(delta), float(gamma_range), init
        self.beta_proj = nn.Linear(d_model, self.n_scaled)
        self.gamma_proj = nn.Linear(d_model, self.n_scaled)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            if self.init == "reference":
                for lin in (self.beta_proj, self.gamma_proj):
                    nn.init.normal_(lin.weight, 0.0, 0.02)
                    nn.init.zeros_(lin.bias)
            else:
                for lin in (self.beta_proj, self.gamma_proj):
                    nn.init.zeros_(lin.weight)
                self.beta_proj.bias.fill_(softplus_inverse(0.05))
                nn.init.zeros_(self.gamma_proj.bias)

    def forward(self, h: Tensor, positions: Tensor) -> Tensor:
        """h (B, Nq, d_model) normalised layer input, positions (B, Nq) → (B, H, Nq)."""
        # both projections as one product: one pass over h forward and one (B, Nq, d_model) gradient backward
        # instead of two and their sum (the two Linear modules stay: checkpoints keep their parameter names)
        weight = torch.cat((self.beta_proj.weight, self.gamma_proj.weight))
        bias = torch.cat((self.beta_proj.bias, self.gamma_proj.bias))
        beta_in, gamma_in = F.linear(h, weight, bias).split(self.n_scaled, dim=-1)  # (B, Nq, Hs) each
        beta = F.softplus(beta_in)
        gamma = self.gamma_range * torch.tanh(gamma_in)
        lp = log_position(positions, h.dtype).unsqueeze(-1)  # (B, Nq, 1)
        s = self.delta + beta * lp.pow(gamma)
        return self._expand(s.transpose(1, 2))

    def extra_repr(self) -> str:
        return f"delta={self.delta}, gamma_range={self.gamma_range}, init={self.init!r}"


class StaticASEntmaxScaler(_Scaler):
    """Per-head, input-independent ablation δ + β_h·log(i+2)^{γ_h}; same init options as ASEntmax
    (both give β = softplus(b_β), γ = γ_r·tanh(b_γ); "reference" starts at β = softplus(0) = log 2)."""

    def __init__(self, scalable: Tensor, init: str = "scale_aware", delta: float = 1.0, gamma_range: float = 2.0):
        super().__init__(scalable)
        if init not in ASENTMAX_INITS:
            raise ValueError(f"unknown ASEntmax init {init!r}; choose one of {', '.join(ASENTMAX_INITS)}")
        check_scaler_constants(delta, gamma_range)
        self.delta, self.gamma_range, self.init = float(delta), float(gamma_range), init
        b0 = softplus_inverse(0.05) if init == "scale_aware" else 0.0
        self.beta_bias = nn.Parameter(torch.full((self.n_scaled,), b0))
        self.gamma_bias = nn.Parameter(torch.zeros(self.n_scaled))

    def forward(self, h: Optional[Tensor], positions: Tensor) -> Tensor:
        dtype = self.beta_bias.dtype if h is None else h.dtype
        beta = F.softplus(self.beta_bias.to(dtype)).view(1, -1, 1)
        gamma = (self.gamma_range * torch.tanh(self.gamma_bias.to(dtype))).view(1, -1, 1)
        lp = log_position(positions, dtype).unsqueeze(1)  # (B, 1, Nq)
        return self._expand(self.delta + beta * lp.pow(gamma))
