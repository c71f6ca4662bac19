"""Give every baseline the same chance as LPES: choose its settings on the search split.

For each method, every setting of a small grid (:data:`DEFAULT_GRIDS`, or the user's) is applied and
scored teacher-forced on the *search* split (shared contexts where the task has them and the method
allows them, see :mod:`posbias.evaluation.scoring`) into the LPES search's own
:class:`~posbias.search.fitness.FitnessResult`, and ranked by the search's objective (``objective``:
``logprob``, the depth-weighted mean per-token gold log-probability, or ``accuracy``, mean accuracy
over depths 0 / 0.5 / 1 with the log-prob tie-break). The best
setting of each method goes to ``out/best_settings.json`` (``{method: options}``), which
``posbias compare --settings`` reads, so the held-out comparison runs every method at the setting
chosen on data it never sees. Every scored setting is one line of ``out/results.jsonl`` (a rerun
resumes) and ``out/tune.md`` is the table. ``workers > 1`` scores the settings in that many spawned
processes, one model each (on a CUDA machine one GPU each, as the LPES search's workers); the
records are written in grid order, so the result is the same with any number of workers. With one
worker, the positional-hidden grid is scored in one sweep (one plain prefill per prompt for all its
settings, :mod:`posbias.evaluation.hidden_sweep`); its rows are written when the sweep ends.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbias.evaluation.hidden_sweep import score_hidden_settings
from posbias.evaluation.session import build_instances
from posbias.evaluation.teacher_forced import score_instances
from posbias.methods import apply_method
from posbias.methods.positional_hidden import tune_grid
from posbias.methods.registry import check_method
from posbias.models import load_model, model_identity
from posbias.models.adapter import refuse_adapter
from posbias.models.options import load_settings, options_for
from posbias.search.fitness import DEFAULT_DEPTHS, DEFAULT_OBJECTIVE, OBJECTIVES, FitnessResult, depth_key, empty_result
from posbias.search.runner import worker_gpus
from posbias.tasks.registry import supports_shared_context
from posbias.utils.io import append_jsonl, atomic_write_json, atomic_write_text, read_jsonl
from posbias.utils.progress import progress_bar
from posbias.utils.run_folder import announce_resume, open_run
from posbias.utils.workers import spawn_pool

# Small grids around each method's published default (first entry = that default).
DEFAULT_GRIDS: dict[str, list[dict[str, Any]]] = {
    "pi": [{"factor": f} for f in (1.1, 0.8, 0.9, 1.0, 1.2, 1.3, 1.5)],
    "ms-poe": [{"r_min": a, "r_max": b} for a, b in ((1.2, 1.8), (1.0, 1.2), (1.0, 1.5), (1.0, 2.0), (1.5, 2.0))],
    "attention-buckets": [{"multipliers": m} for m in (
        [1.0, 1.3, 1.6, 1.9, 2.2, 2.5, 2.8],  # the paper's RAG set relative to 10000
        [1.0, 1.75, 1.8, 1.9, 2.0, 2.5],       # its ToolBench set relative to 10000
        [1.0, 1.1, 1.2, 1.3],                  # narrow
        [1.0, 1.5, 2.0, 3.0, 4.0],             # wide
    )],
    "moice": [{"top_k": k} for k in (7, 1, 2, 3)],
    "temperature": [{"t": t} for t in (1.0, 0.8, 0.9, 1.1, 1.25, 1.5, 2.0)],
}
HIDDEN = "positional-hidden"
TUNE_KEYS = ("model", "model_path", "task", "seed", "n_per_depth", "task_options", "base_options", "dtype")


def default_grid(method: str, base: dict) -> list[dict]:
    """The grid of ``method``; positional-hidden's is built from its candidate dimensions in ``base``."""
    if method == "positional-hidden":
        return tune_grid(base)
    return DEFAULT_GRIDS.get(method, [])


def setting_key(method: str, setting: dict) -> str:
    return f"{method} {json.dumps(setting, sort_keys=True)}"


def score_setting(model, tokenizer, method: str, options: dict, instances, batch_size: int) -> dict:
    """One method setting on the search split: the fitness record (``FitnessResult.to_dict()``) plus
    ``per_depth``, ``accuracy``, ``mean_logprob``, ``weighted_logprob`` and ``seconds``."""
    start = time.perf_counter()
    with apply_method(model, method, **options) as handle:
        rows = score_instances(handle.model, tokenizer, instances, batch_size=batch_size,
                               shared=handle.shared_prefill)
    return setting_record(instances, rows, time.perf_counter() - start)


def setting_record(instances, rows: list[dict], seconds: float) -> dict:
    """The tuning record of one setting from its scored ``rows`` (one per instance, in order)."""
    res = empty_result(instances)
    for inst, r in zip(instances, rows):
        res.add(depth_key(inst.depth), r)
    return {"fitness": res.to_dict(), "per_depth": res.per_depth_accuracy(), "accuracy": res.accuracy,
            "mean_logprob": res.mean_logprob, "weighted_logprob": res.weighted_logprob,
            "seconds": round(seconds, 1)}


def score_hidden_grid(model, tokenizer, settings: list[dict], instances) -> list[dict]:
    """The tuning records of many positional-hidden ``settings`` from one plain prefill per prompt
    (:func:`posbias.evaluation.hidden_sweep.score_hidden_settings`; equal to scoring each alone).
    ``seconds`` is the sweep's time shared out evenly."""
    start = time.perf_counter()
    bar = progress_bar(len(instances), desc=f"positional-hidden x {len(settings)} settings", unit="prompt")
    try:
        _, rows = score_hidden_settings(model, tokenizer, instances, settings, on_instance=lambda k: bar.update(1))
    finally:
        bar.close()
    seconds = (time.perf_counter() - start) / max(1, len(settings))
    return [setting_record(instances, r, seconds) for r in rows]


_WORKER: dict = {}  # a tuning worker's model, tokenizer and instances (set by _worker_init)


def _search_split(model, tokenizer, task: str, n_per_depth: int, seed: int, task_options: dict) -> list:
    """The search-split instances every setting is scored on (shared contexts where the task has them)."""
    opts = {**task_options, "shared_context": True} if supports_shared_context(task, task_options) else task_options
    return build_instances(model, tokenizer, task, list(DEFAULT_DEPTHS), n_per_depth, seed, "search", opts)


def _worker_init(model: str, load, task: str, n_per_depth: int, seed: int, task_options: dict) -> None:
    lm, tok = load_model(model, load)
    _WORKER.update(model=lm, tokenizer=tok, instances=_search_split(lm, tok, task, n_per_depth, seed, task_options))


def _worker_score(job: tuple[str, dict, int]) -> dict:
    method, options, batch_size = job
    return score_setting(_WORKER["model"], _WORKER["tokenizer"], method, options, _WORKER["instances"], batch_size)


def _scored_in_order(jobs: list[tuple[str, dict]], *, workers: int, batch_size: int, local, pool_args: tuple):
    """``score_setting`` of every ``(method, options)`` job, yielded in job order: here with ``local()``
    (``(model, tokenizer, instances)``) for one worker (all positional-hidden settings in one sweep),
    else in a pool of spawned workers."""
    if workers <= 1 or len(jobs) <= 1:
        lm, tok, instances = local()
        hidden = [o for m, o in jobs if m == HIDDEN]
        swept: list[dict] = []
        for method, options in jobs:
            if method == HIDDEN:  # every positional-hidden setting from one prefill per prompt
                swept = swept or score_hidden_grid(lm, tok, hidden, instances)
                yield swept[hidden.index(options)]
            else:
                yield score_setting(lm, tok, method, options, instances, batch_size)
        return

    count = min(workers, len(jobs))
    with spawn_pool(count, _worker_init, pool_args, gpus=worker_gpus(pool_args[1], count)) as pool:
        yield from pool.map(_worker_score, [(m, o, batch_size) for m, o in jobs])


@dataclass
class TuneConfig:
    """The settings of one tuning run.

    Attributes:
        model / task / task_options / seed: what is scored (the *search* split of the task).
        methods: the methods tuned; ``grids[method]``: its settings (default: :func:`default_grid`).
        n_per_depth: search-split instances (contexts) per depth; ``out``: the run folder (resumes).
        base_options[method]: fixed options merged under every grid setting (e.g. MoICE's ``routers``).
        objective: how each method's best setting is chosen (the LPES search's ``logprob`` or ``accuracy``;
            scores do not depend on it, so a rerun with another objective re-chooses from the same results).
        batch_size: instances per forward pass; ``workers``: processes scoring settings in parallel.
    """

    model: str
    task: str
    methods: list[str]
    n_per_depth: int
    out: str | Path
    seed: int = 0
    batch_size: int = 8
    task_options: dict = field(default_factory=dict)
    grids: dict | None = None
    base_options: dict = field(default_factory=dict)
    objective: str = DEFAULT_OBJECTIVE
    workers: int = 1


def checked_grids(cfg: TuneConfig) -> dict[str, list[dict]]:
    """``{method: settings}`` of every method of ``cfg``, each setting checked as the method's options
    (a ``ValueError`` of one line for an objective, method or setting that cannot be tuned)."""
    if cfg.objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {cfg.objective!r}; choose one of {', '.join(OBJECTIVES)}")
    base_options = dict(cfg.base_options or {})
    grids = {m: list((cfg.grids or {}).get(m) or default_grid(m, base_options.get(m, {}))) for m in cfg.methods}
    for m in cfg.methods:
        if not grids[m]:
            raise ValueError(f"tune: no settings grid for method {m!r} "
                             f"(tunable: {', '.join(DEFAULT_GRIDS)}, positional-hidden)")
        if m == "moice" and not base_options.get("moice", {}).get("routers"):
            raise ValueError("tune: moice needs trained routers (--routers, from posbias train-moice)")
        for setting in grids[m]:
            check_method(m, {**base_options.get(m, {}), **setting})
    return grids


def tune_methods(cfg: TuneConfig, *, loaded=None, log=print, load=None) -> dict[str, dict]:
    """Score each method's grid on the search split; returns ``{method: best options}``, chosen by
    ``cfg.objective``. MoICE is only tuned with trained routers (``base_options["moice"]["routers"]``).
    ``load``: the model's :class:`posbias.models.LoadOptions` (device, dtype, Hub revision); with
    ``cfg.workers > 1``, ``loaded`` is not used.
    """
    refuse_adapter(cfg.model, "tune", "each method's settings")
    grids = checked_grids(cfg)
    model, task, methods, seed, n_per_depth = cfg.model, cfg.task, cfg.methods, cfg.seed, cfg.n_per_depth
    task_options, base_options = dict(cfg.task_options or {}), dict(cfg.base_options or {})
    load = options_for(load, loaded)
    config = {"model": model, "model_path": model_identity(model), "task": task, "seed": seed,
              "n_per_depth": n_per_depth, "task_options": task_options,
              "base_options": base_options, "methods": methods, "grids": grids, "objective": cfg.objective,
              "batch_size": cfg.batch_size, "out": str(cfg.out),  # these two: not compared on resume
              **load_settings(model, load)}
    folder = open_run(cfg.out, "tune", config, check_keys=TUNE_KEYS)
    results = folder.path / "results.jsonl"
    # rows written before the fitness record was kept are scored again
    done = {r["key"]: r for r in read_jsonl(results, key="key") if "fitness" in r}
    for r in done.values():
        try:
            FitnessResult.from_dict(r["fitness"])
        except ValueError as e:
            raise ValueError(f"{results}: the row of {r['key']!r}: {e}; delete the row to score it again") from None
    todo = [(m, setting) for m in methods for setting in grids[m] if setting_key(m, setting) not in done]
    total = sum(len(grids[m]) for m in methods)
    if len(todo) < total:
        announce_resume(total - len(todo), total, "settings", folder.path)

    def local():
        lm, tok = loaded or load_model(model, load)
        return lm, tok, _search_split(lm, tok, task, n_per_depth, seed, task_options)

    scored = _scored_in_order([(m, {**base_options.get(m, {}), **s}) for m, s in todo], workers=cfg.workers,
                              batch_size=cfg.batch_size, local=local,
                              pool_args=(model, load, task, n_per_depth, seed, task_options))
    for (m, setting), score in zip(todo, scored):
        folder.commit()
        rec = {"key": setting_key(m, setting), "method": m, "setting": setting, **score}
        append_jsonl(results, rec)
        done[rec["key"]] = rec
        log(f"{m:18s} {json.dumps(setting):48s} acc {rec['accuracy']:.3f}  "
            f"({' '.join(f'{d}:{a:.2f}' for d, a in rec['per_depth'].items())})  "
            f"lp {rec['weighted_logprob']:.3f}")
    best = {m: {**base_options.get(m, {}), **_best(done, m, grids[m], cfg.objective)["setting"]} for m in methods}
    folder.commit()
    atomic_write_json(folder.path / "best_settings.json", best)
    atomic_write_text(folder.path / "tune.md", tune_table(done, methods, grids, cfg.objective) + "\n")
    return best


def _best(done: dict, method: str, grid: list[dict], objective: str) -> dict:
    """The row of ``method``'s grid ranked first by the search's key for ``objective``."""
    def key(row):
        res = FitnessResult.from_dict({**row["fitness"], "objective": objective})
        return tuple(v if math.isfinite(v) else -1e9 for v in res.key)

    return max((done[setting_key(method, s)] for s in grid), key=key)


def tune_table(done: dict, methods: list[str], grids: dict, objective: str = DEFAULT_OBJECTIVE) -> str:
    """Markdown: one row per (method, setting), the one ``objective`` chooses marked."""
    lines = ["| method | setting | " + " | ".join(f"depth {d:g}" for d in DEFAULT_DEPTHS) + " | mean | log-prob | |",
             "|---|---|" + "---:|" * (len(DEFAULT_DEPTHS) + 2) + "---|"]
    for m in methods:
        best = _best(done, m, grids[m], objective)["key"]
        for s in grids[m]:
            r = done[setting_key(m, s)]
            cells = " | ".join(f"{100 * r['per_depth'].get(f'{d:g}', float('nan')):.0f}" for d in DEFAULT_DEPTHS)
            mark = "chosen" if r["key"] == best else ""
            lines.append(f"| {m} | `{json.dumps(s)}` | {cells} | {100 * r['accuracy']:.1f} | "
                         f"{r['weighted_logprob']:.3f} | {mark} |")
    return "\n".join(lines)


def read_settings(path: str | Path) -> dict[str, dict]:
    """``{method: options}`` from a ``best_settings.json``; a clear error for anything else."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"settings file not found: {p} (write one with posbias tune)")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise ValueError(f"{p}: expected an object {{method: {{option: value}}}}")
    return doc
