"""Settings of one LPES search (:class:`SearchConfig`): what ``posbias search`` builds from its flags or
from ``--config``, what :func:`posbias.search.runner.run_search` takes, and what the run folder's
``config.json`` records beside the resolved GA settings (so that file can be fed back)."""
from __future__ import annotations

from dataclasses import dataclass, field

from posbias.search.fitness import DEFAULT_DEPTHS, DEFAULT_OBJECTIVE


@dataclass
class SearchConfig:
    """One search.

    Attributes:
        out: the run folder (re-running resumes).
        model / task / task_options: what is searched (a model spec, a task name and its options).
        preset: ``quick`` | ``standard`` | ``paper`` (:data:`posbias.search.runner.PRESETS`); ``overrides``
            replaces any of its keys (population, elite, generations, n_per_depth, batch_size) and GA
            settings (tournament, crossover_rate, mutation_rate, max_y_step, ...).
        workers / backend / ray_address: parallel scoring (processes on this machine, or Ray actors).
        curve / control_points / grid / round_to_grid: the layer -> factor curve and its factor grid.
        depths: the depths of the search split's gold item (None: 0, 0.5, 1).
        weights: fitness weights of those depths (None: equal).
        objective: ``logprob``, ``accuracy`` or ``greedy`` (:mod:`posbias.search.fitness`); ``prune``: stop scoring
            individuals that cannot reach the elite; ``shared_context``: one prefill per search context.
        chat: wrap prompts in the tokenizer's chat template.
        heldout_n: held-out instances per depth of ``posbias search``'s before / after table (0: none).
        target: ``rope`` (LPES: per-layer RoPE factors) or ``temperature`` (per-layer attention
            temperatures, :mod:`posbias.methods.temperature`); the values file records it.

    ``curve``, ``grid``, ``depths`` and ``objective`` left None take the preset's value
    (:data:`PRESET_SEARCH`, e.g. the ``authors`` preset's), else :data:`SEARCH_DEFAULTS`; the run folder
    records the values used.
    """

    out: str | None = None
    model: str = "smollm2-135m"
    task: str = "kv"
    task_options: dict = field(default_factory=dict)
    preset: str = "quick"
    overrides: dict = field(default_factory=dict)
    seed: int = 0
    workers: int = 1
    backend: str = "processes"
    ray_address: str | None = None
    curve: str | None = None
    control_points: int = 4
    grid: list[float] | None = None
    round_to_grid: bool = False
    depths: list[float] | None = None
    weights: list[float] | None = None
    objective: str | None = None
    prune: bool = True
    shared_context: bool = True
    chat: bool = False
    heldout_n: int = 20
    target: str = "rope"


# what a search folder's config.json records beside the SearchConfig fields (resolved from them)
DERIVED_KEYS = ("ga", "generations", "n_per_depth", "batch_size")


# the search settings a preset may set (a value given in SearchConfig wins), and their values otherwise
SEARCH_DEFAULTS = {"curve": "bezier", "grid": None, "depths": list(DEFAULT_DEPTHS), "objective": DEFAULT_OBJECTIVE}
# The LPES authors' search (zhenghuawang6/middle_rope; docs/methods/lpes.md "As its authors ran it"): factors
# that only compress positions, 1.0-2.5 on a 0.05 grid, the Bezier's y read at evenly spaced t, fitness the
# greedy answer's accuracy with the gold document last.
AUTHORS_GRID = [round(1.0 + 0.05 * i, 2) for i in range(31)]
PRESET_SEARCH = {"authors": {"curve": "bezier-t", "grid": AUTHORS_GRID, "depths": [1.0], "objective": "greedy"}}


def resolved_search_settings(cfg: SearchConfig) -> dict:
    """``{curve, grid, depths, objective}`` as ``cfg`` will search: its own values, else its preset's, else
    :data:`SEARCH_DEFAULTS` (``grid`` may stay None: the target's default grid)."""
    preset = PRESET_SEARCH.get(cfg.preset, {})
    return {key: getattr(cfg, key) if getattr(cfg, key) is not None else preset.get(key, default)
            for key, default in SEARCH_DEFAULTS.items()}
