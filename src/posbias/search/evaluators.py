"""Who scores the individuals of a GA generation: one fitness object in this process, a pool of
spawned processes (one model each), or Ray actors across nodes. Every evaluator has
``evaluate(jobs) -> list[FitnessResult]`` with jobs ``(factors, threshold, partial)``, returning
results in job order, so the search gives the same result with any of them."""
from __future__ import annotations

from typing import Any, Callable

from posbias.search.fitness import FitnessResult
from posbias.utils.progress import progress_iter
from posbias.utils.workers import spawn_pool

__all__ = ["SerialEvaluator", "PoolEvaluator", "RayEvaluator"]


# -- evaluators ----------------------------------------------------------------------------------
class SerialEvaluator:
    """Score jobs one after the other with one fitness object (one model)."""

    def __init__(self, fitness):
        self.fitness = fitness

    def evaluate(self, jobs: list[tuple[list[float], float | None, FitnessResult | None]]) -> list[FitnessResult]:

        # progress over the generation's individuals (in a log file: a line per 10%, so a nohup'd
        # search says something during a generation without redrawing a bar into the file)
        return [self.fitness.score(f, threshold=t, partial=p)
                for f, t, p in progress_iter(jobs, desc="individuals", unit="ind", leave=False)]

    def close(self) -> None:
        pass


_WORKER_FITNESS = None


def _worker_init(factory: Callable[[], Any]) -> None:
    global _WORKER_FITNESS
    _WORKER_FITNESS = factory()


def _worker_score(job) -> dict:
    factors, threshold, partial = job
    p = FitnessResult.from_dict(partial) if partial is not None else None
    return _WORKER_FITNESS.score(factors, threshold=threshold, partial=p).to_dict()


def _worker_num_layers(_=None) -> int:
    return int(getattr(_WORKER_FITNESS, "num_layers", 0))


class PoolEvaluator:
    """Score individuals in parallel: ``workers`` spawned processes, each building its own fitness
    (its own model) once with the picklable ``factory``; torch threads split evenly, and with ``gpus``
    (:func:`posbias.utils.workers.gpu_slots`) each worker on its own GPU."""

    def __init__(self, factory: Callable[[], Any], workers: int, gpus: list[str] | None = None):

        self.pool = spawn_pool(workers, _worker_init, (factory,), gpus=gpus)

    def num_layers(self) -> int:
        return self.pool.submit(_worker_num_layers).result()

    def evaluate(self, jobs) -> list[FitnessResult]:
        payload = [(f, t, p.to_dict() if p is not None else None) for f, t, p in jobs]
        return [FitnessResult.from_dict(d) for d in self.pool.map(_worker_score, payload)]

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class _RayWorker:
    """A Ray actor holding one fitness object (one model)."""

    def __init__(self, factory: Callable[[], Any]):
        self.fitness = factory()

    def score(self, job) -> dict:
        factors, threshold, partial = job
        p = FitnessResult.from_dict(partial) if partial is not None else None
        return self.fitness.score(factors, threshold=threshold, partial=p).to_dict()

    def num_layers(self) -> int:
        return int(getattr(self.fitness, "num_layers", 0))


class RayEvaluator:
    """Score individuals on a Ray cluster, across nodes: ``workers`` actors, one model each.

    Needs ``pip install 'posbias[ray]'``. ``address`` goes to ``ray.init`` (``"auto"`` joins a
    running cluster started with ``ray start``; ``None`` starts a local one). ``gpus_per_worker=1``
    gives every actor a GPU of its own (Ray sets its ``CUDA_VISIBLE_DEVICES``). Results come back
    in job order, so a search gives the same result as with the serial evaluator.
    """

    def __init__(self, factory: Callable[[], Any], workers: int, address: str | None = None,
                 cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0):
        try:
            import ray  # noqa: PLC0415 (optional: ray)
        except ImportError:
            raise ValueError("--backend ray needs Ray: pip install 'posbias[ray]'") from None
        if not ray.is_initialized():
            ray.init(address=address, log_to_driver=False, include_dashboard=False)
        self.ray = ray
        actor = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker)(_RayWorker)
        self.actors = [actor.remote(factory) for _ in range(workers)]

    def num_layers(self) -> int:
        return self.ray.get(self.actors[0].num_layers.remote())

    def evaluate(self, jobs) -> list[FitnessResult]:
        from ray.util import ActorPool  # noqa: PLC0415 (optional: ray)

        payload = [(f, t, p.to_dict() if p is not None else None) for f, t, p in jobs]
        pool = ActorPool(self.actors)
        return [FitnessResult.from_dict(d) for d in pool.map(lambda a, job: a.score.remote(job), payload)]

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
