"""Fitness of a set of per-layer factors: position-balanced teacher-forced accuracy or log-probability.

The search split holds instances whose gold item sits at the beginning, middle and end of the
input (depths 0, 0.5, 1); with shared contexts (the default of ``posbias search``) each context is
asked once per depth and scored from one prefill. Two objectives (``objective``):

* ``"accuracy"``: ranked lexicographically by ``(accuracy, mean_logprob)`` with
  ``accuracy = sum_d w_d * correct_d / n_d`` (weights default to equal, normalised to sum 1),
  ``correct`` = teacher-forced exact match (argmax reproduces every gold token), and
  ``mean_logprob`` = mean per-token gold log-probability, which only breaks ties between equal
  accuracies (small samples make ties frequent);
* ``"greedy"``: as ``"accuracy"``, with ``correct`` = the greedy answer's task score (best_subspan_em for
  MDQA: the fitness of the LPES authors' search), teacher-forced and generated from one prefill
  (:func:`posbias.evaluation.runner.score_chunk`), the per-token gold log-probability breaking ties;
* ``"logprob"``: ranked by ``(sum_d w_d * lp_d / n_d, accuracy)`` with ``lp_d`` the sum over depth
  ``d``'s instances of the per-token gold log-probability (``logprob / n_tokens``): a continuous
  signal that sees every instance move, not only those that cross the argmax.

Early stopping (pruning). Instances are scored in chunks, the depths interleaved round-robin so
every chunk holds all depths. After each chunk the upper bound
``sum_d w_d * (correct_d + remaining_d) / n_d`` is the accuracy if every remaining instance were
correct (objective ``logprob``: ``sum_d w_d * lp_d / n_d``, every remaining log-probability at its
maximum 0). When a *threshold* is given and the bound is strictly below it, scoring stops and the
result is marked ``pruned``. The runner passes as threshold the accuracy of the ``elite``-th best
*fully scored* member of the current population known before the generation is scored (the
carried-over elite). This is safe: an individual whose best possible accuracy is strictly below
the elite-th best accuracy already present can never rank among the ``elite`` best (ties in
accuracy are not pruned, since the log-prob tie-break could still favour it), so the elite — and
the best factors — are exactly those of an unpruned run. What changes is the fitness that
tournament selection sees for a pruned individual: the *lower* bound ``sum_d w_d * correct_d /
n_d`` (its remaining instances counted wrong) with the mean log-prob of what was scored. So the
elite of every generation is exact, but the ranking among non-elite individuals (hence the later
trajectory) can differ from an unpruned run; ``prune=False`` (``--no-prune``) gives the exact GA.
Because the threshold is fixed before the generation starts, results do not depend on evaluation
order or on the number of workers, and a resumed run equals an uninterrupted one. A pruned result keeps its counts, so
should it ever need a full score (its
bound reaching a later threshold) scoring resumes where it stopped — nothing is scored twice.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from posbias.architecture.layers import get_decoder_layers
from posbias.evaluation.generation import generation_budget
from posbias.evaluation.runner import score_chunk
from posbias.evaluation.teacher_forced import score_instances
from posbias.methods.temperature import JOINT_TARGET, TemperatureHooks, apply_scaling_and_temperature
from posbias.patching.rope_scaling import apply_layer_scaling

__all__ = ["FitnessResult", "TeacherForcedFitness", "SyntheticFitness", "interleave_by_depth", "empty_result",
           "DEFAULT_DEPTHS", "DEFAULT_OBJECTIVE", "OBJECTIVES"]

DEFAULT_DEPTHS = (0.0, 0.5, 1.0)
OBJECTIVES = ("accuracy", "logprob", "greedy")
# The search's default objective: the one that ranked genomes more consistently between two disjoint
# search splits of equal cost (experiments/search-objective; docs/results/search-objective).
DEFAULT_OBJECTIVE = "logprob"


@dataclass
class FitnessResult:
    """Score of one factor set; ``counts`` maps a depth (as str) to ``[correct, scored, total]``."""

    counts: dict[str, list[int]]
    weights: dict[str, float]
    logprob_sum: float = 0.0          # sum over scored instances of per-token gold log-prob
    n_scored: int = 0
    n_total: int = 0
    forward_passes: int = 0
    seconds: float = 0.0
    pruned: bool = False
    synthetic_value: float | None = None  # SyntheticFitness only
    objective: str = "accuracy"
    logprob_by_depth: dict[str, float] = field(default_factory=dict)  # per depth: sum of per-token log-probs

    @property
    def complete(self) -> bool:
        return self.n_scored >= self.n_total and not self.pruned

    def add(self, depth: str, row: dict) -> None:
        """Count one scored question (a scorer record: ``em``, ``logprob``, ``n_tokens``) at ``depth``."""
        c = self.counts[depth]
        c[0] += int(bool(row["em"]))
        c[1] += 1
        per_token = float(row["logprob"]) / max(int(row["n_tokens"]), 1)
        self.logprob_sum += per_token
        self.logprob_by_depth[depth] = self.logprob_by_depth.get(depth, 0.0) + per_token
        self.n_scored += 1

    @property
    def accuracy(self) -> float:
        """Weighted accuracy; for an incomplete result the lower bound (remaining counted wrong)."""
        if self.synthetic_value is not None:
            return self.synthetic_value
        return sum(self.weights[d] * c / t for d, (c, s, t) in self.counts.items() if t)

    @property
    def weighted_logprob(self) -> float:
        """``sum_d w_d * lp_d / scored_d``: the depth-weighted mean per-token gold log-probability."""
        if not self.n_scored:
            return -math.inf
        return sum(self.weights[d] * self.logprob_by_depth.get(d, 0.0) / s
                   for d, (c, s, t) in self.counts.items() if s)

    @property
    def value(self) -> float:
        """The objective's value (for an incomplete result: accuracy's lower bound, or the mean
        log-probability of what was scored)."""
        if self.synthetic_value is not None:
            return self.synthetic_value
        return self.weighted_logprob if self.objective == "logprob" else self.accuracy

    @property
    def upper_bound(self) -> float:
        if self.synthetic_value is not None:
            return self.synthetic_value
        if self.objective == "logprob":
            return sum(self.weights[d] * self.logprob_by_depth.get(d, 0.0) / t
                       for d, (c, s, t) in self.counts.items() if t)
        return sum(self.weights[d] * (c + t - s) / t for d, (c, s, t) in self.counts.items() if t)

    @property
    def mean_logprob(self) -> float:
        return self.logprob_sum / self.n_scored if self.n_scored else -math.inf

    @property
    def key(self) -> tuple[float, float]:
        """Ranking key (higher is better)."""
        if self.objective == "logprob" and self.synthetic_value is None:
            return (self.weighted_logprob, self.accuracy)
        return (self.accuracy, self.mean_logprob)

    def per_depth_accuracy(self) -> dict[str, float]:
        return {d: (c / s if s else float("nan")) for d, (c, s, t) in self.counts.items()}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "FitnessResult":
        """The result :meth:`to_dict` wrote; a ``ValueError`` naming the fields for anything else (the
        caller adds the file)."""
        if not isinstance(d, dict):
            raise ValueError(f"a fitness record must be an object, got {type(d).__name__}")
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"fitness record with unknown field(s) {', '.join(map(repr, unknown))}")
        try:
            return cls(**d)
        except TypeError as e:
            raise ValueError(f"fitness record: {e}") from None

    def summary(self) -> dict:
        return {"objective": self.objective, "value": self.value, "accuracy": self.accuracy,
                "mean_logprob": self.mean_logprob, "weighted_logprob": self.weighted_logprob,
                "per_depth": self.per_depth_accuracy(), "complete": self.complete, "pruned": self.pruned,
                "n_scored": self.n_scored, "n_total": self.n_total}


def depth_key(depth: float) -> str:
    return f"{float(depth):g}"


def interleave_by_depth(instances: Sequence[Any]) -> list[Any]:
    """Reorder instances round-robin over their depths (first of each depth, second of each, ...)."""
    groups: dict[str, list] = defaultdict(list)
    for inst in instances:
        groups[depth_key(inst.depth)].append(inst)
    order = sorted(groups, key=float)
    out = []
    for i in range(max((len(g) for g in groups.values()), default=0)):
        out.extend(groups[d][i] for d in order if i < len(groups[d]))
    return out


def normalise_weights(depths: Sequence[str], weights: Sequence[float] | dict | None) -> dict[str, float]:
    if weights is None:
        w = {d: 1.0 for d in depths}
    elif isinstance(weights, dict):
        w = {depth_key(float(k)): float(v) for k, v in weights.items()}
        missing = [d for d in depths if d not in w]
        if missing:
            raise ValueError(f"fitness weights lack depth(s) {missing}")
    else:
        if len(weights) != len(depths):
            raise ValueError(f"got {len(weights)} fitness weights for {len(depths)} depths {list(depths)}")
        w = dict(zip(depths, map(float, weights)))
    if any(v < 0 for v in w.values()) or sum(w[d] for d in depths) <= 0:
        raise ValueError(f"fitness weights must be >= 0 with a positive sum, got {w}")
    total = sum(w[d] for d in depths)
    return {d: w[d] / total for d in depths}


class TeacherForcedFitness:
    """Score factor sets on a fixed list of search instances with one loaded model.

    Args:
        model, tokenizer: the model to patch (per-layer scaling is applied and removed per call).
        instances: search-split instances (``.depth`` groups them; depth order as given by the tasks).
        weights: per-depth weights (sequence in ascending depth order, or ``{depth: w}``); default equal.
        chunk_size: instances scored between two pruning checks (default ``batch_size``, rounded up to
            whole shared contexts: a multiple of the number of depths).
        objective: ``"accuracy"``, ``"logprob"`` or ``"greedy"`` (see the module docstring).
        shared: score the questions of one shared context from one prefill (instances made with
            ``shared_context=True``; equal scores, see :mod:`posbias.evaluation.scoring`).
        target: what the per-layer values are (:data:`SEARCH_TARGETS`): ``rope`` (LPES factors),
            ``temperature`` (attention temperatures, :mod:`posbias.methods.temperature`) or
            ``rope+temperature`` (both: ``2 * num_layers`` values, :func:`apply_values`).
    """

    def __init__(self, model, tokenizer, instances: Sequence[Any], *, weights=None, batch_size: int = 4,
                 chunk_size: int | None = None, chat: bool = True, objective: str = "accuracy",
                 shared: bool = True, target: str = "rope"):
        if target not in SEARCH_TARGETS:
            raise ValueError(f"unknown search target {target!r}; choose one of {', '.join(SEARCH_TARGETS)}")
        self.target = target
        if not instances:
            raise ValueError("no search instances")
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
        self.objective, self.shared = objective, shared
        self.model, self.tokenizer = model, tokenizer
        self.num_layers = len(get_decoder_layers(model))  # the length of a factors vector
        self.instances = interleave_by_depth(instances)
        self.totals: dict[str, int] = defaultdict(int)
        for inst in self.instances:
            self.totals[depth_key(inst.depth)] += 1
        self.depths = sorted(self.totals, key=float)
        self.weights = normalise_weights(self.depths, weights)
        self.batch_size = batch_size
        if chunk_size is None:
            per = len(self.depths)
            contexts = shared and any("context_id" in getattr(i, "meta", {}) for i in self.instances)
            chunk_size = -(-batch_size // per) * per if contexts else batch_size
        self.chunk_size = chunk_size
        self.chat = chat
        # greedy answers get the budget of the longest gold answer of all instances (the same for every chunk)
        self.max_new_tokens = generation_budget(tokenizer, self.instances) if objective == "greedy" else 0
        self._forwards = 0
        self._hook = model.register_forward_hook(self._count)  # counts forward passes

    def close(self) -> None:
        self._hook.remove()

    def _count(self, *_):
        self._forwards += 1

    def empty_result(self) -> FitnessResult:
        return empty_result(self.instances, self.weights, self.objective)

    def score(self, factors: Sequence[float], *, threshold: float | None = None,
              partial: FitnessResult | None = None) -> FitnessResult:
        """Score ``factors``; stop early when the upper bound falls strictly below ``threshold``.

        ``partial`` (an earlier pruned result of the same factors) is continued, not redone.
        """
        res = FitnessResult.from_dict(partial.to_dict()) if partial is not None else self.empty_result()
        res.pruned = False
        t0, f0 = time.perf_counter(), self._forwards
        with apply_values(self.model, self.target, factors):
            while res.n_scored < res.n_total:
                if threshold is not None and res.upper_bound < threshold:
                    res.pruned = True
                    break
                chunk = self.instances[res.n_scored: res.n_scored + self.chunk_size]
                for inst, r in zip(chunk, self._score(chunk)):
                    res.add(depth_key(inst.depth), r)
        res.forward_passes += self._forwards - f0
        res.seconds += time.perf_counter() - t0
        return res


    def _score(self, chunk: Sequence[Any]) -> list[dict]:
        """Scorer records (``em``, ``logprob``, ``n_tokens``) of ``chunk``; with the ``greedy`` objective
        ``em`` is the greedy answer's full task score."""
        if self.objective != "greedy":
            return score_instances(self.model, self.tokenizer, chunk, batch_size=self.batch_size, chat=self.chat,
                                   shared=self.shared)
        rows = score_chunk(self.model, self.tokenizer, chunk, mode="both", batch_size=self.batch_size,
                           chat=self.chat, max_new_tokens=self.max_new_tokens)
        return [{"em": r["gen_score"] >= 1.0, "logprob": r["tf_logprob"], "n_tokens": r["n_tokens"]} for r in rows]


SEARCH_TARGETS = ("rope", "temperature", JOINT_TARGET)


def apply_values(model, target: str, values: Sequence[float]):
    """Apply one per-layer value set of a search ``target``; the handle removes it (a context manager).

    ``rope+temperature`` values are ``2 * num_layers`` long: the RoPE factors, then the temperatures."""
    if target == "temperature":
        return TemperatureHooks(model, values)
    if target == JOINT_TARGET:
        n = len(values) // 2
        return apply_scaling_and_temperature(model, values[:n], values[n:])

    return apply_layer_scaling(model, values)


def empty_result(instances: Sequence[Any], weights=None, objective: str = "accuracy") -> FitnessResult:
    """A :class:`FitnessResult` with nothing scored yet for ``instances`` (depths from their ``depth``)."""
    totals: dict[str, int] = defaultdict(int)
    for inst in instances:
        totals[depth_key(inst.depth)] += 1
    depths = sorted(totals, key=float)
    w = normalise_weights(depths, weights)
    return FitnessResult({d: [0, 0, totals[d]] for d in depths}, w, n_total=len(instances),
                         objective=objective, logprob_by_depth={d: 0.0 for d in depths})


class SyntheticFitness:
    """A cheap stand-in fitness ``fn(factors) -> float`` (tests, dry runs); never pruned."""

    def __init__(self, fn: Callable[[Sequence[float]], float]):
        self.fn = fn

    def score(self, factors: Sequence[float], *, threshold: float | None = None,
              partial: FitnessResult | None = None) -> FitnessResult:
        t0 = time.perf_counter()
        v = float(self.fn(list(factors)))
        return FitnessResult({}, {}, n_scored=1, n_total=1, seconds=time.perf_counter() - t0,
                             synthetic_value=v, logprob_sum=v)


def bump_objective(factors: Sequence[float], target: float = 0.8) -> float:
    """A synthetic objective: highest when the late half of the layers sits at ``target``."""
    n = len(factors)
    late = factors[n // 2:]
    early = factors[: n // 2]
    return -sum((f - target) ** 2 for f in late) - sum((f - 1.0) ** 2 for f in early)
