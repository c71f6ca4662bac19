"""Run an LPES search on a model and task: :func:`run_search` checks the request, builds the
teacher-forced fitness, runs the GA loop (:mod:`posbias.search.loop`) with an evaluator
(:mod:`posbias.search.evaluators`) and writes the run folder:

* ``config.json`` (settings + versions), ``checkpoint.json`` and ``metrics.jsonl`` (see
  :mod:`posbias.search.loop`);
* ``best_factors.json`` (a factors file, see :mod:`posbias.patching.rope_scaling`), rewritten after
  every generation with ``"interim": true`` until the last generation is done (its ``complete``
  says whether the best genome was scored on every instance, not whether the search finished),
  ``factors.png`` (``temperatures.png`` for a temperature search) and ``fitness.png``. A joint search
  (``target="rope+temperature"``) writes its temperatures into the same file (``temperatures``,
  ``temperature_curve``; ``lpes`` applies both) and draws both plots.

Everything that can be checked without the model (preset, GA settings, task and data file, the
run folder) is checked before it loads; ``config.json`` is written with the first checkpoint.

Settings: :class:`posbias.search.config.SearchConfig`. Resume: a killed search restarted with ``resume=True`` (the
``posbias search`` command passes it, so
re-running the command resumes) continues from the last completed generation with the saved rng
state and memo, and reaches exactly the result of an uninterrupted run.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from posbias.evaluation.runner import check_fits
from posbias.evaluation.session import build_instances
from posbias.methods.temperature import JOINT_TARGET, TEMPERATURE_GRID
from posbias.models import load_model, model_identity
from posbias.models.adapter import refuse_adapter
from posbias.models.options import LoadOptions, load_settings, options_for
from posbias.patching.curves import DEFAULT_GRID
from posbias.patching.rope_scaling import save_factors_file
from posbias.search.config import SearchConfig, resolved_search_settings
from posbias.search.evaluators import PoolEvaluator, RayEvaluator, SerialEvaluator
from posbias.search.fitness import (
    DEFAULT_DEPTHS,
    OBJECTIVES,
    SEARCH_TARGETS,
    TeacherForcedFitness,
    depth_key,
    normalise_weights,
)
from posbias.search.ga import GAConfig, identity_genome
from posbias.search.loop import CHECKPOINT, METRICS, GAResult, already_searched, run_ga  # noqa: F401
from posbias.search.plots import plot_factors, plot_fitness
from posbias.tasks import precheck_instances
from posbias.tasks.base import check_int
from posbias.tasks.registry import supports_shared_context
from posbias.utils.devices import SHARD
from posbias.utils.run_folder import open_run
from posbias.utils.workers import gpu_slots

__all__ = ["PRESETS", "GAResult", "SearchConfig", "SearchResult", "run_ga", "run_search", "SerialEvaluator",
           "PoolEvaluator",
           "RayEvaluator",
           "plot_factors", "plot_fitness"]

# quick / standard: measured on a 2-core x86 CPU with SmolLM2-135M (~0.9 s per 380-token forward: kv, 30 keys).
# quick: <= 6 + 4 + 4 = 14 individuals x 24 instances (~5 min); standard: <= 8 + 4 x 6 = 32
# individuals x 36 instances (~25 min, less with memoisation and pruning);
# paper: the paper's 200 search instances and ~12 generations (a GPU).
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"population": 6, "elite": 2, "generations": 3, "n_per_depth": 8, "batch_size": 4},
    "standard": {"population": 8, "elite": 2, "generations": 5, "n_per_depth": 12, "batch_size": 4},
    "paper": {"population": 24, "elite": 4, "generations": 12, "n_per_depth": 67, "batch_size": 16},
    # the LPES authors' GA (posbias.search.truncation_ga; dim_mono.json of zhenghuawang6/middle_rope): 16
    # parents, 16 mutants and 16 crossed children a generation, 20 generations, y from 1.5 by +-0.2;
    # with the search settings of PRESET_SEARCH["authors"] (greedy MDQA accuracy, gold last). A GPU run.
    "authors": {"population": 32, "elite": 16, "generations": 20, "n_per_depth": 100, "batch_size": 8,
                "breeding": "truncation", "mutations": 16, "crossovers": 16, "mutation_rate": 0.3,
                "crossover_rate": 0.3, "max_y_step": 4, "start_y": 1.5, "crossover_tries": 20},
}
BEST = "best_factors.json"
# Settings that must match when a search folder is resumed (``generations`` may grow).
RESUME_KEYS = ("model", "model_path", "task", "seed", "curve", "control_points", "task_options", "weights", "chat",
               "ga", "n_per_depth", "prune", "objective", "shared_context", "dtype", "target", "depths")


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
    objective: str = "accuracy"  # what chose the winner (FitnessResult.key: accuracy, or weighted log-prob)
    temperatures: list[float] | None = None  # a joint search's per-layer temperatures (factors: its RoPE half)

    @property
    def below_unpatched(self) -> bool:
        """The winner answers fewer search-split questions than the unpatched model (a log-prob winner can)."""
        return self.baseline_accuracy is not None and self.accuracy < self.baseline_accuracy


def build_fitness(cfg: SearchConfig, *, n_per_depth: int, batch_size: int = 4,
                  depths: Sequence[float] = DEFAULT_DEPTHS, model=None, tokenizer=None, load=None):
    """The teacher-forced fitness of ``cfg.model`` (loaded with ``load``, a :class:`LoadOptions`) on the
    *search* split of ``cfg.task`` (with ``cfg.shared_context``: each search context asked at every
    depth, scored from one prefill), scoring ``cfg.target`` values."""
    if model is None:
        model, tokenizer = load_model(cfg.model, load)
    opts = {**cfg.task_options, "shared_context": True} if cfg.shared_context else cfg.task_options
    instances = build_instances(model, tokenizer, cfg.task, list(depths), n_per_depth, cfg.seed, "search", opts)
    check_fits(model, tokenizer, instances, cfg.chat)
    fit = TeacherForcedFitness(model, tokenizer, instances, weights=cfg.weights, batch_size=batch_size,
                               chat=cfg.chat, objective=cfg.objective, shared=cfg.shared_context, target=cfg.target)
    return fit


def run_search(cfg: SearchConfig, *, resume: bool = False, log: Callable[[dict], None] | None = None,
               loaded: tuple | None = None, load: LoadOptions | None = None) -> SearchResult:
    """Search per-layer factors (``cfg.target``: RoPE factors for LPES, or attention temperatures) for
    ``cfg.model`` on ``cfg.task`` and write the run folder ``cfg.out``.

    Args:
        cfg: the search's settings (:class:`posbias.search.config.SearchConfig`; ``workers > 1`` scores
            individuals in that many spawned processes, one model each, ``backend="ray"`` in Ray actors).
        resume: continue a search the folder already holds (``posbias search`` passes it).
        log: called with each generation's metrics record.
        loaded: an already loaded ``(model, tokenizer)`` to use (workers must be 1).
        load: device, dtype and Hub revision of the model (:class:`LoadOptions`; default the CPU in
            float32); every worker loads its model with them (on a CUDA machine, its own GPU).
    Returns:
        :class:`SearchResult`; the factors file is ``out/best_factors.json``.
    """
    settings, ga, cfg = _check_request(cfg, loaded)
    load = options_for(load, loaded)
    # the settings (re-usable as --config) and what they resolve to (DERIVED_KEYS: compared on resume)
    config = {**dataclasses.asdict(cfg), "model_path": model_identity(cfg.model), "ga": ga.to_dict(),
              **{k: settings[k] for k in RUN_KEYS}, **load_settings(cfg.model, load)}
    folder = open_run(cfg.out, "search", config, check_keys=RESUME_KEYS)
    out = folder.path
    if not resume and (out / CHECKPOINT).exists():
        raise ValueError(already_searched(out))
    factory = functools.partial(build_fitness, cfg, n_per_depth=settings["n_per_depth"],
                                batch_size=settings["batch_size"], depths=cfg.depths, load=load)
    evaluator, num_layers = _make_evaluator(factory, cfg.workers, cfg.backend, cfg.ray_address, loaded, load)
    meta = {"model": cfg.model, "task": cfg.task, "seed": cfg.seed, "preset": cfg.preset,
            "task_options": cfg.task_options, "n_per_depth": settings["n_per_depth"],
            "generations_planned": settings["generations"], "curve": cfg.curve,
            "round_to_grid": [list(g) for g in (ga.grid, *ga.extra_grids)] if cfg.round_to_grid else None,
            "target": cfg.target, "identity": identity_genome(ga)}
    write_outputs = functools.partial(_write_factors, out / BEST, meta=meta)
    try:
        res = run_ga(evaluator, ga, num_layers=num_layers, generations=settings["generations"], seed=cfg.seed,
                     out=out, resume=resume, log=log, on_generation=write_outputs, prune=cfg.prune,
                     before_write=folder.commit)
    finally:
        evaluator.close()
        if isinstance(evaluator, SerialEvaluator) and hasattr(evaluator.fitness, "close"):
            evaluator.fitness.close()
    folder.commit()
    write_outputs(res)
    _plot_search(out, res, cfg)
    return _search_result(out, res, ga, cfg)


def curves_of(res: GAResult, target: str) -> list[tuple[str, list[float], list]]:
    """``(name, per-layer values, control points)`` of each curve of the best genome: ``factors`` (LPES)
    or ``temperatures``, or both for a joint search."""
    if target != JOINT_TARGET:
        return [("factors" if target == "rope" else "temperatures", res.best_factors, res.best_points)]
    n = len(res.best_factors) // 2
    return [("factors", res.best_factors[:n], res.best_points[0]),
            ("temperatures", res.best_factors[n:], res.best_points[1])]


def _plot_search(out: Path, res, cfg: SearchConfig) -> None:
    """factors.png (temperatures.png) and fitness.png; plots are a convenience, never lose a finished
    search over them."""
    labels = {"temperatures": {"ylabel": "attention temperature t_l", "per_layer": "temperature per layer"}}
    what = {"factors": "LPES factors", "temperatures": "attention temperatures"}
    try:
        for name, values, points in curves_of(res, cfg.target):
            plot_factors(out / f"{name}.png", values, points, title=f"{what[name]} ({cfg.model}, {cfg.task})",
                         **labels.get(name, {}))
        plot_fitness(out / "fitness.png", res.history)
    except Exception as e:
        print(f"warning: plotting failed: {e}")


def _search_result(out: Path, res, ga: GAConfig, cfg: SearchConfig) -> SearchResult:
    ident = res.memo.get(identity_genome(ga))
    curves = curves_of(res, cfg.target)
    _, values, points = curves[0]
    return SearchResult(out=out, factors_path=out / BEST, factors=values, control_points=points,
                        curve=cfg.curve, accuracy=res.best_result.accuracy,
                        per_depth=res.best_result.per_depth_accuracy(),
                        baseline_accuracy=ident.accuracy if ident is not None and ident.complete else None,
                        generations=res.generations, history=res.history, objective=res.best_result.objective,
                        temperatures=curves[1][1] if len(curves) > 1 else None)


RUN_KEYS = ("generations", "n_per_depth", "batch_size")  # preset keys that are not GA settings


def check_search_model(cfg: SearchConfig) -> None:
    """Refuse a folder written by ``posbias apply`` as the model: the search's own values would replace its method."""
    refuse_adapter(cfg.model, "search", "per-layer RoPE factors" if cfg.target == "rope" else "per-layer temperatures")


def _check_request(cfg: SearchConfig, loaded) -> tuple[dict, GAConfig, SearchConfig]:
    """Everything checkable before the model loads: ``(settings of the preset with its overrides,
    GAConfig, cfg with its task options and shared_context as the search uses them)``."""
    check_search_model(cfg)
    if cfg.preset not in PRESETS:
        raise ValueError(f"unknown preset {cfg.preset!r}; choose one of {', '.join(PRESETS)}")
    check_int("workers", cfg.workers)
    if cfg.backend not in ("processes", "ray"):
        raise ValueError(f"unknown backend {cfg.backend!r}; choose processes or ray")
    if loaded is not None and (cfg.workers > 1 or cfg.backend == "ray"):
        raise ValueError("loaded=(model, tokenizer) cannot be shared with workers")
    if cfg.target not in SEARCH_TARGETS:
        raise ValueError(f"unknown search target {cfg.target!r}; choose one of {', '.join(SEARCH_TARGETS)}")
    settings = {**PRESETS[cfg.preset], **(cfg.overrides or {})}
    for key in RUN_KEYS:
        check_int(key, settings[key])
    cfg = dataclasses.replace(cfg, **resolved_search_settings(cfg))
    default = TEMPERATURE_GRID if cfg.target == "temperature" else DEFAULT_GRID
    ga = GAConfig(n_control=cfg.control_points, curve=cfg.curve, grid=tuple(cfg.grid or default),
                  extra_grids=(TEMPERATURE_GRID,) if cfg.target == JOINT_TARGET else (),
                  round_to_grid=cfg.round_to_grid, **{k: v for k, v in settings.items() if k not in RUN_KEYS})
    task_options = dict(cfg.task_options or {})
    if cfg.objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {cfg.objective!r}; choose one of {', '.join(OBJECTIVES)}")
    shared_context = bool(cfg.shared_context) and not cfg.chat and supports_shared_context(cfg.task, task_options)
    depths = sorted({float(d) for d in cfg.depths})
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise ValueError(f"search depths must be numbers from 0 to 1, got {cfg.depths}")
    normalise_weights([depth_key(d) for d in depths], cfg.weights)
    precheck_instances(cfg.task, n=settings["n_per_depth"], depths=depths, seed=cfg.seed,
                       split="search", **task_options)
    return settings, ga, dataclasses.replace(cfg, task_options=task_options, shared_context=shared_context,
                                             depths=depths)


def _make_evaluator(factory, workers: int, backend: str, ray_address, loaded, load=None):
    """``(evaluator, num_layers)``: Ray actors or a process pool for ``workers > 1`` / Ray, else one
    fitness in this process (on an already ``loaded`` model when given). A model placed on ``auto``
    or ``cuda`` of a CUDA machine gives each worker a GPU of its own (one per visible GPU, in turn)."""
    if workers > 1 or backend == "ray":
        gpus = worker_gpus(load, workers)
        if backend == "ray":
            per_worker = float(len(gpus[0].split(","))) if gpus else 0.0
            evaluator = RayEvaluator(factory, workers, ray_address, gpus_per_worker=per_worker)
        else:
            evaluator = PoolEvaluator(factory, workers, gpus=gpus)
        return evaluator, evaluator.num_layers()
    fit = factory(model=loaded[0], tokenizer=loaded[1]) if loaded is not None else factory()
    return SerialEvaluator(fit), fit.num_layers


def worker_gpus(load: LoadOptions | None, workers: int) -> list[str] | None:
    """One ``CUDA_VISIBLE_DEVICES`` value per worker when the model goes to ``auto`` / ``cuda`` on a
    CUDA machine (each worker then loads it on its own ``cuda:0``), or to ``shard`` (each worker splits
    its model over its own run of GPUs); None otherwise (an explicit ``cuda:N`` keeps every worker on
    that GPU)."""
    device = str((load or LoadOptions()).device).strip().lower()
    if device == SHARD:
        return gpu_slots(workers, shard=True)
    return gpu_slots(workers) if device in ("auto", "cuda") else None


def _write_factors(path: Path, res: GAResult, *, meta: dict) -> None:
    """The factors file of the best genome so far; ``interim`` until the last generation is done."""
    best = res.best_result
    grids = meta["round_to_grid"] or [None, None]

    def curve(points, grid):
        return {"type": meta["curve"], "control_points": points, **({"round_to_grid": grid} if grid else {})}

    (_, factors, points), *more = curves_of(res, meta["target"])
    joint = {"temperatures": more[0][1], "temperature_curve": curve(more[0][2], grids[1])} if more else {}
    ident = res.memo.get(meta["identity"])
    unpatched = ident.accuracy if ident is not None and ident.complete else None
    against = {} if unpatched is None else {"unpatched_accuracy": unpatched,
                                             "below_unpatched": bool(best.accuracy < unpatched)}
    save_factors_file(
        path, factors=factors, curve=curve(points, grids[0]),
        model=meta["model"], task=meta["task"], score=best.accuracy, objective=best.objective, value=best.value,
        mean_logprob=best.mean_logprob, per_depth=best.per_depth_accuracy(), complete=best.complete,
        generations=res.generations, seed=meta["seed"], preset=meta["preset"], task_options=meta["task_options"],
        search_split="search", n_per_depth=meta["n_per_depth"],
        interim=res.generations < meta["generations_planned"], generations_planned=meta["generations_planned"],
        **({"target": meta["target"]} if meta["target"] != "rope" else {}), **joint, **against,
    )
