"""LPES search: layer->factor curves, a curve-constrained genetic algorithm, its fitness and runner.

    from posbias.search import SearchConfig, run_search
    res = run_search(SearchConfig(out="runs/s", model="smollm2-135m", task="kv", preset="quick"))
    res.factors_path  # a factors file for posbias.patching.apply_factors_file / `posbias apply`
"""
from posbias.patching.curves import CURVE_KINDS, DEFAULT_GRID, curve_factors
from posbias.search.config import SearchConfig
from posbias.search.fitness import FitnessResult, SyntheticFitness, TeacherForcedFitness
from posbias.search.ga import GAConfig, GeneticAlgorithm, Genome
from posbias.search.runner import PRESETS, GAResult, SearchResult, run_ga, run_search

__all__ = ["CURVE_KINDS", "DEFAULT_GRID", "curve_factors", "FitnessResult", "SyntheticFitness",
           "TeacherForcedFitness", "GAConfig", "GeneticAlgorithm", "Genome", "PRESETS", "GAResult",
           "SearchConfig", "SearchResult", "run_ga", "run_search"]
