"""Run an LPES search on a model and task: :func:`run_search` checks the request, builds the
teacher-forced fitness, runs the GA loop (:mod:`posbias.search.loop`) with an evaluator
(:mod:`posbias.search.evaluators`) and writes the run folder:

* ``config.json`` (settings + versions), ``checkpoint.json`` and ``metrics.jsonl`` (see
  :mod:`posbias.search.loop`);
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from posbias.search.evaluators import PoolEvaluator, RayEvaluator, SerialEvaluator
from posbias.search.fitness import DEFAULT_DEPTHS, DEFAULT_OBJECTIVE, OBJECTIVES
from posbias.search.ga import GAConfig
from posbias.search.loop import CHECKPOINT, METRICS, GAResult, already_searched, run_ga  # noqa: F401
from posbias.search.plots import plot_factors, plot_fitness
from posbias.tasks.registry import supports_shared_context
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
BEST = "best_factors.json"
# Settings that must match when a search folder is resumed (``generations`` may grow).
RESUME_KEYS = ("model", "task", "seed", "curve", "control_points", "task_options", "weights", "chat", "ga",
               "n_per_depth", "prune", "objective", "shared_context", "target")


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
                  shared_context: bool = False, target: str = "rope"):
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
                               objective=objective, shared=shared_context, target=target)
    fit.num_layers = len(get_decoder_layers(model))
    return fit


def run_search(model: str = "smollm2-135m", task: str = "kv", *, out: str | Path, preset: str = "quick",
               resume: bool = False, seed: int = 0, workers: int = 1, curve: str = "bezier",
               control_points: int = 4, task_options: dict | None = None, weights=None,
               chat: bool = False, grid: Sequence[float] | None = None, round_to_grid: bool = False,
               overrides: dict | None = None, log: Callable[[dict], None] | None = None,
               loaded: tuple | None = None, prune: bool = True, backend: str = "processes",
               ray_address: str | None = None, objective: str = DEFAULT_OBJECTIVE,
               shared_context: bool = True, target: str = "rope") -> SearchResult:
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
        target: ``rope`` (LPES: per-layer RoPE factors) or ``temperature`` (per-layer attention
            temperatures, :mod:`posbias.methods.temperature`; default grid
            :data:`~posbias.methods.temperature.TEMPERATURE_GRID`); the values file records it.
    Returns:
        :class:`SearchResult`; the factors file is ``out/best_factors.json``.
    """
    settings, cfg, task_options, shared_context = _check_request(
        task, preset=preset, workers=workers, backend=backend, loaded=loaded, overrides=overrides,
        control_points=control_points, curve=curve, grid=grid, round_to_grid=round_to_grid,
        task_options=task_options, objective=objective, shared_context=shared_context, chat=chat,
        weights=weights, seed=seed, target=target)
    config = {"model": model, "task": task, "preset": preset, "seed": seed, "curve": curve,
              "control_points": control_points, "task_options": task_options, "weights": weights,
              "chat": chat, "ga": cfg.to_dict(), **{k: settings[k] for k in RUN_KEYS}, "workers": workers,
              "prune": prune, "objective": objective, "shared_context": shared_context, "target": target}
    folder = open_run(out, "search", config, check_keys=RESUME_KEYS)
    out = folder.path
    if not resume and (out / CHECKPOINT).exists():
        raise ValueError(already_searched(out))
    factory = functools.partial(build_fitness, model, task, n_per_depth=settings["n_per_depth"], seed=seed,
                                task_options=task_options, weights=weights, batch_size=settings["batch_size"],
                                chat=chat, objective=objective, shared_context=shared_context, target=target)
    evaluator, num_layers = _make_evaluator(factory, workers, backend, ray_address, loaded)
    meta = {"model": model, "task": task, "seed": seed, "preset": preset, "task_options": task_options,
            "n_per_depth": settings["n_per_depth"], "generations_planned": settings["generations"],
            "curve": curve, "round_to_grid": list(cfg.grid) if round_to_grid else None, "target": target}
    write_outputs = functools.partial(_write_factors, out / BEST, meta=meta)
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
    what = "LPES factors" if target == "rope" else "attention temperatures"
    _plot_search(out, res, title=f"{what} ({model}, {task})")
    return _search_result(out, res, cfg, curve)


def _plot_search(out: Path, res, title: str) -> None:
    """factors.png and fitness.png; plots are a convenience, never lose a finished search over them."""
    try:
        plot_factors(out / "factors.png", res.best_factors, res.best_points, title=title)
        plot_fitness(out / "fitness.png", res.history)
    except Exception as e:
        print(f"warning: plotting failed: {e}")


def _search_result(out: Path, res, cfg, curve: str) -> SearchResult:
    from posbias.search.ga import identity_genome

    ident = res.memo.get(identity_genome(cfg))
    return SearchResult(out=out, factors_path=out / BEST, factors=res.best_factors, control_points=res.best_points,
                        curve=curve, accuracy=res.best_result.accuracy,
                        per_depth=res.best_result.per_depth_accuracy(),
                        baseline_accuracy=ident.accuracy if ident is not None and ident.complete else None,
                        generations=res.generations, history=res.history)


RUN_KEYS = ("generations", "n_per_depth", "batch_size")  # preset keys that are not GA settings


def _check_request(task: str, *, preset, workers, backend, loaded, overrides, control_points, curve, grid,
                   round_to_grid, task_options, objective, shared_context, chat, weights, seed, target="rope"):
    """Everything checkable before the model loads; ``(settings, GAConfig, task_options, shared_context)``."""
    from posbias.methods.temperature import TEMPERATURE_GRID
    from posbias.patching.curves import DEFAULT_GRID
    from posbias.search.fitness import SEARCH_TARGETS, _dkey, _normalise_weights
    from posbias.tasks import precheck_instances
    from posbias.tasks.base import check_int

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    check_int("workers", workers)
    if backend not in ("processes", "ray"):
        raise ValueError(f"unknown backend {backend!r}; choose processes or ray")
    if loaded is not None and (workers > 1 or backend == "ray"):
        raise ValueError("loaded=(model, tokenizer) cannot be shared with workers")
    if target not in SEARCH_TARGETS:
        raise ValueError(f"unknown search target {target!r}; choose one of {', '.join(SEARCH_TARGETS)}")
    settings = {**PRESETS[preset], **(overrides or {})}
    for key in RUN_KEYS:
        check_int(key, settings[key])
    default = TEMPERATURE_GRID if target == "temperature" else DEFAULT_GRID
    cfg = GAConfig(n_control=control_points, curve=curve, grid=tuple(grid or default),
                   round_to_grid=round_to_grid, **{k: v for k, v in settings.items() if k not in RUN_KEYS})
    task_options = dict(task_options or {})
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    shared_context = bool(shared_context) and not chat and supports_shared_context(task, task_options)
    _normalise_weights([_dkey(d) for d in DEFAULT_DEPTHS], weights)
    precheck_instances(task, n=settings["n_per_depth"], depths=list(DEFAULT_DEPTHS), seed=seed, split="search",
                       **task_options)
    return settings, cfg, task_options, shared_context


def _make_evaluator(factory, workers: int, backend: str, ray_address, loaded):
    """``(evaluator, num_layers)``: Ray actors or a process pool for ``workers > 1`` / Ray, else one
    fitness in this process (on an already ``loaded`` model when given)."""
    if workers > 1 or backend == "ray":
        evaluator = RayEvaluator(factory, workers, ray_address) if backend == "ray" else PoolEvaluator(factory, workers)
        return evaluator, evaluator.num_layers()
    fit = factory(model=loaded[0], tokenizer=loaded[1]) if loaded is not None else factory()
    return SerialEvaluator(fit), fit.num_layers


def _write_factors(path: Path, res: GAResult, *, meta: dict) -> None:
    """The factors file of the best genome so far; ``interim`` until the last generation is done."""
    from posbias.patching.rope_scaling import save_factors_file

    best = res.best_result
    save_factors_file(
        path, factors=res.best_factors,
        curve={"type": meta["curve"], "control_points": res.best_points,
               **({"round_to_grid": meta["round_to_grid"]} if meta["round_to_grid"] else {})},
        model=meta["model"], task=meta["task"], score=best.accuracy, objective=best.objective, value=best.value,
        mean_logprob=best.mean_logprob, per_depth=best.per_depth_accuracy(), complete=best.complete,
        generations=res.generations, seed=meta["seed"], preset=meta["preset"], task_options=meta["task_options"],
        search_split="search", n_per_depth=meta["n_per_depth"],
        interim=res.generations < meta["generations_planned"], generations_planned=meta["generations_planned"],
        **({"target": meta["target"]} if meta["target"] != "rope" else {}),
    )
