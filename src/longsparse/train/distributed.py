"""Data parallel under ``torchrun``: the process group (``Dist``), the gradient sum over ranks and each rank's
slice of the global batch.

Every rank draws the same *global* batch from the same stream and keeps its own contiguous slice of rows
(``rank_rows``); the loss is the sum over the rank's target tokens divided by the number of target tokens of the
global batch, and the gradients are summed over ranks (``sum_grads``: one flat all-reduce), so K processes
compute the same update as one process on the global batch (up to float summation order)."""

from __future__ import annotations

import os

import torch

from longsparse.tasks import Batch


class Dist:
    """This process's place among the ranks ``torchrun`` started (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``; one
    process without them), with the collectives the trainer uses; every collective is a no-op on one rank. Joins
    (and ``close`` leaves) the process group unless the caller already set one up."""

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


def sum_grads(model: torch.nn.Module, d: Dist) -> None:
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


def rank_rows(batch: Batch, lo: int, hi: int) -> Batch:
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
