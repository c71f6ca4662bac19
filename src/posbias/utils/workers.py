"""The one way posbias runs work in other processes on this machine: a spawn-context process pool
whose workers split the command's CPU threads evenly between them (torch threads) and, on a CUDA
machine, each see one GPU of their own (``CUDA_VISIBLE_DEVICES``, :func:`gpu_slots`); used by the
search's ``--workers`` and the study's ``--train-workers``."""
from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable

import torch

from posbias.utils.threads import thread_budget


def threads_per_worker(workers: int) -> int:
    """Torch threads per worker (at least 1): the command's thread budget (``posbias --threads``,
    ``OMP_NUM_THREADS``, else one per core) split evenly."""

    return max(1, thread_budget() // max(1, workers))


def gpu_slots(workers: int, shard: bool = False) -> list[str] | None:
    """The GPUs each of ``workers`` workers sees (a ``CUDA_VISIBLE_DEVICES`` value): one visible GPU
    each, in turn (worker ``i`` gets GPU ``i mod count``); with ``shard`` (``--device shard``) a run of
    ``count // workers`` consecutive GPUs each (at least one), for the worker to split its model over.
    None on a machine without CUDA."""

    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    ids = visible[:count] if visible else [str(i) for i in range(count)]
    size = max(1, len(ids) // workers) if shard else 1
    return [",".join(ids[(i * size + j) % len(ids)] for j in range(size)) for i in range(workers)]


def _init(threads: int, initializer: Callable | None, initargs: tuple, gpus=None) -> None:
    if gpus is not None:  # before anything in this process initialises CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus.get(timeout=600)
    torch.set_num_threads(threads)
    if initializer is not None:
        initializer(*initargs)


def spawn_pool(workers: int, initializer: Callable | None = None, initargs: tuple = (),
               gpus: list[str] | None = None) -> ProcessPoolExecutor:
    """A ``ProcessPoolExecutor`` of ``workers`` spawned processes (safe with torch and CUDA), each with
    ``cpu_count // workers`` torch threads and, given ``gpus`` (one ``CUDA_VISIBLE_DEVICES`` value per
    worker, :func:`gpu_slots`), its own GPU as ``cuda:0``; then ``initializer(*initargs)`` (which must
    be picklable)."""

    ctx = mp.get_context("spawn")
    slots = None
    if gpus:
        slots = ctx.Queue()
        for gpu in gpus:
            slots.put(gpu)
    return ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init,
                               initargs=(threads_per_worker(workers), initializer, initargs, slots))
