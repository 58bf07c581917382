"""LM training on packed sequences of the training split (+ a fraction of passkey rows), with resume.

Why not the shared ``longsparse.train`` loop: that loop is built around a synthetic ``Task`` (its batches,
seq2seq/tokcls labels and exact-match validation by generation). The LM study needs a token stream, loss on
*every* next token and perplexity validation, so this is a small loop of its own that reuses the shared
pieces: ``ModelConfig``/``Transformer``, the warm-up + cosine schedule ``longsparse.train.lr_at``, AdamW with
the same settings, and ``save_checkpoint``/``load_checkpoint`` (atomic writes).

Batches: every row is ``T + 1`` tokens. With probability ``1 − passkey_frac`` a row is a window of the
training stream (all documents joined with ``<|endoftext|>``) at a uniformly random offset; otherwise it is a
passkey example (``longsparse.lm.passkey``) of exactly ``T + 1`` tokens whose haystack is training text and
whose depth is uniform in [0, 1]. Loss: mean cross-entropy over all ``T`` next-token predictions of all rows.
All draws come from ``random.Random("longsparse:lm:train:<seed>")``; its state is checkpointed, so a killed
run resumes where it stopped (``last.pt`` every ``ckpt_every`` steps).
"""
from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from longsparse.io import atomic_write_text, read_json, read_jsonl
from longsparse.lm.passkey import PasskeyMaker
from longsparse.nn import ModelConfig, Transformer, load_checkpoint, save_checkpoint
from longsparse.train.loop import eta_text, lr_at


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def make_batch(stream: torch.Tensor, T: int, batch_size: int, rng: random.Random, maker: Optional[PasskeyMaker],
               passkey_frac: float):
    """(inputs, targets), both (B, T) long."""
    rows = []
    n = len(stream)
    for _ in range(batch_size):
        if maker is not None and passkey_frac > 0 and rng.random() < passkey_frac:
            ex = maker.make(stream, T + 1, rng.random(), rng)
            rows.append(torch.tensor(ex.ids, dtype=torch.long))
        else:
            o = rng.randint(0, n - T - 1)
            rows.append(stream[o:o + T + 1])
    x = torch.stack(rows)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def build_model(model_cfg: dict, vocab_size: int) -> Transformer:
    return Transformer(ModelConfig.from_dict({"vocab_size": vocab_size, **model_cfg}))


def train_lm(cfg: dict, run_dir, tokens: dict, tokenizer, printer: Callable[[str], None] = print) -> dict:
    """Train (or resume) one run. ``tokens``: split -> 1-D long tensor. Writes ``run_dir/{config.json,
    last.pt, metrics.jsonl, train.log, train_done.json}``; returns the train_done record."""
    tr = cfg["train"]
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "config.json"
    if cfg_path.exists():
        old = read_json(cfg_path)
        if old != cfg:
            raise ValueError(f"{out} holds a run with another config; use a new directory")
    else:
        atomic_write_text(cfg_path, json.dumps(cfg, indent=2) + "\n")
    done_path = out / "train_done.json"
    if done_path.exists():
        printer(f"{out}: already trained")
        return read_json(done_path)

    def log(msg):
        printer(msg)
        with open(out / "train.log", "a") as f:
            f.write(msg + "\n")

    if tr.get("threads"):
        torch.set_num_threads(tr["threads"])
    torch.manual_seed(tr["seed"])
    model = build_model(cfg["model"], tokenizer.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=tr["lr"], betas=tuple(tr["betas"]), weight_decay=0.0)
    rng = random.Random(f"longsparse:lm:train:{tr['seed']}")
    maker = PasskeyMaker(tokenizer, tr["passkey_digits"]) if tr["passkey_frac"] > 0 else None
    step, elapsed = 0, 0.0
    last = out / "last.pt"
    if last.exists():
        model, extra = load_checkpoint(str(last), optimizer=opt, model=model)
        step, elapsed = int(extra["step"]), float(extra["elapsed_s"])
        v, state, g = extra["rng"]
        rng.setstate((v, tuple(state), g))
        torch.set_rng_state(extra["torch_rng"])
        keep = [r for r in read_jsonl(out / "metrics.jsonl")      # a line torn by a kill is dropped
                if r.get("step", 0) <= step] if (out / "metrics.jsonl").exists() else []
        atomic_write_text(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in keep))
        log(f"[{now()}] resuming {out} at step {step}/{tr['steps']}")
    else:
        log(f"[{now()}] new LM run {out}: method={cfg['model']['method']} positions={cfg['model']['positions']} "
            f"params={model.num_parameters():,} T={tr['seq_len']} batch={tr['batch_size']} steps={tr['steps']} "
            f"passkey_frac={tr['passkey_frac']}")
    stream = tokens["train"]
    T, B = tr["seq_len"], tr["batch_size"]
    sched = {"lr": tr["lr"], "warmup_steps": tr["warmup_steps"], "steps": tr["steps"],
             "min_lr_ratio": tr["min_lr_ratio"]}

    def save():
        v, state, g = rng.getstate()
        save_checkpoint(str(last), model, opt, overwrite=True,
                        extra={"step": step, "elapsed_s": elapsed, "rng": [v, list(state), g],
                               "torch_rng": torch.get_rng_state(), "time": now()})

    model.train()
    acc, nacc, t_last = 0.0, 0, time.perf_counter()
    start_step, session_s = step, 0.0
    while step < tr["steps"]:
        x, y = make_batch(stream, T, B, rng, maker, tr["passkey_frac"])
        lr = lr_at(step, sched)
        for g in opt.param_groups:
            g["lr"] = lr
        logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), tr["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        acc += float(loss.detach())
        nacc += 1
        t = time.perf_counter()
        elapsed += t - t_last
        session_s += t - t_last
        t_last = t
        if step % tr["log_every"] == 0 or step == tr["steps"] or step == 1:
            rec = {"step": step, "loss": acc / nacc, "lr": lr, "grad_norm": float(gnorm), "elapsed_s": elapsed,
                   "time": now()}
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
            log(f"step {step:>5}/{tr['steps']}  loss {acc / nacc:.4f}  ppl {math.exp(acc / nacc):8.2f}  "
                f"lr {lr:.2e}  {elapsed:6.0f} s  ETA {eta_text(step - start_step, tr['steps'] - step, session_s)}")
            acc, nacc = 0.0, 0
        if step % tr["ckpt_every"] == 0 or step == tr["steps"]:
            save()
            t_last = time.perf_counter()     # checkpoint I/O is not training time
    done = {"step": step, "train_wall_s": round(elapsed, 1), "params": model.num_parameters(), "time": now(),
            "torch_threads": torch.get_num_threads()}
    atomic_write_text(done_path, json.dumps(done, indent=2) + "\n")
    log(f"[{now()}] done: {step} steps in {elapsed:.0f} s")
    return done
