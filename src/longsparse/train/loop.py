"""The trainer (plain PyTorch): AdamW, linear warm-up + cosine, grad-clip, optional bf16 autocast, seeded model
init and data stream, loss on target tokens only, periodic validation (the task's objective at several lengths),
best/last checkpoints, exact resume, data parallel under ``torchrun`` (``distributed``; FSDP: ``fsdp``).

``Trainer`` owns one run in one process: the model and its optimizer, the schedule, the task's data stream and
the ``TrainState`` (``state``: step, best validation, running losses, seconds trained, generator states).
``train`` is the entry every caller uses: it opens the session (ranks, device, run folder and its lock), builds
the ``Trainer``, resumes or starts, and trains.

Exact resume. ``last.pt`` holds the model, the AdamW state and the ``TrainState`` (the schedule is a pure
function of the step): the torch generators and the Python ``random.Random`` that generates the training stream
included. A run killed at any moment and restarted with the same command continues from the last checkpoint and
ends with the same weights, bit for bit, as an uninterrupted run (same machine, same number of threads/ranks).
``metrics.jsonl`` records written after that checkpoint are dropped on resume, so the log has no duplicates; the
running loss sum of the steps since the last logged record is checkpointed too, so the logged losses after a
resume are the ones an uninterrupted run logs. Temporaries of a killed checkpoint write are removed on resume.
A ``deadline`` (``train``; a job with a wall-clock limit) stops the loop before an update that would not end in
time, after writing ``last.pt`` at the step reached, so a later call resumes exactly as from any checkpoint.

Nothing is created before the whole configuration is known to be usable (values by ``resolve``, the device and
the rank split here), so a refused run leaves no folder behind. Rank 0 alone writes files.

One trainer for every task. The loss is the cross-entropy over the batch's labels (every task writes next-token
targets with ``IGNORE_INDEX`` where there is no loss: the answer tokens of a synthetic task, every token of a
language-modelling row), and validation is the task's objective (``objectives``: exact match by generation, or
perplexity). ``callbacks`` are called with the step number after every update, once its checkpoint (if due) is
written: how tests inject faults (a SIGKILL after step N) without a hook in this loop.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Optional, Union

import torch

from longsparse import cpu_kernel
from longsparse.io import is_temp_name
from longsparse.models import load_checkpoint, save_checkpoint
from longsparse.tasks import IGNORE_INDEX, Batch
from longsparse.train import fsdp
from longsparse.train.config import ConfigError, RunConfig, TrainConfig, attention_of
from longsparse.train.distributed import Dist, rank_rows
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
from longsparse.train.runlog import RunLog, eta_text, progress_bar, trim_metrics
from longsparse.train.state import TrainState, checkpoint_extra, split_extra
from longsparse.train.update import (
    CompiledLoss,
    bucket_length,
    build_model_and_optimizer,
    compile_enabled,
    lr_at,
    pad_batch,
    train_step,
)

StepCallback = Callable[[int], None]

__all__ = [
    "Session",
    "training_session",
    "StepCallback",
    "Trainer",
    "train",
    # the update's parts, used here (and imported from here by benchmarks)
    "CompiledLoss",
    "bucket_length",
    "build_model_and_optimizer",
    "compile_enabled",
    "lr_at",
    "pad_batch",
    "train_step",
]


@dataclass(frozen=True)
class Session:
    """Where this process trains: its rank group, its device, the run folder (None: in memory) and what the folder
    holds ("new" or "resume"; "memory" without one)."""

    dist: Dist
    device: torch.device
    out: Optional[Path]
    mode: str


class Trainer:
    """One run in one process: ``resume_or_start()``, then ``fit()``.

    Owns the model and its AdamW optimizer (built under ``torch.manual_seed(train.seed)``; sharded under FSDP),
    the schedule (``lr_at``), the task and its training stream, the objective that validates, the compiled loss
    (``train.compile``) and the ``TrainState`` (``state``). Construction creates the run folder's files
    (config.json first) once the model is built, so a model that does not fit leaves the folder untouched."""

    def __init__(
        self,
        run: RunConfig,
        session: Session,
        *,
        printer: Optional[Callable[[str], None]] = None,
        progress: bool = True,
    ):
        self.run, self.tr, self.cfg = run, run.train, run.as_dict()
        self.dist, self.device, self.out, self.mode = session.dist, session.device, session.out, session.mode
        self.progress = progress
        d, dev, tr = self.dist, self.device, self.tr
        if dev.type == "cpu" and tr.threads:
            torch.set_num_threads(tr.threads)
        self.task = run.task.build()
        self.objective = objective_of(self.task)
        self.log = RunLog(self.out, d.main, printer)
        compiled = compile_enabled(tr, dev)
        self.sharded = tr.parallel == "fsdp" and d.world > 1
        # before the run folder gets files: the model may not fit
        self.model, self.opt = build_model_and_optimizer(
            run, self.task, dev, fused=compiled and dev.type == "cuda", shard=self.sharded
        )
        if self.out is not None and d.main:
            init_run_dir(self.out, self.cfg, environment(d.world, str(dev)))
            stale = remove_stale_temps_in_run(self.out)  # run_lock is held: no other writer is active here
            if stale:
                self.log(
                    f"removed {len(stale)} temporary file(s) left by a killed run: "
                    + ", ".join(str(p.relative_to(self.out)) for p in stale)
                )
        d.barrier()
        self.loss_fn = CompiledLoss(dev) if compiled else None
        self.state = TrainState(data_rng=self.task.rng(tr.seed, "train"), device=dev)
        self.history: list[dict] = []  # this session's validation records
        self.config_hash = run.hash
        # a run folder `longsparse migrate` rewrote keeps the hash its checkpoints were saved under
        self.accepted_hashes = {run.hash} | ({run.legacy_hash} if run.legacy_hash else set())
        self.autocast = (
            torch.autocast(dev.type, dtype=torch.bfloat16) if tr.bf16 else torch.autocast(dev.type, enabled=False)
        )
        # what the deadline check predicts the next update from: the seconds of the last update (None before the
        # first), of the last validation and of the last checkpoint write; and the step last.pt holds
        self.update_s: Optional[float] = None
        self.val_s = self.save_s = 0.0
        self.saved_step = 0

    # ---- start ------------------------------------------------------------------------------------------
    def resume_or_start(self) -> None:
        """Load the run folder's last checkpoint into the model, optimizer and state when it holds one, else log
        the new run. A checkpoint of another config, or of the other parallel mode (FSDP's sharded one or not),
        is refused with nothing changed."""
        d, out, tr = self.dist, self.out, self.tr
        resuming = self.mode == "resume"
        last = checkpoint_path(out, "last") if out is not None else None
        shards = fsdp.sharded_checkpoint(last.parent) if resuming and last is not None else None
        if shards is not None and not self.sharded:
            raise ConfigError(
                f"{shards}: this run was trained with FSDP (a sharded checkpoint); resume it under torchrun with "
                f"--set train.parallel=fsdp"
            )
        if self.sharded and shards is None and resuming and last is not None and last.exists():
            raise ConfigError(
                f"{last}: this run was trained without FSDP; resume it with train.parallel = ddp (or on one process)"
            )
        if resuming and (shards is not None or (last is not None and last.exists())):
            self._load_checkpoint(shards if shards is not None else last, sharded=shards is not None)
            if d.main:
                trim_metrics(out, self.state.step)
            self.log(f"[{now()}] resuming {out} at step {self.state.step}/{tr.steps}")
        elif out is not None:
            if resuming and d.main:  # killed before the first checkpoint: start over, drop its records
                trim_metrics(out, 0)
            self.log(
                f"[{now()}] new run {out}: task={self.task.name} method={attention_of(self.cfg)['method']} "
                f"positions={attention_of(self.cfg)['positions']} params={self.model.num_parameters():,} "
                f"steps={tr.steps} batch={tr.batch_size} ranks={d.world} device={self.device}"
                + (f" compiled ({self.loss_fn.mode or 'default'} mode)" if self.loss_fn is not None else "")
            )
        self.saved_step = self.state.step
        d.barrier()

    def _load_checkpoint(self, path: Path, sharded: bool) -> None:
        if sharded:
            extra = fsdp.load_sharded(path, self.model, self.opt)
        else:
            self.model, extra = load_checkpoint(
                str(path), map_location=self.device, optimizer=self.opt, model=self.model
            )
        state, records = split_extra(extra, str(path))
        if records["config_hash"] not in self.accepted_hashes:
            raise ValueError(
                f"{path}: checkpoint belongs to another config (hash {records['config_hash']} "
                f"!= {self.config_hash}); nothing was changed"
            )
        if records["world_size"] != self.dist.world:
            self.log(
                f"note: resuming a run saved with {records['world_size']} rank(s) on {self.dist.world}; the data "
                f"stream is the same but the result is not bit-identical to an uninterrupted run"
            )
        self.state.load_state_dict(state)

    # ---- train --------------------------------------------------------------------------------------------
    def fit(self, callbacks: Iterable[StepCallback] = (), deadline: Optional[float] = None) -> dict:
        """Train to ``train.steps`` (or until ``deadline``, a ``time.time()`` value: see ``train``); returns the
        summary ``train`` returns. ``callbacks``: called as ``cb(step)`` after every update, once its checkpoint
        (if due) is written."""
        st, tr, log = self.state, self.tr, self.log
        resumed = self.mode == "resume"
        if st.step >= tr.steps:
            log(f"run already complete ({st.step}/{tr.steps} steps); nothing to do")
            return self.summary(resumed=True, trained=0, stopped=False)
        start = st.step
        bar = progress_bar(tr.steps, st.step, self.progress and self.dist.main)
        log.bar = bar
        self.model.train()
        t0, tokens = time.perf_counter(), 0
        built0 = cpu_kernel.build_seconds()  # a kernel build during the first steps is left out of speed and ETA
        stopped = False
        while st.step < tr.steps:
            if self._past_deadline(deadline):
                stopped = True
                break
            batch, lr, gnorm = self._update()
            tokens += int(batch.attention_mask.sum())
            if bar is not None:
                bar.update(1)
            if st.step % tr.log_every == 0 or st.step == tr.steps or st.step == 1:
                elapsed = time.perf_counter() - t0 - (cpu_kernel.build_seconds() - built0)
                self._log_losses(
                    batch, lr, gnorm, tokens / elapsed, eta_text(st.step - start, tr.steps - st.step, elapsed)
                )
            if (tr.val_every and st.step % tr.val_every == 0) or st.step == tr.steps:
                self.validate()
            if st.step % tr.ckpt_every == 0 or st.step == tr.steps:
                self.save_last()
            for cb in callbacks:
                cb(st.step)
        if bar is not None:
            bar.close()
            log.bar = None
        if stopped:
            if st.step > self.saved_step:
                self.save_last()
            self.dist.barrier()
            log(
                f"[{now()}] deadline: stopped at step {st.step}/{tr.steps}"
                + (" (last.pt holds it; the same command resumes from there)" if self.out is not None else "")
            )
        else:
            log(
                f"[{now()}] done: step {st.step}, loss {st.first_loss:.4f} -> {st.last_loss:.4f}"
                + (f", {self.objective.best_text(st.best)}" if st.best else "")
            )
        return self.summary(resumed=resumed, trained=st.step - start, stopped=stopped)

    def _update(self) -> tuple[Batch, float, torch.Tensor]:
        """One update on the next global batch of the stream; returns (the global batch, its learning rate, the
        gradient norm before clipping). Adds the batch's mean loss to the state's running sum and the update's
        seconds (without a kernel build) to ``train_seconds``."""
        st, tr, d = self.state, self.tr, self.dist
        t_step, built = time.perf_counter(), cpu_kernel.build_seconds()
        batch = self.task.batch(tr.lengths_at(st.step), tr.batch_size, rng=st.data_rng)
        n_global = int((batch.labels != IGNORE_INDEX).sum())
        per_rank = tr.batch_size // d.world
        mine = rank_rows(batch, d.rank * per_rank, (d.rank + 1) * per_rank)
        if self.loss_fn is not None:  # static shapes for the compiled step: 20 batches of the MQMTAR paper
            # preset's lengths 32-64 had 15 token counts, in 3 buckets
            mine = pad_batch(mine, bucket_length(mine.input_ids.shape[1]))
        mine = mine.to(self.device)
        lr = lr_at(st.step, tr)
        loss_sum, gnorm = train_step(
            self.model,
            self.opt,
            mine,
            n_target=n_global,
            lr=lr,
            grad_clip=tr.grad_clip,
            autocast=self.autocast,
            dist=None if self.sharded else d,
            loss_fn=self.loss_fn,
        )
        if self.loss_fn is not None and self.loss_fn.note is not None:
            self.log(f"note: {self.loss_fn.note}")
            self.loss_fn.note = None
        st.step += 1
        total = d.all_reduce_(loss_sum.reshape(1).clone())
        st.loss_sum += float(total) / max(1, n_global)
        st.loss_count += 1
        self.update_s = time.perf_counter() - t_step - (cpu_kernel.build_seconds() - built)
        st.train_seconds += self.update_s
        return batch, lr, gnorm

    def _log_losses(self, batch: Batch, lr: float, gnorm: torch.Tensor, tokens_per_s: float, eta: str) -> None:
        """Log the mean loss since the last record (``metrics.jsonl`` and a line) and restart the running sum."""
        st, tr = self.state, self.tr
        mean = st.loss_sum / st.loss_count
        st.loss_sum, st.loss_count = 0.0, 0
        if st.first_loss is None:
            st.first_loss = mean
        st.last_loss = mean
        self.log.metrics(
            {
                "step": st.step,
                "loss": mean,
                "lr": lr,
                "grad_norm": float(gnorm),
                "tokens_per_s": tokens_per_s,
                "length": int(batch.length[0]),
                "time": now(),
            }
        )
        if self.log.bar is not None:
            self.log.bar.set_postfix(loss=f"{mean:.4f}", lr=f"{lr:.2e}")
        else:
            self.log(
                f"step {st.step:>6}/{tr.steps}  loss {mean:.4f}  lr {lr:.2e}  |g| {float(gnorm):.3f}  "
                f"{tokens_per_s:,.0f} tok/s  ETA {eta}"
            )

    def validate(self) -> None:
        """Measure the objective at every validation length; record it and write ``best.pt`` when it is the best
        so far. Under FSDP every rank runs the same passes (the units gather their weights collectively)."""
        st, tr, d = self.state, self.tr, self.dist
        if d.main or self.sharded:
            t_val = time.perf_counter()
            with fsdp.gathered(self.model) if self.sharded else contextlib.nullcontext():
                res = {
                    str(L): self.objective.measure(
                        self.model,
                        self.task,
                        L,
                        tr.val_samples,
                        seed=tr.seed,
                        autocast_dtype=torch.bfloat16 if tr.bf16 else None,
                    )
                    for L in tr.val_lengths
                }
            self.model.train()
            means = self.objective.summary(res)
            self.val_s = time.perf_counter() - t_val
            rec = {"step": st.step, "val": res, **means, "seconds": round(self.val_s, 3), "time": now()}
            self.history.append(rec)
            self.log.metrics(rec)
            self.log(f"step {st.step:>6}  " + self.objective.line(res))
            key = self.objective.key(means)
            if st.best is None or key > st.best["key"]:
                st.best = {"key": key, "step": st.step}
                if self.out is not None:
                    state = fsdp.full_model_state(self.model) if self.sharded else None
                    if d.main:
                        save_checkpoint(
                            str(checkpoint_path(self.out, "best")),
                            self.model,
                            None,
                            extra={"step": st.step, "val": res, "config_hash": self.config_hash},
                            overwrite=True,
                            model_state=state,
                        )
        d.barrier()

    def save_last(self) -> None:
        """Write ``last.pt`` (model, optimizer, state); under FSDP the sharded checkpoint that resumes, plus a
        ``last.pt`` of the whole model without optimizer for the commands that read one file."""
        d = self.dist
        if self.out is None or (not d.main and not self.sharded):
            return
        t_save = time.perf_counter()
        extra = checkpoint_extra(self.state, world_size=d.world, config_hash=self.config_hash, time=now())
        path = checkpoint_path(self.out, "last")
        if self.sharded:
            fsdp.save_sharded(path.parent, self.model, self.opt, extra, d)
            state = fsdp.full_model_state(self.model)
            if d.main:
                save_checkpoint(str(path), self.model, None, extra=extra, overwrite=True, model_state=state)
        else:
            save_checkpoint(str(path), self.model, self.opt, extra=extra, overwrite=True)
        self.saved_step, self.save_s = self.state.step, time.perf_counter() - t_save

    def _past_deadline(self, deadline: Optional[float]) -> bool:
        """Whether the next update would not end before ``deadline``: its time is the last update's, plus a
        validation where one is due, plus the checkpoint a stop after it writes. Every rank gets one answer."""
        if deadline is None:
            return False
        now_s = time.time()
        if self.update_s is None:
            late = now_s >= deadline
        else:
            nxt = self.state.step + 1
            need = self.update_s + self.save_s
            if (self.tr.val_every and nxt % self.tr.val_every == 0) or nxt == self.tr.steps:
                need += self.val_s
            late = now_s + need > deadline
        if self.dist.world > 1:  # every rank stops at the same step
            late = bool(self.dist.all_reduce_(torch.tensor([float(late)], device=self.device)).item())
        return late

    def summary(self, *, resumed: bool, trained: int, stopped: bool) -> dict:
        """What ``train`` returns (see there)."""
        st = self.state
        return {
            "step": st.step,
            "first_loss": st.first_loss,
            "last_loss": st.last_loss,
            "best": st.best,
            "history": self.history,
            "model": self.model,
            "config": self.cfg,
            "resumed": resumed,
            "trained_steps": trained,
            "train_seconds": st.train_seconds,
            "compiled": self.loss_fn is not None,
            "stopped_at_deadline": stopped,
        }


# ---- the entry every caller uses ----------------------------------------------------------------------------
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
    with training_session(run, out) as session:
        trainer = Trainer(run, session, printer=printer, progress=progress)
        trainer.resume_or_start()
        return trainer.fit(tuple(callbacks), deadline)


@contextlib.contextmanager
def training_session(run: RunConfig, out: Optional[str]) -> Iterator[Session]:
    """The ``Session`` of this process for ``run``: the rank group (``torchrun``'s, or one process), the device,
    and, with a run folder, its mode from ``check_run_dir`` (a refused folder is left untouched) and its lock
    held until the block ends. A folder this call created is removed again if the block fails before a
    checkpoint exists; the rank group is closed at the end."""
    _check_device(run.train)  # before anything is created: a refused run leaves no folder
    d = Dist()
    out_path = Path(out) if out is not None else None
    created = out_path is not None and d.main and not out_path.exists()
    try:
        if run.train.batch_size % d.world:
            raise ConfigError(f"train.batch_size {run.train.batch_size} is not divisible by the {d.world} ranks")
        dev = _device(run.train, d)
        if out_path is None:
            yield Session(d, dev, None, "memory")
        elif not d.main:
            yield Session(d, dev, out_path, d.broadcast_obj(None))
        else:
            mode = check_run_dir(out_path, run.as_dict())  # before the lock: a refused folder is left untouched
            with run_lock(out_path):
                yield Session(d, dev, out_path, d.broadcast_obj(mode))
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
