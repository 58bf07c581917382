"""`longsparse eval RUN --lengths ...`: a length sweep of a trained run, saved as a new JSON file in RUN/eval/.

Result file (``format = "longsparse-eval"``, version 1)::

    {"format", "version", "run", "run_name", "label" ("method/positions"; see train.run_label), "task",
     "task_preset", "arch", "method", "positions", "checkpoint" ("best"|"last"), "checkpoint_step",
     "train_lengths", "samples", "seed",
     "results": [{"length", "ratio" (length / max training length), "n", "n_exact", "exact_match",
                  "exact_match_ci" [lo, hi] (95% Wilson), "n_tokens", "n_correct_tokens", "token_accuracy",
                  "token_accuracy_ci", "batch_size", "seconds", "seed", "split"}, ...],
     "config", "env", "created", "command"}

Every model decodes through its own ``generate`` (HSA: its exact long-context fast path). For an architecture
with a needle scorer (``longsparse.models``: HSA's ``longsparse.hsa.score_needles``: recall@k, full recall, mean
rank and weight of the needle's chunk, exact match given recall / given a miss), each result on a task with
needles (``task.needle_positions``: the RULER-style tasks) also has ``"needles"``: its retrieval diagnostics of
the same examples.

Every call writes a new file (``eval-<time>[-k].json``, created exclusively); earlier results are never touched.
The file appears with the first length's results and is replaced atomically after each further length
(``longsparse.io``), so an interrupted evaluation leaves complete JSON with the lengths done, or no file at all.

Before any length is scored, every length is checked: valid for the task, and its estimated memory
(``longsparse.evaluate.memory``) within what the device has free; a refusal names the largest length that fits.

Resumable evaluation (``until`` or ``max_examples``, a job with a wall-clock limit; ``resumable``, a study runner
whose calls may be killed). A length that cannot finish
keeps its counts and the test stream's position in ``RUN/eval_partial/<checkpoint>-L<length>-n<samples>-seed<seed>
.json`` (rewritten after every batch, so a killed call loses one batch at most), and the next resumable call
continues it there; a length whose examples are all scored, over one call or several, goes into the result file
like any other, with ``"pieces"`` (examples, seconds, device per call). The examples are one seeded stream
whatever the batches, so it holds the examples, and the counts, of one uninterrupted call. A partial state of
another checkpoint step (the run trained on since) is set aside as ``….step<S>.stale.json``, never continued.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

from longsparse.evaluate.memory import check_lengths_fit
from longsparse.io import atomic_write_text, read_json_or_none, write_new
from longsparse.models import DEFAULT_ARCH, config_section, get_architecture, load_checkpoint
from longsparse.tasks.scoring import (
    check_batch_tokens,
    eval_batch_size,
    new_score_state,
    score_length,
    score_more,
    score_result,
    sequence_tokens,
)
from longsparse.train.config import attention_of, make_task, run_label
from longsparse.train.rundir import RunDirError, checkpoint_path, environment, normalise, now, read_config

FORMAT, VERSION = "longsparse-eval", 1
# Longest length accepted at all: beyond it token positions overflow int32 kernels and no machine holds the
# example; the memory check refuses most lengths long before this.
MAX_LENGTH = 2**31 - 1


def parse_lengths(text: str | Iterable[int]) -> list[int]:
    """``"64,128,256"`` or ``"64-4096"`` (powers of two from 64 to 4096) or a list of ints."""
    if not isinstance(text, str):
        vals = list(text)
    else:
        vals = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            if "-" in part[1:]:
                a, b = part.split("-", 1)
                if not a.strip() or not b.strip():
                    raise ValueError(f"bad length range {part!r}: use LO-HI, e.g. 64-4096")
                lo, hi = _int(a), _int(b)
                if lo < 1 or hi < lo:
                    raise ValueError(f"bad length range {part!r}: need 1 <= lo <= hi")
                x = lo
                while x <= hi:
                    vals.append(x)
                    x *= 2
            else:
                vals.append(_int(part))
    if not vals:
        raise ValueError("no lengths given")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"lengths must be positive integers, got {v!r}")
        if v > MAX_LENGTH:
            raise ValueError(f"length {v} is too long: at most {MAX_LENGTH:,} tokens")
    return sorted(set(vals))


def _int(s: str) -> int:
    s = s.strip().lower()
    text, mult = s, 1
    if s.endswith("k"):
        s, mult = s[:-1], 1024
    if not (s.isascii() and s.isdigit()) or len(s) > 12:  # int() would take "1_000"; 12 digits bound a range
        if s.isdigit():
            raise ValueError(f"length {text!r} is too long: at most {MAX_LENGTH:,} tokens")
        raise ValueError(f"not a length: {text!r} (use integers like 64,128 or 16k)")
    return int(s) * mult


def load_run_model(run: str | Path, which: str = "best", device: str | torch.device = "cpu"):
    """(model, config, checkpoint extra) of a run; clear errors for a missing/corrupt checkpoint."""
    cfg = read_config(run)
    path = checkpoint_path(run, which)
    if not path.exists():
        other = [w for w in ("best", "last") if w != which and checkpoint_path(run, w).exists()]
        raise RunDirError(
            f"{run}: no {which} checkpoint ({path})"
            + (
                f"; available: {', '.join(other)} (use --checkpoint {other[0]})"
                if other
                else "; has the run been trained?"
            )
        )
    model, extra = load_checkpoint(str(path), map_location=device)
    stored = dict(cfg["model"])
    have = config_section(model.cfg)
    have.pop("vocab_size")
    if normalise(have) != normalise(stored):
        raise RunDirError(f"{path}: the checkpoint's model config does not match {run}/config.json")
    return model, cfg, extra


def evaluate_run(
    run: str | Path,
    lengths,
    *,
    samples: int = 100,
    checkpoint: str = "best",
    seed: int = 0,
    batch_tokens: Optional[int] = None,
    device: str = "auto",
    bf16: bool = False,
    printer: Optional[Callable[[str], None]] = print,
    write: bool = True,
    progress: bool = True,
    check_memory: bool = True,
    until: Optional[float] = None,
    max_examples: Optional[int] = None,
    resumable: bool = False,
) -> tuple[Optional[Path], dict]:
    """Evaluate a run at each length; returns (path of the new result file or None, result dict).
    ``progress``: a progress bar per length on stderr when it is a terminal. ``check_memory``: refuse lengths
    whose estimated memory exceeds what is free (``longsparse.evaluate.memory``). ``until`` (a ``time.time()``
    value) or ``max_examples`` (per length and call) make the evaluation resumable (module docstring): a length
    stops before a batch that would end after ``until``, or after ``max_examples`` examples, and continues in the
    next such call; the result dict then lists those lengths under ``"unfinished"`` ({length, done, samples})
    and its ``"results"`` (and the file) only the finished ones. ``resumable`` alone (no limit): every length
    is scored to the end, continuing a state an earlier call left, and keeps its state until it is done (a study
    runner's evaluations, so that a call killed mid-length loses one batch at most)."""
    run = Path(run)
    lengths = parse_lengths(lengths)
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise ValueError(f"--samples must be a positive integer, got {samples!r}")
    check_batch_tokens(batch_tokens)
    if max_examples is not None and (
        isinstance(max_examples, bool) or not isinstance(max_examples, int) or max_examples < 1
    ):
        raise ValueError(f"max_examples must be a positive integer, got {max_examples!r}")
    resumable = resumable or until is not None or max_examples is not None
    if resumable and not write:
        raise ValueError(
            "a resumable evaluation (resumable / until / max_examples) keeps its state in the run folder: write=True"
        )
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():  # else torch.load blames the checkpoint
        raise ValueError(
            f"--device cuda: CUDA is not available (torch {torch.__version__}"
            + (", built without CUDA" if torch.version.cuda is None else ", no usable GPU")
            + "); use --device cpu"
        )
    cfg = read_config(run)
    task = make_task(cfg["task"])
    if task.objective != "exact_match":
        raise ValueError(
            f"{run}: a {task.name!r} run is scored by {task.objective}, not by exact match by length; "
            f"evaluate it with longsparse.lm.evaluate (the LM study: `longsparse lm run`)"
        )
    for L in lengths:  # every length checked before any work
        try:
            task.check_length(L)
        except ValueError as e:
            raise ValueError(f"impossible length: {e}") from None
    dev = torch.device(
        "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
    )
    model, cfg, extra = load_run_model(run, checkpoint, dev)
    if check_memory:
        check_lengths_fit(model, task, lengths, samples, batch_tokens, dev)
    train_hi = cfg["train"]["train_lengths"][1]
    res = {
        "format": FORMAT,
        "version": VERSION,
        "run": str(run.resolve()),
        "run_name": run.name,
        "label": run_label(cfg),
        "task": cfg["task"]["name"],
        "task_preset": cfg["task"].get("preset"),
        "arch": cfg["model"].get("arch", DEFAULT_ARCH),
        "method": attention_of(cfg)["method"],
        "positions": attention_of(cfg)["positions"],
        "checkpoint": checkpoint,
        "checkpoint_step": extra.get("step"),
        "train_lengths": cfg["train"]["train_lengths"],
        "samples": samples,
        "seed": seed,
        "results": [],
        "config": cfg,
        "env": environment(1, str(dev)),
        "created": now(),
        "command": sys.argv,
    }
    path = None
    score_needles = get_architecture(res["arch"]).needle_scorer if hasattr(task, "needle_positions") else None
    unfinished = []
    for L in lengths:
        if resumable:
            r = _score_resumable(
                run,
                model,
                task,
                L,
                samples,
                checkpoint=checkpoint,
                step=extra.get("step"),
                seed=seed,
                batch_tokens=batch_tokens,
                autocast_dtype=torch.bfloat16 if bf16 else None,
                progress=progress,
                until=until,
                max_examples=max_examples,
                printer=printer,
                label=res["label"],
            )
            if r is None:
                unfinished.append(_unfinished(run, checkpoint, L, samples, seed))
                continue
        else:
            r = score_length(
                model,
                task,
                L,
                samples,
                seed=seed,
                split="test",
                batch_tokens=batch_tokens,
                autocast_dtype=torch.bfloat16 if bf16 else None,
                progress=progress,
            )
        r["ratio"] = L / train_hi
        if printer:
            lo, hi = r["exact_match_ci"]
            printer(
                f"{res['label']:<18} L={L:>6} ({r['ratio']:g}x)  exact match {100 * r['exact_match']:5.1f}% "
                f"[{100 * lo:.1f}, {100 * hi:.1f}]  token acc {100 * r['token_accuracy']:5.1f}%  "
                f"n={r['n']}  bs={r['batch_size']}  {r['seconds']:.1f}s"
            )
        if score_needles is not None:
            r["needles"] = nd = score_needles(
                model, task, L, samples, seed=seed, split="test", batch_size=r["batch_size"]
            )
            if printer:
                g = nd["exact_match_given_recall"]
                printer(
                    f"{'':<18} needles: recall@{nd['topk']} {nd['recall_at_k']:.3f}  full recall "
                    f"{nd['full_recall']['rate']:.3f}  rank {nd['mean_rank']:.2f}  weight "
                    f"{nd['mean_needle_weight']:.3f}  exact|recall "
                    + ("-" if g["rate"] is None else f"{g['rate']:.3f} (n={g['n']})")
                    + f"  {nd['seconds']:.1f}s"
                )
        res["results"].append(r)
        if write:  # partial results survive an interruption, always as complete JSON
            text = json.dumps(res, indent=1) + "\n"
            path = write_new(run / "eval", "eval", text) if path is None else atomic_write_text(path, text)
        if resumable:  # the result is in the file: its state is done with
            partial_path(run, checkpoint, L, samples, seed).unlink(missing_ok=True)
    if resumable:
        res["unfinished"] = unfinished
    return path, res


# ---- resumable evaluation ---------------------------------------------------------------------------------------
PARTIAL_DIR = "eval_partial"


def partial_path(run: str | Path, checkpoint: str, length: int, samples: int, seed: int) -> Path:
    """Where a resumable evaluation keeps the state of an unfinished length (module docstring)."""
    return Path(run) / PARTIAL_DIR / f"{checkpoint}-L{length}-n{samples}-seed{seed}.json"


def read_partial(run: str | Path, checkpoint: str, length: int, samples: int, seed: int) -> Optional[dict]:
    """The saved state of an unfinished length (``core.new_score_state``'s form plus checkpoint and step), or
    None when none is saved."""
    p = partial_path(run, checkpoint, length, samples, seed)
    return read_json_or_none(p, warn=None) if p.is_file() else None


def _unfinished(run: Path, checkpoint: str, length: int, samples: int, seed: int) -> dict:
    st = read_partial(run, checkpoint, length, samples, seed)
    return {"length": length, "done": st["done"] if st else 0, "samples": samples}


def _set_aside(path: Path, step) -> Path:
    """Rename the state of another checkpoint step out of the way (kept, never continued)."""
    k, dest = 0, path.with_name(f"{path.stem}.step{step}.stale.json")
    while dest.exists():
        k += 1
        dest = path.with_name(f"{path.stem}.step{step}.stale-{k}.json")
    path.replace(dest)
    return dest


def _device_kind(device) -> str:
    return str(device).split(":")[0]


def rate_hint(run: str | Path, task, checkpoint: str, length: int, device: str) -> Optional[float]:
    """Seconds per example expected at ``length`` before any is scored there: the rate measured on a device of
    ``device``'s kind (``cpu``, ``cuda``) at the longest shorter length of this checkpoint (result files and
    unfinished states of the run), scaled by the square of the token counts (attention's cost). None without
    such a measurement."""
    run, best = Path(run), None  # (length, seconds per example)
    kind = _device_kind(device)
    for f in sorted((run / "eval").glob("*.json")) if (run / "eval").is_dir() else []:
        d = read_json_or_none(f, warn=None)
        if (
            not isinstance(d, dict)
            or d.get("checkpoint") != checkpoint
            or _device_kind((d.get("env") or {}).get("device")) != kind
        ):
            continue
        for r in d.get("results", []):
            if (
                r.get("length", length) < length
                and r.get("seconds")
                and r.get("n")
                and (best is None or r["length"] > best[0])
            ):
                best = (r["length"], r["seconds"] / r["n"])
    for f in sorted((run / PARTIAL_DIR).glob(f"{checkpoint}-L*.json")) if (run / PARTIAL_DIR).is_dir() else []:
        st = read_json_or_none(f, warn=None)
        if not isinstance(st, dict) or not st.get("done") or not st.get("seconds") or not st.get("pieces"):
            continue
        if (
            _device_kind(st["pieces"][-1].get("device")) == kind
            and st["length"] < length
            and (best is None or st["length"] > best[0])
        ):
            best = (st["length"], st["seconds"] / st["done"])
    if best is None:
        return None
    return best[1] * (sequence_tokens(task, length) / sequence_tokens(task, best[0])) ** 2


def _score_resumable(
    run: Path,
    model,
    task,
    length: int,
    samples: int,
    *,
    checkpoint: str,
    step,
    seed: int,
    batch_tokens,
    autocast_dtype,
    progress: bool,
    until: Optional[float],
    max_examples: Optional[int],
    printer,
    label: str,
) -> Optional[dict]:
    """Continue (or begin) the scoring of one length from its saved state; its result once every sample is
    scored (``"pieces"``: the calls), else None with the state saved."""
    path = partial_path(run, checkpoint, length, samples, seed)
    state = read_partial(run, checkpoint, length, samples, seed)
    if state is None and path.is_file():  # writes are atomic: only a damaged file reads as nothing
        moved = _set_aside(path, "unreadable")
        if printer:
            printer(f"{label:<18} L={length:>6}: unreadable {path.name} set aside as {moved.name}; scoring starts over")
    if state is not None and state.get("checkpoint_step") != step:
        moved = _set_aside(path, state.get("checkpoint_step"))
        if printer:
            printer(
                f"{label:<18} L={length:>6}: an unfinished evaluation of checkpoint step {state.get('checkpoint_step')} "
                f"set aside as {moved.name} (the {checkpoint} checkpoint is at step {step})"
            )
        state = None
    if state is None:
        bs = eval_batch_size(task, length, samples, batch_tokens)
        state = {
            "checkpoint": checkpoint,
            "checkpoint_step": step,
            **new_score_state(length, samples, seed=seed, split="test", batch_size=bs),
        }
    dev = str(next(model.parameters()).device)
    hint = rate_hint(run, task, checkpoint, length, dev) if until is not None and not state["done"] else None

    def save(st: dict) -> None:
        if st["done"] < st["samples"]:
            path.parent.mkdir(exist_ok=True)
            atomic_write_text(path, json.dumps(st) + "\n")

    before = state["done"]
    stop = score_more(
        model,
        task,
        state,
        until=until,
        max_examples=max_examples,
        rate_hint=hint,
        autocast_dtype=autocast_dtype,
        progress=progress,
        on_batch=save,
    )
    if stop is None:
        return {**score_result(state), "pieces": state["pieces"]}
    if printer:
        r = score_result(state)
        printer(
            f"{label:<18} L={length:>6}: {state['done']}/{samples} examples scored ({state['done'] - before} in this "
            f"call), exact match so far "
            + (f"{100 * r['exact_match']:.1f}%" if state["done"] else "-")
            + f"; stopped: {stop}; the next resumable call continues"
        )
    return None
