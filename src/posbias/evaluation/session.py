"""One evaluation run end to end: check the request, load the model, build instances, apply a
method, evaluate.

:class:`EvalConfig` holds the settings of one run (what ``posbias eval`` builds from its flags or its
``--config`` file). :func:`plan_eval` runs every check that needs no model (task and its options, a data file, mode,
method name, options and factors file, the run folder) and writes nothing; :func:`run_planned`
loads the model unless given one, builds the instances and scores them. The run folder's
``config.json`` is written only together with the first result, so a request rejected at any
point before that leaves the folder as it was. :func:`run_eval` does both steps.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbias.evaluation.attention_sorting import attention_sorted
from posbias.evaluation.batching import model_max_positions
from posbias.evaluation.modes import TEACHER_FORCED, canonical_mode
from posbias.evaluation.runner import check_attention, check_mode, evaluate
from posbias.methods import apply_method
from posbias.methods.registry import check_method
from posbias.models import load_model, model_identity
from posbias.models.adapter import eval_settings
from posbias.models.options import LoadOptions, load_settings, options_for
from posbias.tasks import check_length, check_request, make_instances, precheck_instances
from posbias.tasks.base import check_int
from posbias.tasks.registry import check_records
from posbias.utils.run_folder import RunFolder, open_run

# methods that change the prompt before each batch is scored: method name -> step(model, tokenizer, instances,
# chat=, batch_size=, **the handle's options) -> instances (the method itself leaves the model unchanged)
PROMPT_STEPS = {"attention-sorting": attention_sorted}

# Settings that must match when a run folder is reused (otherwise results would be mixed). The
# depth list is one of them: passkey and niah fit their haystack over all requested depths, so
# another depth list can give another prompt under the same instance id. ``n`` may change: instance
# ``i`` is the same for every ``n``, so a larger ``n`` scores only the new instances.
RESUME_KEYS = ("model", "model_path", "task", "depths", "seed", "split", "mode", "chat", "max_new_tokens", "method",
               "method_options", "task_options", "dtype", "attention")
# Method options naming a file or folder that must exist.


@dataclass
class EvalConfig:
    """The settings of one evaluation run.

    Attributes:
        model: a model spec (folder, ``.gguf`` file, packaged alias or Hub id).
        task / task_options / depths / n / seed / split: the instances (``n`` per gold depth in [0, 1]
            of ``split``, ``eval`` or ``search``; instance ``i`` is the same for every ``n``).
        out: the run folder (re-running resumes).
        mode: ``teacher-forced`` | ``generate`` | ``both``; ``max_new_tokens``: greedy generation's limit
            (None: the longest gold answer's tokens + 4, at least 16, see
            :func:`~posbias.evaluation.generation.generation_budget`).
        batch_size: instances per forward pass; ``chat``: wrap prompts in the tokenizer's chat template.
        method / method_options: the inference method applied while scoring (``none``: the model as it is).
        attention: record where the last prompt position's attention went (gold record's mass, rank and
            retrieval-head hits per layer; tasks made of records: kv, kv-uuid, mdqa).
    """

    model: str
    task: str
    depths: list[float]
    n: int
    out: str | Path
    seed: int = 0
    split: str = "eval"
    mode: str = "teacher-forced"
    batch_size: int = 8
    chat: bool = False
    max_new_tokens: int | None = None
    method: str = "none"
    method_options: dict = field(default_factory=dict)
    task_options: dict = field(default_factory=dict)
    attention: bool = False


@dataclass
class EvalPlan:
    """A checked evaluation request: its settings, its run folder (nothing written yet) and, for a
    task that needs no tokenizer, its instances."""

    config: dict
    folder: RunFolder
    instances: list | None = None
    load: LoadOptions = LoadOptions()


def plan_eval(cfg: EvalConfig, *, parent: RunFolder | None = None, instances: list | None = None,
              load: LoadOptions | None = None) -> EvalPlan:
    """Check the evaluation request ``cfg`` before any model is loaded; ``load`` as in :func:`run_eval`.

    ``parent`` is the run folder this one lives in (a comparison); ``instances`` are ones already
    built for the same request (a comparison builds them once for all its methods).
    """
    method_options = dict(cfg.method_options or {})
    task_options = dict(cfg.task_options or {})
    check_int("batch_size", cfg.batch_size)
    if cfg.max_new_tokens is not None:
        check_int("max_new_tokens", cfg.max_new_tokens)
    mode = canonical_mode(cfg.mode)
    check_mode(mode)
    check_attention(mode, cfg.attention)
    depths = check_request(cfg.task, n=cfg.n, depths=cfg.depths, seed=cfg.seed, split=cfg.split, **task_options)
    if cfg.attention:
        check_records(cfg.task)
    if instances is None:
        instances = precheck_instances(cfg.task, n=cfg.n, depths=depths, seed=cfg.seed, split=cfg.split,
                                       **task_options)

    # a posbias apply folder's own method
    method, method_options, adapter = eval_settings(cfg.model, cfg.method, method_options)
    check_method(method, method_options)
    if cfg.chat and task_options.get("shared_context"):
        raise ValueError("a shared context (shared_context=true) is scored without a chat template: drop --chat")

    config = {"model": cfg.model, "model_path": model_identity(cfg.model), "task": cfg.task, "depths": depths,
              "n": cfg.n, "seed": cfg.seed, "split": cfg.split, "mode": mode,
              "batch_size": cfg.batch_size, "chat": cfg.chat,
              "max_new_tokens": None if mode == TEACHER_FORCED else cfg.max_new_tokens, "method": method,
              "method_options": method_options, "task_options": task_options, "attention": bool(cfg.attention),
              "out": str(cfg.out),  # not compared on resume; makes config.json usable as --config
              **load_settings(cfg.model, load)}
    if adapter is not None:  # the model loads with the method active: recorded, not applied again
        config["adapter"] = adapter
    folder = open_run(cfg.out, "eval", config, check_keys=RESUME_KEYS, parent=parent, upgrade=upgrade_eval_settings)
    return EvalPlan(config, folder, instances, load or LoadOptions())


def upgrade_eval_settings(old: dict) -> dict:
    """An eval folder's settings as this posbias records them: a teacher-forced run generates nothing,
    so its generation limit is None (older versions recorded their default, 16); folders from before the
    attention diagnostic ran without it."""
    old = {"attention": False, **old}
    return {**old, "max_new_tokens": None} if old.get("mode") == TEACHER_FORCED else old


def build_instances(model, tokenizer, task: str, depths: list[float], n: int, seed: int, split: str,
                    task_options: dict[str, Any]):
    """The instances of a task for ``model``; a target length beyond the model is refused before
    any haystack is fitted to it."""
    check_length(task, task_options, model_max_positions(model))
    return make_instances(task, tokenizer=tokenizer, n=n, depths=depths, seed=seed, split=split, **task_options)


def run_planned(plan: EvalPlan, loaded=None, progress: bool = True) -> dict:
    """Load the model (unless ``loaded=(model, tokenizer)``), build the instances, evaluate."""
    c = plan.config
    if loaded is None:
        loaded = load_model(c["model"], plan.load)
    lm, tok = loaded
    instances = plan.instances
    if instances is None:
        instances = build_instances(lm, tok, c["task"], c["depths"], c["n"], c["seed"], c["split"],
                                    c["task_options"])
    method, options = ("none", {}) if c.get("adapter") else (c["method"], c["method_options"])
    applied = applied_method(lm, method, options)
    with applied as scored_model:
        return evaluate(scored_model, tok, instances, plan.folder.path, mode=c["mode"], batch_size=c["batch_size"],
                        chat=c["chat"], max_new_tokens=c["max_new_tokens"], label=f"{c['method']} / {c['task']}",
                        progress=progress, before_write=plan.folder.commit, attention=c.get("attention", False),
                        prepare=applied.prepare)


def run_eval(cfg: EvalConfig, *, loaded=None, load: LoadOptions | None = None) -> dict:
    """Evaluate ``cfg.model`` (or ``loaded=(model, tokenizer)``) with ``cfg.method`` on ``cfg.task`` into
    the run folder ``cfg.out`` (re-running resumes); returns the summary. ``load``: device, dtype and
    Hub revision of the model (default: the CPU in float32).

    Everything that can be checked without the model is checked before it loads, and nothing is
    written before the first result, so bad input never leaves a half-made run folder behind.
    """
    return run_planned(plan_eval(cfg, load=options_for(load, loaded)), loaded)


class applied_method:
    """Context manager applying a registered inference method (``none`` needs no registry)."""

    def __init__(self, model, name: str, options: dict):
        self.model, self.name, self.options, self.handle = model, name, options, None

    def __enter__(self):
        if self.name == "none" and not self.options:
            return self.model

        self.handle = apply_method(self.model, self.name, **self.options)
        return getattr(self.handle, "model", self.model)

    def __exit__(self, *exc):
        if self.handle is not None:
            self.handle.remove()

    @property
    def prepare(self):
        """The method's step before each batch is scored (:data:`PROMPT_STEPS`), with its options; or None."""
        step = PROMPT_STEPS.get(self.handle.name) if self.handle is not None else None
        return None if step is None else functools.partial(step, **self.handle.options)
