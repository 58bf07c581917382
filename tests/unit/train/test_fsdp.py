"""FSDP2 training (``train.parallel = "fsdp"``, longsparse/train/fsdp.py): under torchrun with 2 CPU ranks (gloo)
every architecture reaches the single-process weights, and a run killed mid-way resumes from its sharded
checkpoint (torch.distributed.checkpoint) to the uninterrupted run bit for bit. The torchrun tests are slow (a
few seconds of process start-up each); the sharding pieces are also checked in one process (a 1-rank group)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.paths import FAULTS

from longsparse.cli import main
from longsparse.models import read_checkpoint
from longsparse.train import build_config, fsdp, train

COMMON = [
    "train.warmup_steps=2",
    "train.threads=1",
    "train.device=cpu",
    "train.log_every=1",
    "train.ckpt_every=3",
]
ARCHS = {
    "transformer": [
        "--task",
        "two_back",
        "--method",
        "entmax",
        "--positions",
        "nape",
        *[
            x
            for s in [
                "model.d_model=32",
                "model.d_ff=64",
                "model.n_heads=2",
                "train.batch_size=8",
                "train.val_every=3",
                "train.val_lengths=[16]",
                "train.val_samples=2",
                *COMMON,
            ]
            for x in ("--set", s)
        ],
    ],
    "hsa": [
        "--task",
        "passkey",
        "--arch",
        "hsa",
        *[
            x
            for s in [
                "model.d_model=32",
                "model.n_heads=2",
                "model.d_ff=32",
                "model.n_lower=1",
                "model.n_upper=1",
                "model.chunk_size=8",
                "model.window=8",
                "model.topk=2",
                "task.params.min_distance=8",
                "task.params.num_filler=8",
                "task.params.value_len=2",
                "train.train_lengths=[32, 48]",
                "train.batch_size=4",
                "train.val_every=3",
                "train.val_lengths=[48]",
                "train.val_samples=4",
                *COMMON,
            ]
            for x in ("--set", s)
        ],
    ],
}
FSDP = ["--set", "train.parallel=fsdp"]


def _torchrun(args, kill_after=None, check=True):
    """The library's `train` under torchrun with 2 CPU ranks; ``kill_after``: both ranks SIGKILL themselves after
    that step (tests/helpers/faults.py)."""
    target = ["-m", "longsparse.cli"] if kill_after is None else [str(FAULTS), str(kill_after), "--"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *target, "train"]
    p = subprocess.run(
        [*cmd, *args], capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    if check:
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    return p


def _losses(run: Path):
    return [
        (r["step"], r["loss"], r["lr"], r["grad_norm"])
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if "loss" in r
    ]


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHS))
def test_fsdp_two_ranks_reach_the_single_process_weights(tmp_path, arch):
    single, sharded = tmp_path / "single", tmp_path / "fsdp"
    assert main(["train", *ARCHS[arch], "--steps", "6", "--out", str(single)]) == 0
    _torchrun([*ARCHS[arch], *FSDP, "--steps", "6", "--out", str(sharded)])
    a, b = (
        read_checkpoint(str(single / "checkpoints" / "last.pt")),
        read_checkpoint(str(sharded / "checkpoints" / "last.pt")),
    )
    assert b["extra"]["world_size"] == 2 and b["config"] == a["config"] and a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-4, atol=1e-5, msg=k)
    flat = [[v for row in _losses(run) for v in row[:3]] for run in (single, sharded)]
    assert flat[0] == pytest.approx(flat[1], rel=1e-4)
    # the resumable checkpoint is sharded: one file of shards per rank, behind the pointer
    folder = fsdp.sharded_checkpoint(sharded / "checkpoints")
    assert folder.name == "last-6.dcp" and len(list(folder.glob("*.distcp"))) == 2
    assert sorted(p.name for p in (sharded / "checkpoints").iterdir()) == [
        "best.pt",
        "last-6.dcp",
        "last.dcp.json",
        "last.pt",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHS))
def test_fsdp_resume_after_sigkill_is_bit_exact(tmp_path, arch):
    """Killed after step 5 (the last sharded checkpoint is step 3's), then resumed: the same losses, learning
    rates, gradient norms and final weights as the uninterrupted run, bit for bit."""
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    args = [*ARCHS[arch], *FSDP, "--steps", "8"]
    _torchrun([*args, "--out", str(ref)])
    p = _torchrun([*args, "--out", str(killed)], kill_after=5, check=False)
    assert p.returncode != 0 and fsdp.sharded_checkpoint(killed / "checkpoints").name == "last-3.dcp"
    _torchrun([*args, "--out", str(killed)])
    assert _losses(killed) == _losses(ref)
    a, b = (
        read_checkpoint(str(ref / "checkpoints" / "last.pt")),
        read_checkpoint(str(killed / "checkpoints" / "last.pt")),
    )
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    # a sharded run is not resumed without FSDP: one line says how
    cfg = json.loads((killed / "config.json").read_text())
    with pytest.raises(ValueError, match=r"trained with FSDP \(a sharded checkpoint\); resume it under torchrun"):
        train(cfg, str(killed), printer=lambda *_: None)


# ---- one process: the pieces ------------------------------------------------------------------------------------
class _OneRank:
    main, world = True, 1

    def barrier(self):
        pass


@pytest.fixture
def one_rank_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield _OneRank()
    dist.destroy_process_group()


@pytest.mark.parametrize("arch", ["transformer", "hsa"])
def test_sharded_checkpoint_round_trip_and_gathered_weights(tmp_path, one_rank_group, arch):
    """shard_model makes a unit of every block and the root; save_sharded / load_sharded restore model and
    optimizer exactly; inside `gathered` the weights are plain tensors (decoding can call any part)."""
    from torch.distributed.fsdp import FSDPModule

    from longsparse.train.config import RunConfig
    from longsparse.train.loop import build_model_and_optimizer

    sets = [s for s in ARCHS[arch] if "=" in s]
    task, kw = ("two_back", {}) if arch == "transformer" else ("passkey", {"arch": "hsa"})
    run = RunConfig.from_dict(build_config(task, steps=2, sets=sets, **kw))
    model, opt = build_model_and_optimizer(run, run.task.build(), torch.device("cpu"), shard=True)
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    assert model in units and len(units) == 1 + sum(len(lst) for lst in lists)
    ids = torch.randint(0, 8, (2, 32))
    model(ids).float().sum().backward()
    opt.step()
    extra = {"step": 2, "config_hash": run.hash}
    folder = fsdp.save_sharded(tmp_path / "ck", model, opt, extra, one_rank_group)
    before = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    names = {p: n for n, p in model.named_parameters()}
    moments = {names[p]: s["exp_avg"].full_tensor().clone() for p, s in opt.state.items()}
    model2, opt2 = build_model_and_optimizer(run, run.task.build(), torch.device("cpu"), shard=True)
    assert fsdp.load_sharded(fsdp.sharded_checkpoint(tmp_path / "ck"), model2, opt2) == extra and folder.is_dir()
    for k, v in model2.state_dict().items():
        assert torch.equal(v.full_tensor(), before[k]), k
    names2 = {p: n for n, p in model2.named_parameters()}
    # the same AdamW state, and none for a parameter that had no gradient (it would count an extra step)
    assert {names2[p] for p in opt2.state} == set(moments)
    for p, st in opt2.state.items():
        assert torch.equal(st["exp_avg"].full_tensor(), moments[names2[p]])
    with fsdp.gathered(model2):
        assert not any(hasattr(p, "full_tensor") for p in model2.parameters())
    assert all(hasattr(p, "full_tensor") for p in model2.parameters())
    assert set(fsdp.full_model_state(model2)) == set(before)


def test_parallel_must_be_ddp_or_fsdp(capsys, tmp_path):
    assert main(["train", "--task", "copy", "--set", "train.parallel=zero", "--out", str(tmp_path / "r")]) == 2
    assert "train.parallel must be one of ddp, fsdp, got 'zero'" in capsys.readouterr().err
