"""The LPES authors' genetic algorithm (breeding ``"truncation"`` of :class:`~posbias.search.ga.GAConfig`).

Read from the LPES authors' search code (``zhenghuawang6/middle_rope``: ``genetic_base.py`` and
``dim_mono.py``, adapted from LongRoPE's evolution search); the same ask / tell / ``state_dict`` interface
as :class:`~posbias.search.ga.GeneticAlgorithm`, the same :class:`~posbias.search.ga.Genome`:

* start: every control point's ``y`` at ``start_y`` (1.5 in the reference); the first population is that
  genome plus ``population - 1`` mutants of it.
* each generation (``tell``): the ``elite`` best of the population (ties in population order) are the
  parents, carried over unchanged; then ``mutations`` mutants of parents drawn uniformly, and ``crossovers``
  children of two distinct parents (the better one first); next population = parents + children
  ((mu + lambda) truncation selection; the parents' scores are memoised by the loop).
* mutation: each control point with probability ``mutation_rate`` redraws its ``y`` uniformly among the grid
  values from ``max_y_step`` steps below to ``max_y_step - 1`` above (the reference's
  ``arange(max(1, y - 0.2), min(2.5, y + 0.2), 0.05)``, upper end excluded) and, when the curve uses it, its
  ``x`` strictly between its neighbours; repeated, accumulating, until the genome is one never bred before.
* crossover: up to ``crossover_tries`` rounds over the control points; each point with probability
  ``crossover_rate`` is offered, and with probability 1/2 takes the second parent's point; the first offer
  that leaves a new genome with increasing ``x`` is the child; parents that are equal, or no success, give
  a mutant of the first parent instead.

Two differences, both because the reference's ``x`` never reaches the factors of its curve
(:data:`~posbias.patching.curves.X_FREE_CURVES`): there ``x`` is not mutated (the reference spends an
evaluation on genomes that differ in ``x`` only, which give the same factors), and the end points' ``x``
stay at 0 and 1 as every posbias curve has them. All randomness comes from the ``numpy.random.Generator``
passed in; the set of genomes ever bred is part of ``state_dict()`` so a resumed search continues exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from posbias.patching.curves import X_FREE_CURVES
from posbias.search.ga import GAConfig, Genome, distinct_scored, identity_genome, restored_rng

__all__ = ["TruncationGA", "start_genome", "window_mutation", "point_crossover"]

MUTATION_TRIES = 1000  # the reference loops until a new genome appears; here a repeat is kept after this many


def start_genome(cfg: GAConfig) -> Genome:
    """Every ``y`` at ``cfg.start_y`` (1.0 when None), the interior ``x`` evenly spread."""
    start = 1.0 if cfg.start_y is None else cfg.start_y
    j = int(np.abs(np.asarray(cfg.grid) - start).argmin())
    return Genome(identity_genome(cfg).x, (j,) * cfg.n_control)


def _draw_y(j: int, rng: np.random.Generator, cfg: GAConfig) -> int:
    lo, hi = max(0, j - cfg.max_y_step), min(len(cfg.grid) - 1, j + cfg.max_y_step)
    return int(rng.integers(lo, hi)) if hi > lo else j


def _draw_x(xs: list[int], k: int, rng: np.random.Generator, cfg: GAConfig) -> int:
    """A new interior ``x`` index for ``xs[k]``, strictly between its neighbours."""
    lo = (xs[k - 1] if k > 0 else 0) + 1
    hi = xs[k + 1] if k + 1 < len(xs) else cfg.x_resolution
    return int(rng.integers(lo, hi)) if hi > lo else xs[k]


def window_mutation(g: Genome, rng: np.random.Generator, cfg: GAConfig, seen: set[Genome]) -> Genome:
    """A mutant of ``g`` not in ``seen`` (module docstring); ``seen`` is left unchanged."""
    ys, xs = list(g.y), list(g.x)
    moves_x = cfg.curve not in X_FREE_CURVES
    child = g
    for _ in range(MUTATION_TRIES):
        for k in range(cfg.n_control):
            if rng.random() < cfg.mutation_rate:
                if moves_x and 0 < k < cfg.n_control - 1:
                    xs[k - 1] = _draw_x(xs, k - 1, rng, cfg)
                ys[k] = _draw_y(ys[k], rng, cfg)
        child = Genome(tuple(xs), tuple(ys))
        if child not in seen:
            break
    return child


def point_crossover(a: Genome, b: Genome, rng: np.random.Generator, cfg: GAConfig,
                    seen: set[Genome]) -> Genome | None:
    """A child of ``a`` taking some of ``b``'s control points, new and with increasing ``x``; None when
    ``a == b`` or no such child was found in ``cfg.crossover_tries`` rounds (module docstring)."""
    if a == b:
        return None
    ys, xs = list(a.y), [0, *a.x, cfg.x_resolution]
    for _ in range(cfg.crossover_tries):
        for k in range(cfg.n_control):
            if rng.random() >= cfg.crossover_rate:
                continue
            if rng.random() < 0.5:
                ys[k] = b.y[k]
                xs[k] = ([0, *b.x, cfg.x_resolution])[k]
            child = Genome(tuple(xs[1:-1]), tuple(ys))
            if child not in seen and all(p < q for p, q in zip(xs, xs[1:])):
                return child
    return None


@dataclass
class TruncationGA:
    """Ask/tell GA of the LPES authors (module docstring); ``rng`` is the only source of randomness."""

    cfg: GAConfig
    rng: np.random.Generator
    population: list[Genome] = field(default_factory=list)
    generation: int = 0
    seen: set[Genome] = field(default_factory=set)  # every genome bred so far (the reference's history)

    def __post_init__(self) -> None:
        if not self.population:
            start = start_genome(self.cfg)
            self.seen.add(start)
            self.population = [start]
            while len(self.population) < self.cfg.population:
                self.population.append(self._mutant(start))

    def _mutant(self, g: Genome) -> Genome:
        child = window_mutation(g, self.rng, self.cfg, self.seen)
        self.seen.add(child)
        return child

    def ask(self) -> list[Genome]:
        """The current generation's population (the parents of the previous one first)."""
        return list(self.population)

    def tell(self, fitness: Mapping[Genome, Any]) -> list[Genome]:
        """Keep the ``elite`` best as parents and breed the children; returns the next population."""
        unique = distinct_scored(self.population, fitness)
        parents = sorted(unique, key=lambda g: fitness[g], reverse=True)[: self.cfg.elite]
        children = [self._mutant(parents[int(self.rng.integers(len(parents)))]) for _ in range(self.cfg.mutations)]
        for _ in range(self.cfg.crossovers if len(parents) > 1 else 0):
            i, j = sorted(int(v) for v in self.rng.choice(len(parents), 2, replace=False))
            child = point_crossover(parents[i], parents[j], self.rng, self.cfg, self.seen)
            if child is None:
                child = self._mutant(parents[i])
            self.seen.add(child)
            children.append(child)
        self.population = parents + children
        self.generation += 1
        return list(self.population)

    def state_dict(self) -> dict:
        return {"generation": self.generation, "population": [g.to_list() for g in self.population],
                "rng": self.rng.bit_generator.state, "config": self.cfg.to_dict(),
                "seen": [g.to_list() for g in sorted(self.seen)]}

    @classmethod
    def from_state(cls, state: dict, cfg: GAConfig | None = None) -> "TruncationGA":
        cfg = cfg or GAConfig(**state["config"])
        population = [Genome.from_list(v) for v in state["population"]]
        return cls(cfg, restored_rng(state), population, int(state["generation"]),
                   {Genome.from_list(v) for v in state["seen"]})
