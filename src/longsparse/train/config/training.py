"""``TrainConfig``: the ``train`` section of a run config, how the one trainer trains (for every task). It
validates itself on construction: a bad value is a one-line ``ConfigError`` naming the field (``train.<name>``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any, Optional

from longsparse.train.config.errors import ConfigError

PARALLEL = ("ddp", "fsdp")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class TrainConfig:
    """The ``train`` section of a run config. Lengths left ``None`` are the task's (``for_task`` fills them);
    every other field is checked here. Sequences are stored as tuples (``betas`` as floats); ``as_dict`` is the
    JSON form with lists."""

    steps: int = 1000  # optimizer steps
    batch_size: int = 32  # GLOBAL batch (split over data-parallel ranks)
    lr: float = 1e-3  # peak learning rate
    warmup_steps: int = 100  # linear warm-up from lr/warmup_steps to lr
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio at the last step
    betas: tuple = (0.9, 0.99)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    bf16: bool = False  # bfloat16 autocast for the forward pass
    seed: int = 0  # model init and training data stream
    train_lengths: Optional[tuple] = None  # [lo, hi] inclusive; None = the task's own training range
    # [[until_step, lo, hi], ...], until_step increasing: the training range is [lo, hi] of the first stage whose
    # until_step is above the step, train_lengths from the last until_step on. None: train_lengths throughout
    length_curriculum: Optional[tuple] = None
    log_every: int = 25
    val_every: int = 200  # 0 = only at the end
    val_lengths: Optional[tuple] = None  # None = [hi, 2*hi, 4*hi] of the training range
    val_samples: int = 64  # examples (windows, for a perplexity objective) per validation length
    ckpt_every: int = 100  # last.pt every N steps (and at the end)
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch.set_num_threads on CPU; 0 = leave torch's default
    compile: Any = "auto"  # torch.compile the training step: auto (on for CUDA, off on the CPU) | true | false
    parallel: str = "ddp"  # several ranks (torchrun): ddp (replicated model) | fsdp (FSDP2, sharded; train/fsdp.py)

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_finite(f.name, getattr(self, f.name))
        for name in ("steps", "batch_size", "log_every", "val_samples", "ckpt_every"):
            self._check_int(name, minimum=1)
        for name in ("warmup_steps", "val_every", "seed", "threads"):
            self._check_int(name, minimum=0)
        for name in ("lr", "grad_clip"):
            if not _is_number(v := getattr(self, name)) or not v > 0:
                raise ConfigError(f"train.{name} must be a number > 0, got {v!r}")
        if not _is_number(self.weight_decay) or not self.weight_decay >= 0:
            raise ConfigError(f"train.weight_decay must be a number >= 0, got {self.weight_decay!r}")
        # the cosine ends at lr * min_lr_ratio: a ratio above 1 would raise the rate, not decay it
        if not _is_number(self.min_lr_ratio) or not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"train.min_lr_ratio must be a number in [0, 1], got {self.min_lr_ratio!r}")
        b = self.betas
        if not (
            isinstance(b, (list, tuple)) and len(b) == 2 and all(isinstance(x, (int, float)) and 0 <= x < 1 for x in b)
        ):
            raise ConfigError(f"train.betas must be two numbers in [0, 1), got {b!r}")
        object.__setattr__(self, "betas", tuple(float(x) for x in b))
        if not isinstance(self.bf16, bool):
            raise ConfigError(f"train.bf16 must be true or false, got {self.bf16!r}")
        if not (self.compile == "auto" or isinstance(self.compile, bool)):
            raise ConfigError(f"train.compile must be auto, true or false, got {self.compile!r}")
        if self.parallel not in PARALLEL:
            raise ConfigError(f"train.parallel must be one of {', '.join(PARALLEL)}, got {self.parallel!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"train.device must be auto, cpu or cuda, got {self.device!r}")
        tl = self.train_lengths
        if tl is not None:
            if isinstance(tl, int) and not isinstance(tl, bool):
                tl = (tl, tl)
            if not (
                isinstance(tl, (list, tuple))
                and len(tl) == 2
                and all(isinstance(x, int) for x in tl)
                and tl[0] <= tl[1]
            ):
                raise ConfigError(f"train.train_lengths must be [lo, hi] integers with lo <= hi, got {tl!r}")
            object.__setattr__(self, "train_lengths", tuple(tl))
        lc = self.length_curriculum
        if lc is not None:
            ok = isinstance(lc, (list, tuple)) and len(lc) > 0
            ok = ok and all(
                isinstance(st, (list, tuple))
                and len(st) == 3
                and all(isinstance(x, int) and not isinstance(x, bool) for x in st)
                and st[0] >= 1
                and 1 <= st[1] <= st[2]
                for st in lc
            )
            if not ok or any(a[0] >= b[0] for a, b in zip(lc, lc[1:])):
                raise ConfigError(
                    "train.length_curriculum must be a list of [until_step, lo, hi] integers with until_step >= 1 "
                    f"increasing and 1 <= lo <= hi, got {lc!r}"
                )
            object.__setattr__(self, "length_curriculum", tuple(tuple(st) for st in lc))
        vl = self.val_lengths
        if vl is not None:
            if isinstance(vl, int) and not isinstance(vl, bool):
                vl = (vl,)
            if not (
                isinstance(vl, (list, tuple)) and vl and all(isinstance(x, int) and not isinstance(x, bool) for x in vl)
            ):
                raise ConfigError(f"train.val_lengths must be a non-empty list of integers, got {vl!r}")
            object.__setattr__(self, "val_lengths", tuple(vl))

    def _check_int(self, name: str, minimum: int) -> None:
        v = getattr(self, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ConfigError(f"train.{name} must be an integer >= {minimum}, got {v!r}")

    def for_task(self, task) -> "TrainConfig":
        """These settings for ``task``: a ``None`` training range is the task's own, ``None`` validation lengths
        are [hi, 2 hi, 4 hi] of the training range, and every length must be one the task can make (ConfigError
        "impossible length" otherwise)."""
        tl = self.train_lengths if self.train_lengths is not None else tuple(task.train_lengths)
        out = dataclasses.replace(self, train_lengths=tl)
        if out.val_lengths is None:
            hi = out.train_lengths[1]
            out = dataclasses.replace(out, val_lengths=(hi, 2 * hi, 4 * hi))
        staged = [n for st in out.length_curriculum or () for n in st[1:]]
        for n in (*out.train_lengths, *staged, *out.val_lengths):
            try:
                task.check_length(n)
            except ValueError as e:
                raise ConfigError(f"impossible length: {e}") from None
        return out

    def lengths_at(self, step: int) -> tuple:
        """The inclusive (lo, hi) training range of the update at 0-based ``step`` (``length_curriculum``'s
        stage, else ``train_lengths``; call on a config ``for_task`` has filled)."""
        for until, lo, hi in self.length_curriculum or ():
            if step < until:
                return (lo, hi)
        return tuple(self.train_lengths)

    def as_dict(self) -> dict:
        """The JSON form (``config.json``'s ``train`` section): sequences as lists."""
        return {f.name: _as_json(getattr(self, f.name)) for f in fields(self)}


def _as_json(v: Any) -> Any:
    return [_as_json(x) for x in v] if isinstance(v, tuple) else v


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_finite(name: str, value: Any) -> None:
    """No inf or nan: no rate, ratio or beta means anything when non-finite."""
    items = enumerate(value) if isinstance(value, (list, tuple)) else [(None, value)]
    for i, v in items:
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"train.{name}{'' if i is None else f'[{i}]'} must be a finite number, got {v!r}")


TRAIN_DEFAULTS: dict[str, Any] = TrainConfig().as_dict()
