"""One update of the trainer: the learning-rate schedule (``lr_at``), the model and its AdamW optimiser
(``build_model_and_optimizer``), the compiled loss (``CompiledLoss``, with batches padded to ``bucket_length``)
and ``train_step``, the update itself. `longsparse bench train-step` times exactly ``train_step``."""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Mapping, Optional, Union

import torch
import torch.nn.functional as F

from longsparse.attention.policy import load_backends
from longsparse.tasks import IGNORE_INDEX, Batch
from longsparse.tasks.base import PAD
from longsparse.train import fsdp
from longsparse.train.config import RunConfig, TrainConfig, build_model
from longsparse.train.distributed import Dist, sum_grads


# ---- schedule ---------------------------------------------------------------------------------------------
def lr_at(step: int, tr: Union[TrainConfig, Mapping]) -> float:
    """Learning rate of update ``step`` (0-based): linear warm-up to ``lr`` over ``warmup_steps`` updates, then
    cosine to ``lr * min_lr_ratio`` at the last update. ``tr``: a ``TrainConfig`` or a mapping with those keys."""
    if isinstance(tr, Mapping):
        tr = TrainConfig(**{k: tr[k] for k in ("lr", "warmup_steps", "steps", "min_lr_ratio") if k in tr})
    lr, warm, total = tr.lr, tr.warmup_steps, tr.steps
    if warm and step < warm:
        return lr * (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - 1 - warm))
    lo = lr * tr.min_lr_ratio
    return lo + (lr - lo) * 0.5 * (1.0 + math.cos(math.pi * progress))


# ---- one update ---------------------------------------------------------------------------------------------
def build_model_and_optimizer(
    cfg: Union[RunConfig, Mapping], task, device: torch.device, *, fused: bool = False, shard: bool = False
):
    """(model, AdamW) of a run config (``RunConfig`` or its resolved dict): the model initialised under
    ``torch.manual_seed(train.seed)``; with ``shard`` (FSDP, under torchrun) sharded before the optimizer sees it.
    fused: AdamW's fused kernel (one launch per step instead of a few per parameter group; its state dict is the
    same, so checkpoints move between the two)."""
    run = cfg if isinstance(cfg, RunConfig) else RunConfig.from_dict(cfg)
    tr = run.train
    torch.manual_seed(tr.seed)
    model = build_model(run.as_dict()["model"], task.vocab_size).to(device)
    if shard:
        fsdp.shard_model(model)
    opt = torch.optim.AdamW(
        model.parameters(), lr=tr.lr, betas=tuple(tr.betas), weight_decay=tr.weight_decay, fused=fused or None
    )
    return model, opt


# ---- the compiled step ------------------------------------------------------------------------------------
def compile_enabled(tr: TrainConfig, device: torch.device) -> bool:
    """Whether ``train.compile`` compiles the training step on ``device``: auto = on CUDA, off on the CPU (there
    compiling costs 12-70 s per process for a step at about 0.8× the eager time: short runs lose;
    docs/training.md)."""
    return device.type == "cuda" if tr.compile == "auto" else bool(tr.compile)


def bucket_length(n: int) -> int:
    """The padded length of an n-token batch: n rounded up to a quarter of its power of two (64, 80, 96, 112,
    128, 160, …; multiples of 8 below 32), so batches of a length range take at most four shapes per octave
    (each compiled once and captured once as a CUDA graph) and at most 25 % of padding."""
    step = max(8, 1 << max(0, n.bit_length() - 3))
    return -(-n // step) * step


def pad_batch(batch: Batch, length: int) -> Batch:
    """``batch`` right-padded to ``length`` tokens: PAD inputs, IGNORE_INDEX labels, attention_mask False. The
    models are causal, so pads after a row's tokens change none of its logits, and the loss ignores them."""
    extra = length - batch.input_ids.shape[1]
    if extra <= 0:
        return batch
    return dataclasses.replace(
        batch,
        input_ids=F.pad(batch.input_ids, (0, extra), value=PAD),
        labels=F.pad(batch.labels, (0, extra), value=IGNORE_INDEX),
        attention_mask=F.pad(batch.attention_mask, (0, extra), value=False),
    )


def _loss_sum(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The cross-entropy summed over the target tokens of (B, N) input_ids / labels (IGNORE_INDEX: no loss)."""
    logits = model(input_ids)
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")


class CompiledLoss:
    """`_loss_sum` (forward and, through autograd, backward) compiled by torch.compile, as one graph where the
    model allows it (else with graph breaks, said in ``note``). On CUDA in mode "reduce-overhead": the step is
    launch-bound (thousands of small kernels for a few-million-parameter model), and CUDA graphs replay the
    forward and the backward as one launch each; "max-autotune-no-cudagraphs" would tune the matmuls instead,
    which are not the bottleneck, at minutes of compile time. CUDA graphs need static shapes: the trainer pads
    batches to `bucket_length`. On the CPU the default mode (no CUDA graphs)."""

    def __init__(self, device: torch.device, backend: str = "inductor"):
        """backend: torch.compile's backend ("eager": traced but not code-generated, for quick checks)."""
        self.cuda = device.type == "cuda"
        self.backend = backend
        self.mode = "reduce-overhead" if self.cuda and backend == "inductor" else None
        load_backends(device.type)
        self.fullgraph = True
        self.note: Optional[str] = None  # why the step compiled with graph breaks, until the trainer logs it
        self.fn = self._compile(fullgraph=True)

    def _compile(self, fullgraph: bool):
        # a function of its own code: torch.compile's cache and recompile limit are per code object, and each
        # trainer (a study trains many models in one process) gets its own graphs
        own = types.FunctionType(_loss_sum.__code__.replace(), _loss_sum.__globals__, _loss_sum.__name__)
        return torch.compile(own, fullgraph=fullgraph, mode=self.mode, backend=self.backend)

    def __call__(self, model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.cuda:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs are no longer read
        try:
            return self.fn(model, input_ids, labels)
        except torch._dynamo.exc.Unsupported as exc:  # raised while tracing, before anything ran
            if not self.fullgraph:
                raise
            self.fullgraph = False
            first = (str(exc).strip().splitlines() or ["?"])[0][:200]
            self.note = f"the training step does not compile as one graph ({first}); compiled with graph breaks"
            self.fn = self._compile(fullgraph=False)
            return self.fn(model, input_ids, labels)


def train_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batch: Batch,
    *,
    n_target: int,
    lr: float,
    grad_clip: float,
    autocast,
    dist: Optional[Dist] = None,
    loss_fn: Optional[CompiledLoss] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One AdamW update on ``batch`` (this rank's rows; input_ids / labels (B, N)): the cross-entropy summed over
    its target tokens, divided by ``n_target`` (the global batch's count, so that ranks sum to the global mean),
    backward under ``autocast`` for the forward, gradients summed over the ranks of ``dist``, norm clipped to
    ``grad_clip``, the step at learning rate ``lr``, gradients cleared. Returns (the loss sum, detached; the
    gradient norm before clipping). loss_fn: the compiled forward and loss (`CompiledLoss`; None: eager).
    `longsparse bench train-step` times exactly this."""
    for g in opt.param_groups:
        g["lr"] = lr
    if loss_fn is not None:
        with autocast:
            loss_sum = loss_fn(model, batch.input_ids, batch.labels)
    else:
        with autocast:
            logits = model(batch.input_ids)
        loss_sum = F.cross_entropy(
            logits.float().flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
    (loss_sum / max(1, n_target)).backward()
    if dist is not None:
        sum_grads(model, dist)
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if hasattr(gnorm, "full_tensor"):  # the norm over FSDP shards is a replicated DTensor
        gnorm = gnorm.full_tensor()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss_sum.detach(), gnorm
