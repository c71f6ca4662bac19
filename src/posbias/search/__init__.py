"""LPES search: layer->factor curves, a curve-constrained genetic algorithm, its fitness and runner."""
from posbias.search.curves import CURVE_KINDS, DEFAULT_GRID, curve_factors

__all__ = ["CURVE_KINDS", "DEFAULT_GRID", "curve_factors"]
