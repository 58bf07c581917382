"""The training loop (plain PyTorch): AdamW, linear warm-up + cosine, grad-clip, optional bf16 autocast,
seeded model init and data stream, loss on target tokens only, periodic validation (exact match at several
lengths), best/last checkpoints, exact resume, data parallel under ``torchrun``.

Exact resume. ``last.pt`` holds the model, the AdamW state, the step (the schedule is a pure function of the
step), the torch RNG state and the state of the Python ``random.Random`` that generates the training stream.
A run killed at any moment and restarted with the same command continues from the last checkpoint and ends
with the same weights, bit for bit, as an uninterrupted run (same machine, same number of threads/ranks).
``metrics.jsonl`` records written after that checkpoint are dropped on resume, so the log has no duplicates; the
running loss sum of the steps since the last logged record is checkpointed too, so the logged losses after a
resume are the ones an uninterrupted run logs. Temporaries of a killed checkpoint write are removed on resume.
A ``deadline`` (``train``; a job with a wall-clock limit) stops the loop before an update that would not end in
time, after writing ``last.pt`` at the step reached, so a later call resumes exactly as from any checkpoint.

Nothing is created before the whole configuration is known to be usable (values by ``resolve``, the device and
the rank split here), so a refused run leaves no folder behind.

Data parallel. Every rank draws the same *global* batch from the same stream and keeps its own contiguous
slice of rows; the loss is the sum over the rank's target tokens divided by the number of target tokens of the
global batch, and the gradients are summed over ranks (one flat all-reduce), so K processes compute the same
update as one process on the global batch (up to float summation order). Rank 0 alone writes files.

One trainer for every task. The loss is the cross-entropy over the batch's labels (every task writes next-token
targets with ``IGNORE_INDEX`` where there is no loss: the answer tokens of a synthetic task, every token of a
language-modelling row), and validation is the task's objective (``objectives``: exact match by generation, or
perplexity). ``callbacks`` are called with the step number after every update, once its checkpoint (if due) is
written: how tests inject faults (a SIGKILL after step N) without a hook in this loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import sys
import time
import types
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Union

import torch
import torch.nn.functional as F

from longsparse.attention.policy import load_backends
from longsparse.io import atomic_write_text, is_temp_name, read_jsonl
from longsparse.mappings import _kernel
from longsparse.models import load_checkpoint, save_checkpoint
from longsparse.tasks import IGNORE_INDEX, Batch
from longsparse.tasks.base import PAD
from longsparse.train import fsdp
from longsparse.train.config import ConfigError, RunConfig, TrainConfig, build_model
from longsparse.train.objectives import objective_of
from longsparse.train.rundir import (
    check_run_dir,
    checkpoint_path,
    environment,
    init_run_dir,
    now,
    remove_stale_temps_in_run,
    run_lock,
)


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


# ---- distributed ------------------------------------------------------------------------------------------
class Dist:
    def __init__(self):
        import torch.distributed as dist

        self.dist = dist
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.owned = False
        if self.world > 1 and not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            dist.init_process_group(backend)
            self.owned = True

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self):
        if self.world > 1:
            self.dist.barrier()

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            self.dist.all_reduce(t)
        return t

    def broadcast_obj(self, obj):
        if self.world == 1:
            return obj
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self):
        if self.owned:
            self.dist.destroy_process_group()


def _sum_grads(model: torch.nn.Module, d: Dist) -> None:
    if d.world == 1:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    d.all_reduce_(flat)
    off = 0
    for p in params:
        n = p.numel()
        p.grad = flat[off : off + n].view_as(p).clone()
        off += n


def _rows(batch: Batch, lo: int, hi: int) -> Batch:
    return Batch(
        batch.input_ids[lo:hi],
        batch.labels[lo:hi],
        batch.attention_mask[lo:hi],
        batch.prompt_len[lo:hi],
        batch.target[lo:hi],
        batch.target_len[lo:hi],
        batch.length[lo:hi],
        batch.kind,
    )


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
        _sum_grads(model, dist)
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if hasattr(gnorm, "full_tensor"):  # the norm over FSDP shards is a replicated DTensor
        gnorm = gnorm.full_tensor()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss_sum.detach(), gnorm


# ---- logging ----------------------------------------------------------------------------------------------
class _Log:
    def __init__(self, out: Optional[Path], main: bool, printer: Optional[Callable[[str], None]]):
        self.out, self.main, self.printer = out, main, printer or print
        self.bar = None

    def __call__(self, msg: str) -> None:
        if not self.main:
            return
        if self.bar is not None:
            self.bar.write(msg)
        else:
            self.printer(msg)
        if self.out is not None:
            with open(self.out / "train.log", "a") as f:
                f.write(msg + "\n")

    def metrics(self, rec: dict) -> None:
        if self.main and self.out is not None:
            with open(self.out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")


def _progress_bar(total: int, initial: int, enabled: bool):
    if not enabled or not sys.stdout.isatty():
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, dynamic_ncols=True, leave=True)


def format_duration(seconds: float) -> str:
    """``1h02m``, ``3m05s``, ``42s``."""
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def eta_text(done: int, left: int, elapsed: float) -> str:
    """Remaining time at the rate of this session so far (``?`` before the first step)."""
    return format_duration(elapsed / done * left) if done > 0 else "?"


def _trim_metrics(out: Path, step: int) -> None:
    path = out / "metrics.jsonl"
    if not path.exists():
        return
    keep = [r for r in read_jsonl(path) if r.get("step", 0) <= step]  # a line torn by a kill is dropped
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in keep))


# ---- main entry -------------------------------------------------------------------------------------------
StepCallback = Callable[[int], None]


def train(
    config: Union[RunConfig, Mapping],
    out: Optional[str] = None,
    *,
    printer: Optional[Callable[[str], None]] = None,
    progress: bool = True,
    callbacks: Iterable[StepCallback] = (),
    deadline: Optional[float] = None,
) -> dict:
    """Train (or resume) the run ``config`` (a ``RunConfig``, or a raw or resolved run config dict) in run
    directory ``out``, for any task: its batches give the loss, its objective the validation.

    ``out=None`` trains in memory (no files, no resume). ``callbacks`` are called as ``cb(step)`` after every
    update (after that step's checkpoint, if one was due). ``deadline`` (a ``time.time()`` value; a job with a
    wall-clock limit): an update that would not end, with its validation and checkpoint, before it is not begun;
    the loop writes ``last.pt`` at the step reached and returns with ``stopped_at_deadline`` true, and the same
    call without a deadline later resumes from there exactly (the deadline is no part of the run's identity).
    Returns a summary dict with the final step, the last logged loss, the first logged loss, the validation
    history, the seconds spent in updates over all sessions (``train_seconds``), whether the step ran compiled
    (``compiled``, ``train.compile``), whether the deadline stopped it (``stopped_at_deadline``) and the model
    (key ``model``)."""
    run = config if isinstance(config, RunConfig) else RunConfig.from_dict(config)
    _check_device(run.train)  # before anything is created: a refused run leaves no folder
    d = Dist()
    out_path = Path(out) if out is not None else None
    created = out_path is not None and d.main and not out_path.exists()
    try:
        if run.train.batch_size % d.world:
            raise ConfigError(f"train.batch_size {run.train.batch_size} is not divisible by the {d.world} ranks")
        dev = _device(run.train, d)
        mode = "memory"
        if out_path is None or not d.main:
            if out_path is not None:
                mode = d.broadcast_obj(None)
            return _train(run, d, dev, out_path, mode, printer, progress, tuple(callbacks), deadline)
        mode = check_run_dir(out_path, run.as_dict())  # before the lock: a refused folder is left untouched
        with run_lock(out_path):
            mode = d.broadcast_obj(mode)
            return _train(run, d, dev, out_path, mode, printer, progress, tuple(callbacks), deadline)
    except Exception:
        if created:
            _remove_unstarted_run(out_path)
        raise
    finally:
        d.close()


def _remove_unstarted_run(out: Path) -> None:
    """Remove the folder of a run that this call created and that failed (out of memory at the first step, say)
    before writing a checkpoint: it holds nothing a rerun would use. A folder with a checkpoint stays to resume."""
    ckpts = out / "checkpoints"
    if ckpts.is_dir() and any(p.suffix == ".pt" and not is_temp_name(p.name) for p in ckpts.iterdir()):
        return
    shutil.rmtree(out, ignore_errors=True)


def _check_device(tr: TrainConfig) -> None:
    if tr.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"train.device = 'cuda' but CUDA is not available (torch {torch.__version__}"
            + (", built without CUDA" if torch.version.cuda is None else ", no usable GPU")
            + "); use train.device = 'cpu' or 'auto'"
        )


def _device(tr: TrainConfig, d: Dist) -> torch.device:
    _check_device(tr)
    if tr.device == "cuda" or (tr.device == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(d.local_rank)
        return torch.device("cuda", d.local_rank)
    return torch.device("cpu")


def _train(
    run: RunConfig,
    d: Dist,
    dev: torch.device,
    out: Optional[Path],
    mode,
    printer,
    progress,
    callbacks: tuple,
    deadline: Optional[float] = None,
) -> dict:
    tr, cfg = run.train, run.as_dict()
    if dev.type == "cpu" and tr.threads:
        torch.set_num_threads(tr.threads)
    task = run.task.build()
    objective = objective_of(task)
    log = _Log(out, d.main, printer)
    compiled = compile_enabled(tr, dev)
    sharded = tr.parallel == "fsdp" and d.world > 1
    # before the run folder gets files: the model may not fit
    model, opt = build_model_and_optimizer(run, task, dev, fused=compiled and dev.type == "cuda", shard=sharded)
    if out is not None and d.main:
        init_run_dir(out, cfg, environment(d.world, str(dev)))
        stale = remove_stale_temps_in_run(out)  # run_lock is held: no other writer is active here
        if stale:
            log(
                f"removed {len(stale)} temporary file(s) left by a killed run: "
                + ", ".join(str(p.relative_to(out)) for p in stale)
            )
    d.barrier()

    loss_fn = CompiledLoss(dev) if compiled else None
    data_rng = task.rng(tr.seed, "train")
    step, best, first_loss, last_loss = 0, None, None, None
    loss_acc, n_acc = 0.0, 0  # loss sum / count of the steps since the last logged record
    train_seconds = 0.0  # time in updates over all sessions (not validation, not checkpoint writes)
    history: list[dict] = []
    chash = run.hash

    last = checkpoint_path(out, "last") if out is not None else None
    shards = fsdp.sharded_checkpoint(last.parent) if mode == "resume" and last is not None else None
    if shards is not None and not sharded:
        raise ConfigError(
            f"{shards}: this run was trained with FSDP (a sharded checkpoint); resume it under torchrun with "
            f"--set train.parallel=fsdp"
        )
    if sharded and shards is None and mode == "resume" and last is not None and last.exists():
        raise ConfigError(
            f"{last}: this run was trained without FSDP; resume it with train.parallel = ddp (or on one process)"
        )
    if mode == "resume" and (shards is not None or (last is not None and last.exists())):
        if shards is not None:
            extra = fsdp.load_sharded(shards, model, opt)
        else:
            model, extra = load_checkpoint(str(last), map_location=dev, optimizer=opt, model=model)
        if extra.get("config_hash") != chash:
            raise ValueError(
                f"{last}: checkpoint belongs to another config (hash {extra.get('config_hash')} "
                f"!= {chash}); nothing was changed"
            )
        if extra.get("world_size", 1) != d.world:
            log(
                f"note: resuming a run saved with {extra.get('world_size')} rank(s) on {d.world}; the data "
                f"stream is the same but the result is not bit-identical to an uninterrupted run"
            )
        step = int(extra["step"])
        v, state, g = extra["data_rng"]
        data_rng.setstate((v, tuple(state), g))
        torch.set_rng_state(extra["torch_rng"])
        best, first_loss, last_loss = extra.get("best"), extra.get("first_loss"), extra.get("last_loss")
        loss_acc, n_acc = extra.get("loss_acc", (0.0, 0))
        train_seconds = float(extra.get("train_seconds", 0.0))
        if d.main:
            _trim_metrics(out, step)
        log(f"[{now()}] resuming {out} at step {step}/{tr.steps}")
    elif out is not None:
        if mode == "resume" and d.main:  # killed before the first checkpoint: start over, drop its records
            _trim_metrics(out, 0)
        log(
            f"[{now()}] new run {out}: task={task.name} method={cfg['model']['method']} "
            f"positions={cfg['model']['positions']} params={model.num_parameters():,} steps={tr.steps} "
            f"batch={tr.batch_size} ranks={d.world} device={dev}"
            + (f" compiled ({loss_fn.mode or 'default'} mode)" if loss_fn is not None else "")
        )
    d.barrier()

    autocast = torch.autocast(dev.type, dtype=torch.bfloat16) if tr.bf16 else torch.autocast(dev.type, enabled=False)
    lengths = tuple(tr.train_lengths)
    per_rank = tr.batch_size // d.world
    lo_row = d.rank * per_rank

    def summary(resumed: bool, trained: int) -> dict:
        return {
            "step": step,
            "first_loss": first_loss,
            "last_loss": last_loss,
            "best": best,
            "history": history,
            "model": model,
            "config": cfg,
            "resumed": resumed,
            "trained_steps": trained,
            "train_seconds": train_seconds,
            "compiled": loss_fn is not None,
            "stopped_at_deadline": stopped,
        }

    def save_last():
        nonlocal saved_step, save_s
        if out is None or (not d.main and not sharded):
            return
        t_save = time.perf_counter()
        extra = {
            "step": step,
            "scheduler": {"kind": "warmup_cosine", "step": step},
            "data_rng": list(_rng_state(data_rng)),
            "torch_rng": torch.get_rng_state(),
            "best": best,
            "first_loss": first_loss,
            "last_loss": last_loss,
            "loss_acc": [loss_acc, n_acc],
            "train_seconds": train_seconds,
            "world_size": d.world,
            "config_hash": chash,
            "time": now(),
        }
        path = str(checkpoint_path(out, "last"))
        if sharded:  # the sharded checkpoint resumes; last.pt (the whole model, no optimizer) is for eval & co.
            fsdp.save_sharded(Path(path).parent, model, opt, extra, d)
            state = fsdp.full_model_state(model)
            if d.main:
                save_checkpoint(path, model, None, extra=extra, overwrite=True, model_state=state)
        else:
            save_checkpoint(path, model, opt, extra=extra, overwrite=True)
        saved_step, save_s = step, time.perf_counter() - t_save

    def validate():
        nonlocal best, val_s
        if d.main or sharded:  # FSDP units gather their weights collectively: every rank runs the same passes
            t_val = time.perf_counter()
            with fsdp.gathered(model) if sharded else contextlib.nullcontext():
                res = {
                    str(L): objective.measure(
                        model, task, L, tr.val_samples, seed=tr.seed, autocast_dtype=torch.bfloat16 if tr.bf16 else None
                    )
                    for L in tr.val_lengths
                }
            model.train()
            means = objective.summary(res)
            val_s = time.perf_counter() - t_val
            rec = {"step": step, "val": res, **means, "seconds": round(val_s, 3), "time": now()}
            history.append(rec)
            log.metrics(rec)
            log(f"step {step:>6}  " + objective.line(res))
            key = objective.key(means)
            if best is None or key > best["key"]:
                best = {"key": key, "step": step}
                if out is not None:
                    state = fsdp.full_model_state(model) if sharded else None
                    if d.main:
                        save_checkpoint(
                            str(checkpoint_path(out, "best")),
                            model,
                            None,
                            extra={"step": step, "val": res, "config_hash": chash},
                            overwrite=True,
                            model_state=state,
                        )
        d.barrier()

    # The deadline: before each update, the time it will take (the last update's, plus a validation and a
    # checkpoint write where due, plus the checkpoint a stop after it writes) must fit before ``deadline``, else
    # the loop writes last.pt (if the step is not saved yet) and stops, so the run resumes exactly from there.
    stopped, saved_step = False, step
    update_s, val_s, save_s = None, 0.0, 0.0

    def past_deadline() -> bool:
        if deadline is None:
            return False
        now_s = time.time()
        if update_s is None:
            late = now_s >= deadline
        else:
            nxt = step + 1
            need = update_s + save_s
            if (tr.val_every and nxt % tr.val_every == 0) or nxt == tr.steps:
                need += val_s
            late = now_s + need > deadline
        if d.world > 1:  # every rank stops at the same step
            late = bool(d.all_reduce_(torch.tensor([float(late)], device=dev)).item())
        return late

    if step >= tr.steps:
        log(f"run already complete ({step}/{tr.steps} steps); nothing to do")
        return summary(True, 0)

    start_step = step
    bar = _progress_bar(tr.steps, step, progress and d.main)
    log.bar = bar
    model.train()
    t0, tok_count = time.perf_counter(), 0
    built0 = _kernel.build_seconds()  # a kernel build during the first steps is left out of speed and ETA
    while step < tr.steps:
        if past_deadline():
            stopped = True
            break
        t_step, built_step = time.perf_counter(), _kernel.build_seconds()
        gbatch = task.batch(lengths, tr.batch_size, rng=data_rng)
        n_global = int((gbatch.labels != IGNORE_INDEX).sum())
        b = _rows(gbatch, lo_row, lo_row + per_rank)
        if loss_fn is not None:  # static shapes for the compiled step: 20 batches of the MQMTAR paper preset's
            # lengths 32-64 had 15 token counts, in 3 buckets
            b = pad_batch(b, bucket_length(b.input_ids.shape[1]))
        b = b.to(dev)
        lr = lr_at(step, tr)
        loss_sum, gnorm = train_step(
            model,
            opt,
            b,
            n_target=n_global,
            lr=lr,
            grad_clip=tr.grad_clip,
            autocast=autocast,
            dist=None if sharded else d,
            loss_fn=loss_fn,
        )
        if loss_fn is not None and loss_fn.note is not None:
            log(f"note: {loss_fn.note}")
            loss_fn.note = None
        step += 1
        tok_count += int(gbatch.attention_mask.sum())
        ls_ = d.all_reduce_(loss_sum.reshape(1).clone())
        loss_acc += float(ls_) / max(1, n_global)
        n_acc += 1
        update_s = time.perf_counter() - t_step - (_kernel.build_seconds() - built_step)
        train_seconds += update_s
        if bar is not None:
            bar.update(1)
        if step % tr.log_every == 0 or step == tr.steps or step == 1:
            mean = loss_acc / n_acc
            loss_acc, n_acc = 0.0, 0
            if first_loss is None:
                first_loss = mean
            last_loss = mean
            dt = time.perf_counter() - t0 - (_kernel.build_seconds() - built0)
            rec = {
                "step": step,
                "loss": mean,
                "lr": lr,
                "grad_norm": float(gnorm),
                "tokens_per_s": tok_count / dt,
                "length": int(gbatch.length[0]),
                "time": now(),
            }
            log.metrics(rec)
            if bar is not None:
                bar.set_postfix(loss=f"{mean:.4f}", lr=f"{lr:.2e}")
            else:
                log(
                    f"step {step:>6}/{tr.steps}  loss {mean:.4f}  lr {lr:.2e}  |g| {float(gnorm):.3f}  "
                    f"{tok_count / dt:,.0f} tok/s  ETA {eta_text(step - start_step, tr.steps - step, dt)}"
                )
        if (tr.val_every and step % tr.val_every == 0) or step == tr.steps:
            validate()
        if step % tr.ckpt_every == 0 or step == tr.steps:
            save_last()
        for cb in callbacks:
            cb(step)
    if bar is not None:
        bar.close()
        log.bar = None
    if stopped:
        if step > saved_step:
            save_last()
        d.barrier()
        log(
            f"[{now()}] deadline: stopped at step {step}/{tr.steps}"
            + (" (last.pt holds it; the same command resumes from there)" if out is not None else "")
        )
        return summary(mode == "resume", step - start_step)
    log(
        f"[{now()}] done: step {step}, loss {first_loss:.4f} -> {last_loss:.4f}"
        + (f", {objective.best_text(best)}" if best else "")
    )
    return summary(mode == "resume", step - start_step)


def _rng_state(rng: random.Random):
    v, state, g = rng.getstate()
    return v, list(state), g
