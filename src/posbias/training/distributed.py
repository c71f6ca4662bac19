"""Data-parallel helpers for ``torchrun`` (DDP over gloo on CPU, nccl on CUDA).

``torchrun --nproc_per_node N -m posbias.cli.main train ...`` (or any script calling
:func:`posbias.training.train`) sets ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``; without them
everything runs in one process.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    initialised_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(device: str = "auto", local_rank: int = 0) -> torch.device:
    if device == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device(f"cuda:{local_rank}")
    return d


def init_distributed(device: str = "auto") -> DistInfo:
    """Join the process group when launched by torchrun (idempotent); return rank, world and device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local)
    if world <= 1:
        return DistInfo(0, 1, 0, dev)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    here = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        here = True
    return DistInfo(rank, world, local, dev, here)


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def mean_across(value: float, info: DistInfo) -> float:
    """Average a Python float over all ranks."""
    if not info.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=info.device)
    dist.all_reduce(t)
    return float(t.item()) / info.world_size


def cleanup(info: DistInfo) -> None:
    if info.initialised_here and dist.is_initialized():
        dist.destroy_process_group()
