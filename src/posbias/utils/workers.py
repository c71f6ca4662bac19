"""The one way posbias runs work in other processes on this machine: a spawn-context process pool
whose workers split the command's CPU threads evenly between them (torch threads), used by the search's
``--workers`` and the study's ``--train-workers``."""
from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from typing import Callable


def threads_per_worker(workers: int) -> int:
    """Torch threads per worker (at least 1): the command's thread budget (``posbias --threads``,
    ``OMP_NUM_THREADS``, else one per core) split evenly."""
    from posbias.utils.threads import thread_budget

    return max(1, thread_budget() // max(1, workers))


def _init(threads: int, initializer: Callable | None, initargs: tuple) -> None:
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    if initializer is not None:
        initializer(*initargs)


def spawn_pool(workers: int, initializer: Callable | None = None, initargs: tuple = ()) -> ProcessPoolExecutor:
    """A ``ProcessPoolExecutor`` of ``workers`` spawned processes (safe with torch and CUDA), each with
    ``cpu_count // workers`` torch threads, then ``initializer(*initargs)`` (which must be picklable)."""
    import multiprocessing as mp

    return ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init,
                               initargs=(threads_per_worker(workers), initializer, initargs))
