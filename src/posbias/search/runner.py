"""Run an LPES search: GA loop with memoisation, pruning, checkpoints, resume, workers, outputs.

:func:`run_ga` is the generic loop (any fitness object with ``.score(factors, threshold=,
partial=)``); :func:`run_search` builds the real teacher-forced fitness for a model and task and
writes the run folder:

* ``config.json`` (settings + versions), ``checkpoint.json`` (GA state incl. rng state, the memo of
  every scored genome, replaced atomically after each generation), ``metrics.jsonl`` (one line per
  generation: best / mean fitness, forward passes, wall time, memo hits, pruned individuals),
  ``mean_accuracy`` counts a pruned individual at its lower bound (remaining instances wrong);
* ``best_factors.json`` (a factors file, see :mod:`posbias.patching.rope_scaling`), rewritten after
  every generation with ``"interim": true`` until the last generation is done (its ``complete``
  says whether the best genome was scored on every instance, not whether the search finished),
  ``factors.png`` and ``fitness.png``.

Everything that can be checked without the model (preset, GA settings, task and data file, the
run folder) is checked before it loads; ``config.json`` is written with the first checkpoint.

Resume: a killed search restarted with ``resume=True`` (the ``posbias search`` command passes it, so
re-running the command resumes) continues from the last completed generation with the saved rng
state and memo, and reaches exactly the result of an uninterrupted run.
"""
from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from posbias.search.fitness import DEFAULT_DEPTHS, OBJECTIVES, FitnessResult
from posbias.tasks.registry import supports_shared_context
from posbias.search.ga import GAConfig, GeneticAlgorithm, Genome, genome_factors, genome_points
from posbias.utils.io import append_jsonl, atomic_write_json, atomic_write_text, read_json, read_jsonl
from posbias.utils.run_folder import open_run

__all__ = ["PRESETS", "GAResult", "SearchResult", "run_ga", "run_search", "SerialEvaluator", "PoolEvaluator",
           "RayEvaluator",
           "plot_factors", "plot_fitness"]

# Sized for 2 CPU cores with SmolLM2-135M (~0.9 s per 380-token forward: kv, 30 keys).
# quick: <= 6 + 4 + 4 = 14 individuals x 24 instances (~5 min); standard: <= 8 + 4 x 6 = 32
# individuals x 36 instances (~25 min, less with memoisation and pruning);
# paper: the paper's 200 search instances and ~12 generations (a GPU).
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"population": 6, "elite": 2, "generations": 3, "n_per_depth": 8, "batch_size": 4},
    "standard": {"population": 8, "elite": 2, "generations": 5, "n_per_depth": 12, "batch_size": 4},
    "paper": {"population": 24, "elite": 4, "generations": 12, "n_per_depth": 67, "batch_size": 16},
}
CHECKPOINT = "checkpoint.json"
METRICS = "metrics.jsonl"
BEST = "best_factors.json"
# Settings that must match when a search folder is resumed (``generations`` may grow).
RESUME_KEYS = ("model", "task", "seed", "curve", "control_points", "task_options", "weights", "chat", "ga",
               "n_per_depth", "prune", "objective", "shared_context")


# -- evaluators ----------------------------------------------------------------------------------
class SerialEvaluator:
    """Score jobs one after the other with one fitness object (one model)."""

    def __init__(self, fitness):
        self.fitness = fitness

    def evaluate(self, jobs: list[tuple[list[float], float | None, FitnessResult | None]]) -> list[FitnessResult]:
        from tqdm.auto import tqdm

        # a progress bar over the generation's individuals (hidden when stderr is not a terminal)
        return [self.fitness.score(f, threshold=t, partial=p)
                for f, t, p in tqdm(jobs, desc="individuals", unit="ind", leave=False, disable=None)]

    def close(self) -> None:
        pass


_WORKER_FITNESS = None


def _worker_init(factory: Callable[[], Any], threads: int) -> None:
    global _WORKER_FITNESS
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass
    _WORKER_FITNESS = factory()


def _worker_score(job) -> dict:
    factors, threshold, partial = job
    p = FitnessResult.from_dict(partial) if partial is not None else None
    return _WORKER_FITNESS.score(factors, threshold=threshold, partial=p).to_dict()


def _worker_num_layers(_=None) -> int:
    return int(getattr(_WORKER_FITNESS, "num_layers", 0))


class PoolEvaluator:
    """Score individuals in parallel: ``workers`` spawned processes, each building its own fitness
    (its own model) once with the picklable ``factory``; torch threads split evenly."""

    def __init__(self, factory: Callable[[], Any], workers: int):
        import multiprocessing as mp

        threads = max(1, (os.cpu_count() or 1) // workers)
        self.pool = mp.get_context("spawn").Pool(workers, initializer=_worker_init, initargs=(factory, threads))

    def num_layers(self) -> int:
        return self.pool.apply(_worker_num_layers)

    def evaluate(self, jobs) -> list[FitnessResult]:
        payload = [(f, t, p.to_dict() if p is not None else None) for f, t, p in jobs]
        return [FitnessResult.from_dict(d) for d in self.pool.map(_worker_score, payload, chunksize=1)]

    def close(self) -> None:
        self.pool.close()
        self.pool.join()


# -- the GA loop ---------------------------------------------------------------------------------
@dataclass
class GAResult:
    best: Genome
    best_result: FitnessResult
    best_factors: list[float]
    best_points: list[list[float]]
    generations: int
    history: list[dict]
    memo: dict[Genome, FitnessResult] = field(repr=False, default_factory=dict)


def _threshold(pop: Sequence[Genome], memo: dict[Genome, FitnessResult], elite: int) -> float | None:
    """Objective value of the elite-th best fully scored member known before scoring (None: no pruning)."""
    done = sorted((memo[g].value for g in dict.fromkeys(pop) if g in memo and memo[g].complete), reverse=True)
    return done[elite - 1] if len(done) >= elite else None


def _save_checkpoint(path: Path, ga: GeneticAlgorithm, memo: dict, best: Genome | None, meta: dict) -> None:
    atomic_write_json(path, {
        "ga": ga.state_dict(),
        "memo": [[g.to_list(), r.to_dict()] for g, r in memo.items()],
        "best": best.to_list() if best is not None else None,
        "meta": meta,
    })


def run_ga(evaluator, cfg: GAConfig, *, num_layers: int, generations: int, seed: int = 0,
           out: str | Path | None = None, resume: bool = False,
           log: Callable[[dict], None] | None = None,
           on_generation: Callable[[GAResult], None] | None = None, prune: bool = True,
           before_write: Callable[[], Any] | None = None) -> GAResult:
    """Run (or resume) the GA for ``generations`` generations.

    Args:
        evaluator: ``.evaluate(jobs) -> list[FitnessResult]`` with jobs ``(factors, threshold, partial)``
            (:class:`SerialEvaluator` around a fitness object, or :class:`PoolEvaluator`).
        out: folder for ``checkpoint.json`` and ``metrics.jsonl`` (None: nothing written, no resume).
        resume: continue from ``out/checkpoint.json`` if it exists.
        log: called with each generation's metrics record.
        on_generation: called with the result so far after each generation (e.g. to write files).
        prune: pass the elite threshold to the fitness so hopeless individuals stop early
            (see :mod:`posbias.search.fitness` for when this is safe).
        before_write: called before the first checkpoint is written (e.g. to write the run config).
    """
    out = Path(out) if out is not None else None
    ckpt = out / CHECKPOINT if out is not None else None
    memo: dict[Genome, FitnessResult] = {}
    best: Genome | None = None
    if ckpt is not None and ckpt.exists() and not resume:
        raise ValueError(already_searched(out))
    if resume and ckpt is not None and ckpt.exists():
        import json

        state = read_json(ckpt)
        saved_cfg = state["ga"]["config"]
        if saved_cfg != cfg.to_dict():
            diff = [k for k in saved_cfg if saved_cfg[k] != cfg.to_dict().get(k)]
            raise ValueError(f"{ckpt} was written with other GA settings ({', '.join(diff)}); use another out")
        ga = GeneticAlgorithm.from_state(state["ga"], cfg)
        memo = {Genome.from_list(g): FitnessResult.from_dict(r) for g, r in state["memo"]}
        best = Genome.from_list(state["best"]) if state.get("best") else None
        # drop metrics of a generation that was logged but not checkpointed (killed in between)
        history = [m for m in read_jsonl(out / METRICS) if m.get("generation", 0) < ga.generation]
        atomic_write_text(out / METRICS, "".join(json.dumps(m) + "\n" for m in history))
    else:
        import numpy as np

        ga = GeneticAlgorithm(cfg, np.random.default_rng(seed))
        history = []
        if out is not None and (out / METRICS).exists():
            (out / METRICS).unlink()

    factors_of = functools.lru_cache(maxsize=None)(lambda g: [float(v) for v in genome_factors(g, cfg, num_layers)])
    result = None
    for gen in range(ga.generation, generations):
        t0 = time.perf_counter()
        pop = ga.ask()
        unique = list(dict.fromkeys(pop))
        thr = _threshold(unique, memo, cfg.elite) if prune else None
        todo = [g for g in unique if g not in memo
                or (memo[g].pruned and (thr is None or memo[g].upper_bound >= thr))]
        jobs = [(factors_of(g), thr, memo.get(g)) for g in todo]
        before = {g: (memo[g].forward_passes, memo[g].seconds, memo[g].n_scored) if g in memo else (0, 0.0, 0)
                  for g in todo}
        for g, r in zip(todo, evaluator.evaluate(jobs)):
            memo[g] = r
        fitness = {g: memo[g].key for g in unique}
        ranked = sorted(unique, key=lambda g: fitness[g], reverse=True)
        best = ranked[0]
        br = memo[best]
        accs = [memo[g].accuracy for g in unique]
        values = [memo[g].value for g in unique]
        record = {
            "generation": gen, "objective": br.objective,
            "best_value": br.value, "mean_value": sum(values) / len(values),
            "best_accuracy": br.accuracy, "best_mean_logprob": br.mean_logprob,
            "best_weighted_logprob": br.weighted_logprob,
            "mean_accuracy": sum(accs) / len(accs),
            "best_per_depth": br.per_depth_accuracy(),
            "best_factors": factors_of(best), "best_control_points": genome_points(best, cfg),
            "population": len(pop), "unique": len(unique), "scored": len(todo),
            "memo_hits": len(unique) - len(todo),
            "pruned": sum(1 for g in todo if memo[g].pruned), "threshold": thr,
            "forward_passes": sum(memo[g].forward_passes - before[g][0] for g in todo),
            "questions_scored": sum(memo[g].n_scored - before[g][2] for g in todo),
            "scoring_s": sum(memo[g].seconds - before[g][1] for g in todo),
            "wall_s": time.perf_counter() - t0,
            "individuals": [{"genome": g.to_list(), "value": memo[g].value, "accuracy": memo[g].accuracy,
                             "mean_logprob": memo[g].mean_logprob, "pruned": memo[g].pruned} for g in ranked],
        }
        ga.tell(fitness)
        history.append(record)
        result = GAResult(best, br, factors_of(best), genome_points(best, cfg), gen + 1, history, memo)
        if ckpt is not None:
            if before_write is not None:
                before_write()
            _save_checkpoint(ckpt, ga, memo, best, {"num_layers": num_layers, "seed": seed})
            append_jsonl(out / METRICS, record)
        if log is not None:
            log(record)
        if on_generation is not None:
            on_generation(result)
    if result is None:  # nothing left to run (resumed a finished search)
        if best is None:
            raise ValueError("no generation was run (generations must be >= 1)")
        result = GAResult(best, memo[best], factors_of(best), genome_points(best, cfg), ga.generation, history, memo)
    return result


def already_searched(out: Path) -> str:
    return (f"{out} already holds a search ({CHECKPOINT}): pass resume=True to continue it (re-running "
            "posbias search does), or use another out")


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
    running cluster started with ``ray start``; ``None`` starts a local one). Results come back
    in job order, so a search gives the same result as with the serial evaluator.
    """

    def __init__(self, factory: Callable[[], Any], workers: int, address: str | None = None,
                 cpus_per_worker: float = 1.0):
        try:
            import ray
        except ImportError:
            raise ValueError("--backend ray needs Ray: pip install 'posbias[ray]'") from None
        if not ray.is_initialized():
            ray.init(address=address, log_to_driver=False, include_dashboard=False)
        self.ray = ray
        actor = ray.remote(num_cpus=cpus_per_worker)(_RayWorker)
        self.actors = [actor.remote(factory) for _ in range(workers)]

    def num_layers(self) -> int:
        return self.ray.get(self.actors[0].num_layers.remote())

    def evaluate(self, jobs) -> list[FitnessResult]:
        from ray.util import ActorPool

        payload = [(f, t, p.to_dict() if p is not None else None) for f, t, p in jobs]
        pool = ActorPool(self.actors)
        return [FitnessResult.from_dict(d) for d in pool.map(lambda a, job: a.score.remote(job), payload)]

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)


# -- the real search -----------------------------------------------------------------------------
@dataclass
class SearchResult:
    out: Path
    factors_path: Path
    factors: list[float]
    control_points: list[list[float]]
    curve: str
    accuracy: float
    per_depth: dict[str, float]
    baseline_accuracy: float | None
    generations: int
    history: list[dict]


def build_fitness(model_spec: str, task: str, *, n_per_depth: int, seed: int, task_options: dict,
                  depths: Sequence[float] = DEFAULT_DEPTHS, weights=None, batch_size: int = 4,
                  chat: bool = False, model=None, tokenizer=None, objective: str = "accuracy",
                  shared_context: bool = False):
    """The teacher-forced fitness of ``model_spec`` on the *search* split of ``task`` (with
    ``shared_context``: each search context asked at every depth, scored from one prefill)."""
    from posbias.evaluation.runner import check_fits
    from posbias.evaluation.session import build_instances
    from posbias.models import get_decoder_layers, load_model
    from posbias.search.fitness import TeacherForcedFitness

    if model is None:
        model, tokenizer = load_model(model_spec)
    opts = {**task_options, "shared_context": True} if shared_context else task_options
    instances = build_instances(model, tokenizer, task, list(depths), n_per_depth, seed, "search", opts)
    check_fits(model, tokenizer, instances, chat)
    fit = TeacherForcedFitness(model, tokenizer, instances, weights=weights, batch_size=batch_size, chat=chat,
                               objective=objective, shared=shared_context)
    fit.num_layers = len(get_decoder_layers(model))
    return fit


def run_search(model: str = "smollm2-135m", task: str = "kv", *, out: str | Path, preset: str = "quick",
               resume: bool = False, seed: int = 0, workers: int = 1, curve: str = "bezier",
               control_points: int = 4, task_options: dict | None = None, weights=None,
               chat: bool = False, grid: Sequence[float] | None = None, round_to_grid: bool = False,
               overrides: dict | None = None, log: Callable[[dict], None] | None = None,
               loaded: tuple | None = None, prune: bool = True, backend: str = "processes",
               ray_address: str | None = None, objective: str = "accuracy",
               shared_context: bool = True) -> SearchResult:
    """Search per-layer factors for ``model`` on ``task`` and write the run folder ``out``.

    Args:
        preset: ``quick`` | ``standard`` | ``paper`` (see :data:`PRESETS`); ``overrides`` replaces any
            of its keys (population, elite, generations, n_per_depth, batch_size) and GA settings
            (tournament, crossover_rate, mutation_rate, max_y_step, max_x_step, x_resolution, ...).
        workers: > 1 scores individuals in that many spawned processes, one model each.
        backend: ``processes`` (this machine) or ``ray`` (Ray actors, across nodes; ``ray_address``
            is passed to ``ray.init``, e.g. ``"auto"``).
        loaded: an already loaded ``(model, tokenizer)`` to use (workers must be 1).
        prune: stop scoring individuals that cannot reach the elite (see :mod:`posbias.search.fitness`).
        objective: ``accuracy`` or ``logprob`` (see :mod:`posbias.search.fitness`).
        shared_context: score the search split as shared contexts, one prefill per context asked at
            every depth (tasks that offer it: ``kv``, multi-key ``niah``; ignored for the others and
            under ``chat``). The
            held-out table always uses the standard protocol (one question per prompt).
    Returns:
        :class:`SearchResult`; the factors file is ``out/best_factors.json``.
    """
    from posbias.search.curves import DEFAULT_GRID
    from posbias.search.fitness import _dkey, _normalise_weights
    from posbias.tasks import precheck_instances
    from posbias.tasks.base import check_int

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    check_int("workers", workers)
    if backend not in ("processes", "ray"):
        raise ValueError(f"unknown backend {backend!r}; choose processes or ray")
    if loaded is not None and (workers > 1 or backend == "ray"):
        raise ValueError("loaded=(model, tokenizer) cannot be shared with workers")
    settings = {**PRESETS[preset], **(overrides or {})}
    run_keys = ("generations", "n_per_depth", "batch_size")
    for key in run_keys:
        check_int(key, settings[key])
    ga_kwargs = {k: v for k, v in settings.items() if k not in run_keys}
    cfg = GAConfig(n_control=control_points, curve=curve, grid=tuple(grid or DEFAULT_GRID),
                   round_to_grid=round_to_grid, **ga_kwargs)
    task_options = dict(task_options or {})
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    shared_context = bool(shared_context) and not chat and supports_shared_context(task, task_options)
    _normalise_weights([_dkey(d) for d in DEFAULT_DEPTHS], weights)
    precheck_instances(task, n=settings["n_per_depth"], depths=list(DEFAULT_DEPTHS), seed=seed, split="search",
                       **task_options)
    config = {"model": model, "task": task, "preset": preset, "seed": seed, "curve": curve,
              "control_points": control_points, "task_options": task_options, "weights": weights,
              "chat": chat, "ga": cfg.to_dict(), **{k: settings[k] for k in run_keys}, "workers": workers,
              "prune": prune, "objective": objective, "shared_context": shared_context}
    folder = open_run(out, "search", config, check_keys=RESUME_KEYS)
    out = folder.path
    if not resume and (out / CHECKPOINT).exists():
        raise ValueError(already_searched(out))
    factory = functools.partial(build_fitness, model, task, n_per_depth=settings["n_per_depth"], seed=seed,
                                task_options=task_options, weights=weights, batch_size=settings["batch_size"],
                                chat=chat, objective=objective, shared_context=shared_context)
    if workers > 1 or backend == "ray":
        evaluator = RayEvaluator(factory, workers, ray_address) if backend == "ray" else PoolEvaluator(factory, workers)
        num_layers = evaluator.num_layers()
    else:
        if loaded is not None:
            fit = factory(model=loaded[0], tokenizer=loaded[1])
        else:
            fit = factory()
        evaluator = SerialEvaluator(fit)
        num_layers = fit.num_layers

    def write_outputs(res: GAResult) -> None:
        """The factors file; ``interim`` until the search's last generation is done."""
        from posbias.patching.rope_scaling import save_factors_file

        save_factors_file(
            out / BEST, factors=res.best_factors,
            curve={"type": curve, "control_points": res.best_points,
                   **({"round_to_grid": list(cfg.grid)} if round_to_grid else {})},
            model=model, task=task, score=res.best_result.accuracy,
            mean_logprob=res.best_result.mean_logprob, per_depth=res.best_result.per_depth_accuracy(),
            complete=res.best_result.complete, generations=res.generations, seed=seed, preset=preset,
            task_options=task_options, search_split="search", n_per_depth=settings["n_per_depth"],
            interim=res.generations < settings["generations"], generations_planned=settings["generations"],
        )

    try:
        res = run_ga(evaluator, cfg, num_layers=num_layers, generations=settings["generations"], seed=seed,
                     out=out, resume=resume, log=log, on_generation=write_outputs, prune=prune,
                     before_write=folder.commit)
    finally:
        evaluator.close()
        if isinstance(evaluator, SerialEvaluator) and hasattr(evaluator.fitness, "close"):
            evaluator.fitness.close()
    folder.commit()
    write_outputs(res)
    try:
        plot_factors(out / "factors.png", res.best_factors, res.best_points, title=f"LPES factors ({model}, {task})")
        plot_fitness(out / "fitness.png", res.history)
    except Exception as e:  # plots are a convenience, never lose a finished search over them
        print(f"warning: plotting failed: {e}")
    from posbias.search.ga import identity_genome

    ident = res.memo.get(identity_genome(cfg))
    return SearchResult(out=out, factors_path=out / BEST, factors=res.best_factors, control_points=res.best_points,
                        curve=curve, accuracy=res.best_result.accuracy,
                        per_depth=res.best_result.per_depth_accuracy(),
                        baseline_accuracy=ident.accuracy if ident is not None and ident.complete else None,
                        generations=res.generations, history=res.history)


# -- plots ---------------------------------------------------------------------------------------
def plot_factors(path: str | Path, factors: Sequence[float], points: Sequence[Sequence[float]] | None = None,
                 title: str = "LPES factors") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(factors)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(n), factors, "o-", ms=3, label="factor per layer")
    if points:
        ax.plot([p[0] * (n - 1) for p in points], [p[1] for p in points], "s--", color="tab:red", alpha=0.6,
                label="control points")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("decoder layer")
    ax.set_ylabel("RoPE interpolation factor s_l")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_fitness(path: str | Path, history: Sequence[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gens = [h["generation"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(gens, [h["best_accuracy"] for h in history], "o-", label="best")
    ax.plot(gens, [h["mean_accuracy"] for h in history], "o--", label="population mean")
    ax.set_xlabel("generation")
    ax.set_ylabel("fitness (weighted accuracy)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
