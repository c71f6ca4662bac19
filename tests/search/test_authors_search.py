"""LPES as its authors ran it: their curve mapping, their GA (truncation breeding) and ``--preset authors``."""
from __future__ import annotations

import dataclasses
import gzip
import json
from math import comb

import numpy as np
import pytest
from conftest import save_tiny_folder

from posbias.patching.curves import curve_factors
from posbias.search.config import AUTHORS_GRID, SearchConfig, resolved_search_settings
from posbias.search.evaluators import SerialEvaluator
from posbias.search.fitness import SyntheticFitness
from posbias.search.ga import GAConfig, Genome, genome_factors
from posbias.search.loop import run_ga
from posbias.search.truncation_ga import TruncationGA, point_crossover, start_genome, window_mutation

AUTHORS = dict(grid=tuple(AUTHORS_GRID), curve="bezier-t", population=32, elite=16, breeding="truncation",
               mutations=16, crossovers=16, mutation_rate=0.3, crossover_rate=0.3, max_y_step=4, start_y=1.5)


def reference_bezier_y(ys: list[float], num_layers: int) -> list[float]:
    """The reference's ``Bezier(linspace(0, 1, L), points)[:, 1]``: sum_i C(n, i) (1 - t)^i t^(n - i) y_i."""
    n = len(ys) - 1
    ts = np.linspace(0, 1, num_layers)
    return [sum(comb(n, i) * (1 - t) ** i * t ** (n - i) * y for i, y in enumerate(ys)) for t in ts]


def test_bezier_t_is_the_reference_mapping_and_ignores_x():
    ys = [1.2, 2.0, 1.05, 1.7]
    points = [[0.0, ys[0]], [0.3, ys[1]], [0.6, ys[2]], [1.0, ys[3]]]
    got = curve_factors("bezier-t", points, 24)
    assert got == pytest.approx(reference_bezier_y(ys, 24), abs=1e-12)
    assert got[0] == pytest.approx(1.7) and got[-1] == pytest.approx(1.2)  # layer 0 takes the last point
    moved = [[0.0, ys[0]], [0.1, ys[1]], [0.9, ys[2]], [1.0, ys[3]]]
    assert list(curve_factors("bezier-t", moved, 24)) == list(got)
    assert list(curve_factors("bezier-t", [[0, 1.0], [0.5, 1.0], [1, 1.0]], 5)) == [1.0] * 5


def test_the_first_population_is_the_start_and_its_new_mutants_within_the_window():
    cfg = GAConfig(**AUTHORS)
    ga = TruncationGA(cfg, np.random.default_rng(0))
    pop = ga.ask()
    start = start_genome(cfg)
    assert pop[0] == start and [cfg.grid[j] for j in start.y] == [1.5] * 4
    assert len(pop) == 32 and len(set(pop)) == 32 and set(pop) <= ga.seen
    assert all(g.x == start.x for g in pop)  # bezier-t: x never reaches the factors, so it does not move
    five = AUTHORS_GRID.index(1.5)
    assert all(five - 4 * 4 <= j <= five + 3 * 4 for g in pop for j in g.y)  # a few +-0.2 redraws at most
    one_step = window_mutation(start, np.random.default_rng(3), cfg, {start})
    assert one_step != start and all(1.3 - 1e-9 <= cfg.grid[j] <= 1.65 + 1e-9 for j in one_step.y)


def test_window_mutation_never_leaves_the_grid_nor_draws_its_top():
    cfg = GAConfig(**AUTHORS)
    rng = np.random.default_rng(1)
    g = Genome(start_genome(cfg).x, (0, 29, 30, 15))
    for _ in range(300):
        m = window_mutation(g, rng, cfg, {g})
        assert all(0 <= j <= 30 for j in m.y) and (m.y[1] <= 29 and m.y[2] in (26, 27, 28, 29, 30))
        assert m.y[2] == 30 or m.y[2] < 30  # the top value stays only where it was


def test_crossover_takes_points_of_the_second_parent_and_is_new():
    cfg = GAConfig(**AUTHORS)
    rng = np.random.default_rng(2)
    a = Genome(start_genome(cfg).x, (10, 10, 10, 10))
    b = Genome(start_genome(cfg).x, (4, 12, 20, 8))
    for _ in range(100):
        c = point_crossover(a, b, rng, cfg, {a, b})
        assert c is not None and c not in (a, b) and all(cy in (ay, by) for cy, ay, by in zip(c.y, a.y, b.y))
    assert point_crossover(a, a, rng, cfg, {a}) is None


def test_tell_keeps_the_best_parents_and_breeds_new_children():
    cfg = GAConfig(**AUTHORS)
    ga = TruncationGA(cfg, np.random.default_rng(0))
    pop = ga.ask()
    fitness = {g: (float(-abs(sum(g.y) - 30)), 0.0) for g in pop}
    best = sorted(pop, key=lambda g: fitness[g], reverse=True)[:16]
    before = set(ga.seen)
    nxt = ga.tell(fitness)
    assert nxt[:16] == best and len(nxt) == 48 and not set(nxt[16:]) & before and len(set(nxt)) == 48
    with pytest.raises(ValueError, match="no fitness"):
        ga.tell({})


def test_config_checks_and_old_checkpoints_compare_equal():
    assert "breeding" not in GAConfig().to_dict() and "start_y" not in GAConfig().to_dict()
    assert GAConfig(**AUTHORS).to_dict()["breeding"] == "truncation"
    with pytest.raises(ValueError, match="mutations \\+ crossovers >= 1"):
        GAConfig(**{**AUTHORS, "mutations": 0, "crossovers": 0})
    with pytest.raises(ValueError, match="not on the factor grid"):
        GAConfig(**{**AUTHORS, "start_y": 1.52})
    with pytest.raises(ValueError, match="unknown breeding"):
        GAConfig(breeding="roulette")


def _objective(factors):
    return -sum((f - 1.3) ** 2 for f in factors)


def test_same_seed_same_search_and_a_killed_search_resumes_exactly(tmp_path):
    cfg = GAConfig(**{**AUTHORS, "population": 8, "elite": 4, "mutations": 4, "crossovers": 4})

    def run(out, generations, resume=False):
        return run_ga(SerialEvaluator(SyntheticFitness(_objective)), cfg, num_layers=12, generations=generations,
                      seed=5, out=out, resume=resume)

    whole = run(tmp_path / "a", 4)
    assert run(tmp_path / "b", 4).best == whole.best
    run(tmp_path / "c", 2)
    resumed = run(tmp_path / "c", 4, resume=True)
    assert resumed.best == whole.best and resumed.history[-1]["individuals"] == whole.history[-1]["individuals"]
    state = json.loads((tmp_path / "c" / "checkpoint.json").read_text())["ga"]
    assert state["config"]["breeding"] == "truncation" and len(state["seen"]) >= 8 + 3 * 8
    best = genome_factors(whole.best, cfg, 12)
    assert all(1.0 <= f <= 2.5 for f in best)  # the authors' factors only compress positions


def test_the_authors_preset_sets_the_search_and_a_given_value_wins():
    authors = resolved_search_settings(SearchConfig(preset="authors"))
    assert authors == {"curve": "bezier-t", "grid": AUTHORS_GRID, "depths": [1.0], "objective": "greedy"}
    assert AUTHORS_GRID[0] == 1.0 and AUTHORS_GRID[-1] == 2.5 and len(AUTHORS_GRID) == 31
    mine = resolved_search_settings(SearchConfig(preset="authors", objective="logprob", depths=[0.0, 1.0]))
    assert mine["objective"] == "logprob" and mine["depths"] == [0.0, 1.0] and mine["curve"] == "bezier-t"
    quick = resolved_search_settings(SearchConfig(preset="quick"))
    assert quick == {"curve": "bezier", "grid": None, "depths": [0.0, 0.5, 1.0], "objective": "logprob"}


def test_an_authors_search_runs_on_mdqa_with_the_gold_last_and_greedy_answers(tmp_path):
    from posbias.search.runner import run_search

    src = save_tiny_folder(tmp_path / "tiny", "qwen2", layers=4)
    data = tmp_path / "nq-open-oracle.jsonl.gz"
    with gzip.open(data, "wt", encoding="utf-8") as f:
        for i in range(16):
            f.write(json.dumps({"question": f"question {i}?", "answers": [f"Answer{i}"],
                                "ctxs": [{"title": f"T{i}", "text": f"The answer is Answer{i}.", "hasanswer": True,
                                          "isgold": True}]}) + "\n")
    cfg = SearchConfig(out=str(tmp_path / "s"), model=src, task="mdqa",
                       task_options={"num_docs": 3, "path": str(data)},
                       preset="authors", heldout_n=0,
                       overrides={"population": 4, "elite": 2, "mutations": 2, "crossovers": 2, "generations": 2,
                                  "n_per_depth": 2, "batch_size": 2})
    res = run_search(cfg)
    config = json.loads((tmp_path / "s" / "config.json").read_text())["config"]
    assert config["curve"] == "bezier-t" and config["objective"] == "greedy" and config["depths"] == [1.0]
    assert config["ga"]["breeding"] == "truncation" and config["ga"]["grid"] == AUTHORS_GRID
    assert res.objective == "greedy" and set(res.per_depth) == {"1"} and len(res.factors) == 4
    assert all(1.0 <= f <= 2.5 for f in res.factors)
    first = json.loads((tmp_path / "s" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["unique"] == 4 and first["scored"] == 4
    second = json.loads((tmp_path / "s" / "metrics.jsonl").read_text().splitlines()[1])
    assert second["unique"] == 6 and second["memo_hits"] == 2  # the two parents carried over, not rescored
    with pytest.raises(ValueError, match="depths: \\[1.0\\] -> \\[0.0, 1.0\\]"):  # other depths: another fitness
        run_search(dataclasses.replace(cfg, depths=[0.0, 1.0]), resume=True)
