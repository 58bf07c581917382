"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the trainer: ``train.parallel = "fsdp"`` under torchrun.

Sharding. Every element of every ``nn.ModuleList`` of the model (the blocks of each architecture: the decoder's
``blocks``, HSA's ``lower`` / ``upper`` layers and its encoder's ``layers``) becomes one FSDP unit, and the root
takes the rest (embeddings, head, norms, HSA's CLS and retrieval parameters): each rank keeps 1/K of every
parameter and of its AdamW state, and a unit's parameters are gathered only while it runs. The gradients are
reduce-scattered as a *sum* (divide factor 1): the loss of each rank is already divided by the global number of
target tokens, as in the data-parallel path, so K ranks compute the single-process update.

Checkpoints. ``last`` is sharded with ``torch.distributed.checkpoint`` (DCP): every rank writes its shards of the
model and optimizer into ``checkpoints/last-<step>.dcp/``, rank 0 adds the run's extra state (step, data stream,
RNG, loss accumulator, ...) as ``extra.pt`` there and then points ``checkpoints/last.dcp.json`` at the folder (an
atomic write: a kill at any moment leaves the pointer on the previous complete checkpoint), and older folders are
removed. Resuming reads the pointed folder into the sharded model and optimizer (DCP reshards to another world
size). For the commands that read one file (eval, report, figures) rank 0 also writes ``last.pt`` and ``best.pt``
holding the whole model (gathered, without optimizer state), as every other run does.

Validation gathers every weight on every rank (`gathered`: decoding calls parts of the model outside their unit's
forward), runs the same passes on every rank, and rank 0 records it; the weights are sharded again afterwards.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from torch import nn

from longsparse.io import atomic_torch_save, atomic_write_text, is_temp_name

POINTER = "last.dcp.json"


def shard_model(model: nn.Module) -> nn.Module:
    """``fully_shard`` every element of every ModuleList of ``model``, then the root (in place; returns it)."""
    from torch.distributed.fsdp import fully_shard

    units = [m for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst]
    for unit in reversed(units):  # innermost first: a unit inside another unit's list is sharded before its parent
        fully_shard(unit, reshard_after_forward=True)
    fully_shard(model, reshard_after_forward=False)  # the root's weights are needed again at once in backward
    for unit in [*units, model]:  # each unit reduces its own gradients: a sum, in plain SUM collectives (gloo too)
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return model


def _units(model: nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model: nn.Module):
    """Every weight of the sharded ``model`` whole on every rank inside the block, then sharded again (collective:
    every rank enters it). Validation needs it: decoding calls the model's parts (embedding, head, HSA's encoder)
    outside their FSDP unit's forward, where sharded weights would meet plain tensors."""
    units = _units(model)
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield model
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(unit is not model, recurse=False)


def full_model_state(model: nn.Module) -> Dict[str, torch.Tensor]:
    """The whole model's state dict on CPU on rank 0 ({} elsewhere). Collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def sharded_checkpoint(checkpoints: Path) -> Optional[Path]:
    """The folder of the last complete sharded checkpoint under ``checkpoints`` (by its pointer), or None."""
    pointer = Path(checkpoints) / POINTER
    if not pointer.is_file():
        return None
    try:
        folder = Path(checkpoints) / json.loads(pointer.read_text())["folder"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{pointer}: not a sharded-checkpoint pointer ({e})") from None
    if not (folder / "extra.pt").is_file():
        raise ValueError(f"{pointer} names {folder}, which holds no complete checkpoint")
    return folder


def save_sharded(checkpoints: Path, model: nn.Module, opt: torch.optim.Optimizer, extra: Dict[str, Any], dist) -> Path:
    """Write the sharded checkpoint of ``step = extra["step"]`` (every rank calls this); returns its folder."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    checkpoints = Path(checkpoints)
    folder = checkpoints / f"last-{int(extra['step'])}.dcp"
    if dist.main and folder.exists():  # a rerun of this step after a kill before its pointer was written
        shutil.rmtree(folder)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))
    dist.barrier()
    if dist.main:
        atomic_torch_save(extra, folder / "extra.pt")
        atomic_write_text(checkpoints / POINTER, json.dumps({"folder": folder.name, "step": int(extra["step"])}) + "\n")
        for old in checkpoints.glob("last-*.dcp"):
            if old != folder and not is_temp_name(old.name):
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return folder


def load_sharded(folder: Path, model: nn.Module, opt: torch.optim.Optimizer) -> Dict[str, Any]:
    """Read the sharded checkpoint in ``folder`` into the (sharded) model and optimizer; returns its extra state.
    Every rank calls this."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    saved = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    model_sd, optim_sd = get_state_dict(model, opt)  # gives every parameter an (empty) AdamW state
    # a parameter without a gradient before the checkpoint had no AdamW state then: it gets none now either (an
    # empty state would count an extra step in AdamW's bias correction)
    optim_sd["state"] = {fqn: st for fqn, st in optim_sd["state"].items() if f"optim.state.{fqn}.step" in saved}
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(
        model,
        opt,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=StateDictOptions(strict=False),  # the parameters left without state above
    )
    return torch.load(Path(folder) / "extra.pt", weights_only=True)
