"""A curve-constrained genetic algorithm over LPES control points (ask/tell, seeded, resumable).

Genome: ``C`` control points of a layer->factor curve (see :mod:`posbias.patching.curves`):

* ``x``: the ``C - 2`` interior control x as integer indices on a grid of ``x_resolution`` steps
  (``x = i / x_resolution``, ``1 <= i < x_resolution``), strictly increasing; ``x_0 = 0`` and
  ``x_{C-1} = 1`` are implied.
* ``y``: ``C`` indices into the factor grid.

Genomes are frozen dataclasses of int tuples: hashable (memoisation) and JSON-friendly.

A *joint* genome carries several curves over the same layers (``GAConfig.extra_grids``: one more
curve per grid, e.g. LPES factors and attention temperatures searched together): ``x`` and ``y``
are the per-curve blocks above, concatenated in curve order. Every operator then acts on each curve
with that curve's grid (crossover per control point of each curve; a forced mutation moves one
curve); a one-curve genome takes exactly the one-curve code path, so its searches are unchanged.

One generation: the caller ``ask()``s the population, scores it, ``tell()``s the fitness (any
totally ordered values, higher is better). ``tell`` keeps the ``elite`` best unchanged and fills
the rest with children: two tournament-selected parents, uniform crossover per control point (with
probability ``crossover_rate``, else a copy of the first parent), then mutation. Mutation moves each
``y`` gene (probability ``mutation_rate``) by 1..``max_y_step`` grid steps and each interior ``x``
by 1..``max_x_step`` x-grid steps. Children are *repaired*, never rejected: ``y`` is clipped to the
grid, ``x`` to the open interval and pushed apart until strictly increasing. A child equal to a
member of the next population is mutated again (forced, up to 20 times) so the population stays
diverse. All randomness comes from the ``numpy.random.Generator`` passed in, whose state is part of
``state_dict()``: the same seed gives the same search, and a restored state continues it exactly.

The initial population is the identity genome (every factor 1.0, i.e. the unpatched model; its
score is the baseline) plus random genomes whose ``y`` lie within ``init_y_spread`` grid steps of
1.0 (large factors are known to destroy accuracy, so the search starts near the identity).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from posbias.patching.curves import CURVE_KINDS, DEFAULT_GRID, check_grid, curve_factors

__all__ = ["Genome", "GAConfig", "GeneticAlgorithm", "BREEDINGS", "genome_points", "genome_factors", "repair_x",
           "random_genome", "identity_genome", "mutate", "crossover", "split_genome", "join_genomes"]


@dataclass(frozen=True, order=True)
class Genome:
    x: tuple[int, ...]
    y: tuple[int, ...]

    def to_list(self) -> list[list[int]]:
        return [list(self.x), list(self.y)]

    @classmethod
    def from_list(cls, v: Sequence[Sequence[int]]) -> "Genome":
        return cls(tuple(int(i) for i in v[0]), tuple(int(i) for i in v[1]))


BREEDINGS = ("tournament", "truncation")
BREEDING_DEFAULTS = {"breeding": "tournament", "mutations": 0, "crossovers": 0, "start_y": None, "crossover_tries": 20}


@dataclass
class GAConfig:
    """Search-space and operator settings (the defaults are documented in the module docstring)."""

    n_control: int = 4                 # cubic Bézier, as in the LPES appendix
    grid: tuple[float, ...] = DEFAULT_GRID
    x_resolution: int = 20             # interior x on multiples of 1/20
    curve: str = "bezier"
    round_to_grid: bool = False        # snap per-layer factors to the grid
    population: int = 8
    elite: int = 2
    tournament: int = 3
    crossover_rate: float = 0.7
    mutation_rate: float = 0.3         # per gene
    max_y_step: int = 2
    max_x_step: int = 2
    init_y_spread: int = 3
    include_identity: bool = True
    extra_grids: tuple[tuple[float, ...], ...] = ()  # a joint search: one more curve per grid
    # breeding "truncation" (:mod:`posbias.search.truncation_ga`, the LPES authors' GA): each generation the
    # ``elite`` best parents, ``mutations`` mutated and ``crossovers`` crossed children; every y starts at
    # ``start_y``; a crossover gives up after ``crossover_tries`` rounds
    breeding: str = "tournament"
    mutations: int = 0
    crossovers: int = 0
    start_y: float | None = None
    crossover_tries: int = 20

    def __post_init__(self) -> None:
        self.grid = check_grid(self.grid)
        self.extra_grids = tuple(check_grid(g) for g in self.extra_grids)
        if self.curve not in CURVE_KINDS:
            raise ValueError(f"unknown curve {self.curve!r}; choose one of {', '.join(CURVE_KINDS)}")
        if self.n_control < 2:
            raise ValueError(f"n_control must be >= 2 (first and last point), got {self.n_control}")
        if self.x_resolution < self.n_control:
            raise ValueError(f"x_resolution ({self.x_resolution}) must be >= n_control ({self.n_control})")
        if not 1 <= self.elite < self.population:
            raise ValueError(f"need 1 <= elite < population, got elite={self.elite}, population={self.population}")
        if self.tournament < 1:
            raise ValueError("tournament size must be >= 1")
        if self.max_y_step < 1 or self.max_x_step < 1:
            raise ValueError("max_y_step and max_x_step must be >= 1")
        if not (0 <= self.crossover_rate <= 1 and 0 <= self.mutation_rate <= 1):
            raise ValueError("crossover_rate and mutation_rate must be in [0, 1]")
        self._check_breeding()

    def _check_breeding(self) -> None:
        if self.breeding not in BREEDINGS:
            raise ValueError(f"unknown breeding {self.breeding!r}; choose one of {', '.join(BREEDINGS)}")
        if self.breeding == "tournament":
            return
        if self.extra_grids:
            raise ValueError("breeding 'truncation' searches one curve (no joint target)")
        if self.mutations < 0 or self.crossovers < 0 or self.mutations + self.crossovers < 1:
            raise ValueError(f"breeding 'truncation' needs mutations + crossovers >= 1, got {self.mutations} "
                             f"and {self.crossovers}")
        if self.crossovers and self.elite < 2:
            raise ValueError("crossovers need elite >= 2 parents")
        if self.start_y is not None and not np.isclose(self.grid, self.start_y).any():
            raise ValueError(f"start_y {self.start_y} is not on the factor grid {list(self.grid)}")

    @property
    def one_index(self) -> int:
        """Grid index of the factor closest to 1.0."""
        return int(np.abs(np.asarray(self.grid) - 1.0).argmin())

    @property
    def n_curves(self) -> int:
        """Curves in one genome (1, or more for a joint search)."""
        return 1 + len(self.extra_grids)

    def curve_config(self, k: int) -> "GAConfig":
        """The one-curve settings of curve ``k`` (its own grid, every other setting shared)."""
        return replace(self, grid=(self.grid, *self.extra_grids)[k], extra_grids=())

    def to_dict(self) -> dict:
        d = asdict(self)
        d["grid"] = list(self.grid)
        if self.extra_grids:
            d["extra_grids"] = [list(g) for g in self.extra_grids]
        else:  # a one-curve search records what it always recorded (older run folders resume)
            del d["extra_grids"]
        for key, default in BREEDING_DEFAULTS.items():  # likewise a tournament search
            if d[key] == default:
                del d[key]
        return d


def split_genome(g: Genome, cfg: GAConfig) -> list[Genome]:
    """The one-curve genomes of a (joint) genome, in curve order."""
    nx, ny = cfg.n_control - 2, cfg.n_control
    return [Genome(g.x[k * nx:(k + 1) * nx], g.y[k * ny:(k + 1) * ny]) for k in range(cfg.n_curves)]


def join_genomes(parts: Sequence[Genome]) -> Genome:
    """One genome of several one-curve genomes (the inverse of :func:`split_genome`)."""
    return Genome(tuple(i for p in parts for i in p.x), tuple(j for p in parts for j in p.y))


def _per_curve(fn, g: Genome, cfg: GAConfig) -> list:
    return [fn(p, cfg.curve_config(k)) for k, p in enumerate(split_genome(g, cfg))]


def genome_points(g: Genome, cfg: GAConfig) -> list:
    """Control points ``[[x, y], ...]`` of a genome; of a joint genome, one such list per curve."""
    if cfg.n_curves > 1:
        return _per_curve(genome_points, g, cfg)
    xs = [0.0] + [i / cfg.x_resolution for i in g.x] + [1.0]
    return [[x, cfg.grid[j]] for x, j in zip(xs, g.y)]


def genome_factors(g: Genome, cfg: GAConfig, num_layers: int) -> np.ndarray:
    """Per-layer factors of a genome for a model with ``num_layers`` layers; of a joint genome, each
    curve's ``num_layers`` values one after the other (``n_curves * num_layers``)."""
    if cfg.n_curves > 1:
        return np.concatenate(_per_curve(lambda p, c: genome_factors(p, c, num_layers), g, cfg))
    return curve_factors(cfg.curve, genome_points(g, cfg), num_layers,
                         round_to_grid=cfg.grid if cfg.round_to_grid else None)


def repair_x(xs: Sequence[int], resolution: int) -> tuple[int, ...]:
    """Sort, clip to ``[1, resolution - 1]`` and push apart into a strictly increasing tuple."""
    v = sorted(int(min(max(i, 1), resolution - 1)) for i in xs)
    n = len(v)
    for i in range(1, n):
        v[i] = max(v[i], v[i - 1] + 1)
    for i in range(n - 1, -1, -1):
        hi = resolution - 1 - (n - 1 - i)
        v[i] = min(v[i], hi if i == n - 1 else min(hi, v[i + 1] - 1))
    return tuple(v)


def _clip_y(ys: Sequence[int], cfg: GAConfig) -> tuple[int, ...]:
    return tuple(int(min(max(j, 0), len(cfg.grid) - 1)) for j in ys)


def identity_genome(cfg: GAConfig) -> Genome:
    if cfg.n_curves > 1:
        return join_genomes([identity_genome(cfg.curve_config(k)) for k in range(cfg.n_curves)])
    n_in = cfg.n_control - 2
    xs = repair_x([round((k + 1) * cfg.x_resolution / (cfg.n_control - 1)) for k in range(n_in)], cfg.x_resolution)
    return Genome(xs, (cfg.one_index,) * cfg.n_control)


def random_genome(rng: np.random.Generator, cfg: GAConfig) -> Genome:
    if cfg.n_curves > 1:
        return join_genomes([random_genome(rng, cfg.curve_config(k)) for k in range(cfg.n_curves)])
    n_in = cfg.n_control - 2
    xs = tuple(sorted(int(i) + 1 for i in rng.choice(cfg.x_resolution - 1, size=n_in, replace=False)))
    ys = cfg.one_index + rng.integers(-cfg.init_y_spread, cfg.init_y_spread + 1, size=cfg.n_control)
    return Genome(repair_x(xs, cfg.x_resolution), _clip_y(ys, cfg))


def _step(rng: np.random.Generator, max_step: int) -> int:
    return int(rng.integers(1, max_step + 1)) * (1 if rng.random() < 0.5 else -1)


def mutate(g: Genome, rng: np.random.Generator, cfg: GAConfig, *, force: bool = False) -> Genome:
    """Move genes by bounded steps (see module docstring); ``force`` changes at least one gene."""
    if cfg.n_curves > 1:
        return _mutate_joint(g, rng, cfg, force)
    for _ in range(50):
        ys = list(g.y)
        xs = list(g.x)
        for k in range(len(ys)):
            if rng.random() < cfg.mutation_rate:
                ys[k] += _step(rng, cfg.max_y_step)
        for k in range(len(xs)):
            if rng.random() < cfg.mutation_rate:
                xs[k] += _step(rng, cfg.max_x_step)
        if force and xs == list(g.x) and ys == list(g.y):
            k = int(rng.integers(len(ys)))  # guarantee a move even at probability 0
            ys[k] += _step(rng, cfg.max_y_step)
        child = Genome(repair_x(xs, cfg.x_resolution), _clip_y(ys, cfg))
        if not force or child != g:
            return child
    return child


def _mutate_joint(g: Genome, rng: np.random.Generator, cfg: GAConfig, force: bool) -> Genome:
    parts = [mutate(p, rng, cfg.curve_config(k)) for k, p in enumerate(split_genome(g, cfg))]
    if force and join_genomes(parts) == g:  # nothing moved: force a move in one curve
        k = int(rng.integers(cfg.n_curves))
        parts[k] = mutate(parts[k], rng, cfg.curve_config(k), force=True)
    return join_genomes(parts)


def crossover(a: Genome, b: Genome, rng: np.random.Generator, cfg: GAConfig) -> Genome:
    """Uniform crossover per control point (x and y of a point come from the same parent)."""
    if cfg.n_curves > 1:
        pairs = zip(split_genome(a, cfg), split_genome(b, cfg))
        return join_genomes([crossover(pa, pb, rng, cfg.curve_config(k)) for k, (pa, pb) in enumerate(pairs)])
    take_b = rng.random(cfg.n_control) < 0.5
    ys = [b.y[k] if take_b[k] else a.y[k] for k in range(cfg.n_control)]
    xs = [b.x[k] if take_b[k + 1] else a.x[k] for k in range(cfg.n_control - 2)]
    return Genome(repair_x(xs, cfg.x_resolution), _clip_y(ys, cfg))


@dataclass
class GeneticAlgorithm:
    """Ask/tell GA; ``rng`` is the only source of randomness."""

    cfg: GAConfig
    rng: np.random.Generator
    population: list[Genome] = field(default_factory=list)
    generation: int = 0

    def __post_init__(self) -> None:
        if not self.population:
            self.population = self._initial()

    def _initial(self) -> list[Genome]:
        pop: list[Genome] = [identity_genome(self.cfg)] if self.cfg.include_identity else []
        tries = 0
        while len(pop) < self.cfg.population:
            g = random_genome(self.rng, self.cfg)
            tries += 1
            if g not in pop or tries > 100 * self.cfg.population:
                pop.append(g)
        return pop

    def ask(self) -> list[Genome]:
        """The current generation's population (the elite of the previous one comes first)."""
        return list(self.population)

    def _tournament(self, ranked_fitness: list[Any]) -> int:
        idx = self.rng.integers(len(ranked_fitness), size=self.cfg.tournament)
        return int(min(idx))  # ranked best-first: the lowest index is the fittest contestant

    def tell(self, fitness: Mapping[Genome, Any]) -> list[Genome]:
        """Rank the current population by ``fitness`` and breed the next one; returns it."""
        unique = distinct_scored(self.population, fitness)
        ranked = sorted(unique, key=lambda g: fitness[g], reverse=True)  # stable: ties keep population order
        nxt = ranked[: self.cfg.elite]
        fits = [fitness[g] for g in ranked]
        while len(nxt) < self.cfg.population:
            a = ranked[self._tournament(fits)]
            b = ranked[self._tournament(fits)]
            child = crossover(a, b, self.rng, self.cfg) if self.rng.random() < self.cfg.crossover_rate else a
            child = mutate(child, self.rng, self.cfg)
            for _ in range(20):
                if child not in nxt:
                    break
                child = mutate(child, self.rng, self.cfg, force=True)
            nxt.append(child)
        self.population = nxt
        self.generation += 1
        return list(nxt)

    def state_dict(self) -> dict:
        return {"generation": self.generation, "population": [g.to_list() for g in self.population],
                "rng": self.rng.bit_generator.state, "config": self.cfg.to_dict()}

    @classmethod
    def from_state(cls, state: dict, cfg: GAConfig | None = None) -> "GeneticAlgorithm":
        cfg = cfg or GAConfig(**state["config"])
        pop = [Genome.from_list(v) for v in state["population"]]
        return cls(cfg, restored_rng(state), pop, int(state["generation"]))


def distinct_scored(population: Sequence[Genome], fitness: Mapping[Genome, Any]) -> list[Genome]:
    """The population's distinct genomes in order; a ``ValueError`` when ``fitness`` lacks one (either GA's
    ``tell``)."""
    missing = [g for g in population if g not in fitness]
    if missing:
        raise ValueError(f"tell() got no fitness for {len(missing)} genome(s) of the population, e.g. {missing[0]}")
    return list(dict.fromkeys(population))


def restored_rng(state: dict) -> np.random.Generator:
    """The generator a GA's ``state_dict()`` recorded, continuing exactly where it was."""
    rng = np.random.default_rng()
    rng.bit_generator.state = state["rng"]
    return rng
