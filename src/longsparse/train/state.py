"""``TrainState``: what a run has done besides its weights and AdamW state, everything an exact resume needs,
and the layout of the ``extra`` it takes in a checkpoint (``last.pt``, or ``extra.pt`` of a sharded one).

A checkpoint's extra is the state's ``state_dict()`` plus the records of the session that wrote it
(``RECORD_KEYS``: the schedule's position, the world size, the run's config hash, the time). Reading it is
strict: ``split_extra`` names any missing or unknown key in one line. Checkpoints that older code wrote lack
keys added since: ``longsparse migrate`` (``longsparse.migrate``) rewrites them once in today's layout.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

STATE_KEYS = (
    "step",
    "data_rng",
    "torch_rng",
    "cuda_rng",
    "best",
    "first_loss",
    "last_loss",
    "loss_acc",
    "train_seconds",
)
RECORD_KEYS = ("scheduler", "world_size", "config_hash", "time")


@dataclass
class TrainState:
    """The progress of one run. ``data_rng`` is the task's training stream (``task.rng(seed, "train")``), the
    generator every batch is drawn from; the torch generators are the process's global ones (the CPU one and,
    when ``device`` is a GPU, its CUDA one: dropout-like noise such as HSA's Gumbel selection noise draws from
    it). ``state_dict`` captures all of them with the counters; ``load_state_dict`` restores them.

    step: updates done. best: ``{"key": [...], "step": n}`` of the best validation (``objectives``), or None.
    first_loss / last_loss: the first and the latest logged mean loss. loss_sum / loss_count: the per-step mean
    losses summed since the last logged record, and their number. train_seconds: time spent in updates over
    all sessions (not validation, not checkpoint writes)."""

    data_rng: random.Random
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    step: int = 0
    best: Optional[dict] = None
    first_loss: Optional[float] = None
    last_loss: Optional[float] = None
    loss_sum: float = 0.0
    loss_count: int = 0
    train_seconds: float = 0.0

    def state_dict(self) -> dict:
        """The state as plain values and tensors (``torch.load(weights_only=True)`` reads it), keys
        ``STATE_KEYS``; the generators' states are taken now."""
        version, internal, gauss = self.data_rng.getstate()
        return {
            "step": self.step,
            "data_rng": [version, list(internal), gauss],
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            "best": self.best,
            "first_loss": self.first_loss,
            "last_loss": self.last_loss,
            "loss_acc": [self.loss_sum, self.loss_count],
            "train_seconds": self.train_seconds,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()`` (exactly the keys ``STATE_KEYS``: ValueError naming any other or missing
        one). A CUDA generator state is restored when this state's device is a GPU; a run resumed on the CPU
        has no CUDA generator in use, and one saved on the CPU leaves the GPU's generator as seeded."""
        _check_keys(state, STATE_KEYS, "training state")
        self.step = int(state["step"])
        version, internal, gauss = state["data_rng"]
        self.data_rng.setstate((version, tuple(internal), gauss))
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.best = state["best"]
        self.first_loss, self.last_loss = state["first_loss"], state["last_loss"]
        loss_sum, loss_count = state["loss_acc"]
        self.loss_sum, self.loss_count = float(loss_sum), int(loss_count)
        self.train_seconds = float(state["train_seconds"])


def checkpoint_extra(state: TrainState, *, world_size: int, config_hash: str, time: str) -> dict:
    """The ``extra`` of a checkpoint of ``state``: its ``state_dict()`` and the ``RECORD_KEYS``."""
    return {
        **state.state_dict(),
        "scheduler": {"kind": "warmup_cosine", "step": state.step},  # the schedule is a function of the step
        "world_size": world_size,
        "config_hash": config_hash,
        "time": time,
    }


def split_extra(extra: Mapping[str, Any], where: str) -> tuple[dict, dict]:
    """(the ``TrainState.state_dict()``, the records) of a checkpoint's ``extra`` in today's layout; ValueError
    naming ``where`` and any missing or unknown key (keys missing only, as in a layout of older code: naming
    ``longsparse migrate``)."""
    try:
        check_extra(extra, where)
    except ValueError as e:
        if any(k not in extra for k in (*STATE_KEYS, *RECORD_KEYS)) and set(extra) <= {*STATE_KEYS, *RECORD_KEYS}:
            raise ValueError(f"{e}; if older code wrote it, `longsparse migrate {where}` rewrites it once") from None
        raise
    return {k: extra[k] for k in STATE_KEYS}, {k: extra[k] for k in RECORD_KEYS}


def check_extra(extra: Mapping[str, Any], where: str) -> None:
    """ValueError naming ``where`` and any missing or unknown key unless ``extra`` has exactly the keys of
    today's layout (``STATE_KEYS`` and ``RECORD_KEYS``)."""
    _check_keys(extra, (*STATE_KEYS, *RECORD_KEYS), f"checkpoint {where}")


def _check_keys(got: Mapping, want: tuple, what: str) -> None:
    missing = [k for k in want if k not in got]
    unknown = sorted(str(k) for k in got if k not in want)
    if missing or unknown:
        parts = ([f"missing key(s) {missing}"] if missing else []) + ([f"unknown key(s) {unknown}"] if unknown else [])
        raise ValueError(f"{what}: {'; '.join(parts)} (expected exactly {', '.join(want)})")
