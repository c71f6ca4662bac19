"""Settings of one LPES search (:class:`SearchConfig`): what ``posbias search`` builds from its flags or
from ``--config``, what :func:`posbias.search.runner.run_search` takes, and what the run folder's
``config.json`` records beside the resolved GA settings (so that file can be fed back)."""
from __future__ import annotations

from dataclasses import dataclass, field

from posbias.search.fitness import DEFAULT_OBJECTIVE


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
        weights: fitness weights of depths 0, 0.5, 1 (None: equal).
        objective: ``logprob`` or ``accuracy`` (:mod:`posbias.search.fitness`); ``prune``: stop scoring
            individuals that cannot reach the elite; ``shared_context``: one prefill per search context.
        chat: wrap prompts in the tokenizer's chat template.
        heldout_n: held-out instances per depth of ``posbias search``'s before / after table (0: none).
        target: ``rope`` (LPES: per-layer RoPE factors) or ``temperature`` (per-layer attention
            temperatures, :mod:`posbias.methods.temperature`); the values file records it.
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
    curve: str = "bezier"
    control_points: int = 4
    grid: list[float] | None = None
    round_to_grid: bool = False
    weights: list[float] | None = None
    objective: str = DEFAULT_OBJECTIVE
    prune: bool = True
    shared_context: bool = True
    chat: bool = False
    heldout_n: int = 20
    target: str = "rope"


# what a search folder's config.json records beside the SearchConfig fields (resolved from them)
DERIVED_KEYS = ("ga", "generations", "n_per_depth", "batch_size")
