"""The GA loop of a search: ask / score / tell per generation, with memoisation, pruning, an atomic
checkpoint after every generation and exact resume.

:func:`run_ga` drives any evaluator (:mod:`posbias.search.evaluators`) around any fitness object with
``.score(factors, threshold=, partial=)``. ``out/checkpoint.json`` holds the GA state (rng included)
and the memo of every scored genome; ``out/metrics.jsonl`` one line per generation (objective value
best / mean, accuracy, forward passes, questions scored, wall time, memo hits, pruned individuals;
``mean_accuracy`` counts a pruned individual at its lower bound). A killed search resumed with
``resume=True`` continues from the last completed generation and reaches exactly the result of an
uninterrupted run.
"""
from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from posbias.search.fitness import FitnessResult
from posbias.search.ga import GAConfig, GeneticAlgorithm, Genome, genome_factors, genome_points
from posbias.search.truncation_ga import TruncationGA
from posbias.utils.io import append_jsonl, atomic_write_json, atomic_write_text, read_json, read_jsonl
from posbias.utils.run_folder import announce_resume

__all__ = ["CHECKPOINT", "METRICS", "GAResult", "run_ga", "already_searched"]

CHECKPOINT = "checkpoint.json"
METRICS = "metrics.jsonl"


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


def _save_checkpoint(path: Path, ga: GeneticAlgorithm | TruncationGA, memo: dict, best: Genome | None,
                     meta: dict) -> None:
    atomic_write_json(path, {
        "ga": ga.state_dict(),
        "memo": [[g.to_list(), r.to_dict()] for g, r in memo.items()],
        "best": best.to_list() if best is not None else None,
        "meta": meta,
    })


def identity_distance(factors) -> float:
    """How far per-layer factors are from the unpatched model: ``sum |log f|`` (0 for all ones)."""

    return sum(abs(math.log(f)) for f in factors)


def _damaged(ckpt: Path, e: Exception) -> ValueError:
    what = f"no {e}" if isinstance(e, KeyError) else str(e)
    return ValueError(f"{ckpt}: not a search checkpoint ({what}); delete it to start the search afresh, "
                      "or use another --out")


def _start(cfg: GAConfig, seed: int, out: Path | None, resume: bool):
    """``(ga, memo, best, history)``: from ``out/checkpoint.json`` when resuming (metrics of a generation
    logged but not checkpointed are dropped), else a fresh seeded GA (an old metrics log removed)."""
    ckpt = out / CHECKPOINT if out is not None else None
    if resume and ckpt is not None and ckpt.exists():

        state = read_json(ckpt)
        try:
            saved_cfg = dict(state["ga"]["config"])
        except (KeyError, TypeError, ValueError) as e:
            raise _damaged(ckpt, e) from None
        if saved_cfg != cfg.to_dict():
            diff = [k for k in saved_cfg if saved_cfg[k] != cfg.to_dict().get(k)]
            raise ValueError(f"{ckpt} was written with other GA settings ({', '.join(diff)}); use another out")
        try:
            ga = ga_class(cfg).from_state(state["ga"], cfg)
            memo = {Genome.from_list(g): FitnessResult.from_dict(r) for g, r in state["memo"]}
            best = Genome.from_list(state["best"]) if state.get("best") else None
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise _damaged(ckpt, e) from None
        history = [m for m in read_jsonl(out / METRICS) if m.get("generation", 0) < ga.generation]
        atomic_write_text(out / METRICS, "".join(json.dumps(m) + "\n" for m in history))
        return ga, memo, best, history

    if out is not None and (out / METRICS).exists():
        (out / METRICS).unlink()
    return ga_class(cfg)(cfg, np.random.default_rng(seed)), {}, None, []


def ga_class(cfg: GAConfig) -> type:
    """The GA that breeds as ``cfg.breeding`` says: posbias's tournament GA or the LPES authors' truncation GA."""
    return TruncationGA if cfg.breeding == "truncation" else GeneticAlgorithm


def _generation_record(ranked: list[Genome], memo: dict, todo: list[Genome], before: dict, cfg: GAConfig,
                       factors_of: Callable) -> dict:
    """One ``metrics.jsonl`` line: the objective's best / mean, accuracy, the work this generation did
    (``before``: each scored genome's result before it, None when new) and every individual, ranked."""
    best, br = ranked[0], memo[ranked[0]]

    def spent(attr):
        return sum(getattr(memo[g], attr) - (getattr(before[g], attr) if before[g] is not None else 0) for g in todo)

    return {
        "objective": br.objective, "best_value": br.value,
        "mean_value": sum(memo[g].value for g in ranked) / len(ranked),
        "best_accuracy": br.accuracy, "best_mean_logprob": br.mean_logprob,
        "best_weighted_logprob": br.weighted_logprob,
        "mean_accuracy": sum(memo[g].accuracy for g in ranked) / len(ranked),
        "best_per_depth": br.per_depth_accuracy(),
        "best_factors": factors_of(best), "best_control_points": genome_points(best, cfg),
        "unique": len(ranked), "scored": len(todo), "memo_hits": len(ranked) - len(todo),
        "pruned": sum(1 for g in todo if memo[g].pruned),
        "forward_passes": spent("forward_passes"), "questions_scored": spent("n_scored"),
        "scoring_s": spent("seconds"),
        "individuals": [{"genome": g.to_list(), "value": memo[g].value, "accuracy": memo[g].accuracy,
                         "mean_logprob": memo[g].mean_logprob, "pruned": memo[g].pruned} for g in ranked],
    }


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
    if ckpt is not None and ckpt.exists() and not resume:
        raise ValueError(already_searched(out))
    ga, memo, best, history = _start(cfg, seed, out, resume)
    if ga.generation > 0:

        announce_resume(min(ga.generation, generations), generations, "generations", out)
    factors_of = functools.lru_cache(maxsize=None)(lambda g: [float(v) for v in genome_factors(g, cfg, num_layers)])
    result = None
    for gen in range(ga.generation, generations):
        t0 = time.perf_counter()
        pop = ga.ask()
        unique = list(dict.fromkeys(pop))
        thr = _threshold(unique, memo, cfg.elite) if prune else None
        todo = [g for g in unique if g not in memo
                or (memo[g].pruned and (thr is None or memo[g].upper_bound >= thr))]
        before = {g: memo.get(g) for g in todo}
        for g, r in zip(todo, evaluator.evaluate([(factors_of(g), thr, memo.get(g)) for g in todo])):
            memo[g] = r
        fitness = {g: memo[g].key for g in unique}
        # on a tie, the factors nearest to the unpatched model (identity) win
        ranked = sorted(unique, key=lambda g: (fitness[g], -identity_distance(factors_of(g))), reverse=True)
        best, br = ranked[0], memo[ranked[0]]
        record = {"generation": gen, **_generation_record(ranked, memo, todo, before, cfg, factors_of),
                  "population": len(pop), "threshold": thr, "wall_s": time.perf_counter() - t0}
        ga.tell(fitness)
        history.append(record)
        result = GAResult(best, br, factors_of(best), genome_points(best, cfg), gen + 1, history, memo)
        if ckpt is not None:
            if before_write is not None:
                before_write()
            # the metrics line first: a kill before the checkpoint leaves one line too many, which the
            # resume drops (_start) and redoes; the other order would lose this generation's line
            append_jsonl(out / METRICS, record)
            _save_checkpoint(ckpt, ga, memo, best, {"num_layers": num_layers, "seed": seed})
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
