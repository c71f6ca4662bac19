"""Layer -> factor curves through a few control points (the LPES search space).

Control points ``P_k = (x_k, y_k)``, ``k = 0..C-1``: ``x`` is normalised depth (layer
``l`` of ``L`` sits at ``l / (L - 1)``), ``x_0 = 0`` and ``x_{C-1} = 1`` are fixed and the interior
``x`` strictly increase; ``y`` is a RoPE interpolation factor (usually from a discrete grid).

Curve kinds:

* ``bezier``: the Bézier curve of degree ``C - 1`` with these control points. Layer ``l``'s factor is
  ``y(t)`` where ``x(t) = l / (L - 1)``; ``x(t)`` is monotone because the control ``x`` increase (its
  derivative is a Bézier curve of the positive differences), so ``t`` is found by bisection.
  The curve passes through the first and last control point only.
* ``bezier-t``: the mapping of the LPES authors' code (``zhenghuawang6/middle_rope``,
  ``evaluate_layerwise.py``): the Bézier curve's ``y`` at evenly spaced ``t = l / (L - 1)``, the control
  ``x`` ignored, and the basis written as ``C(n, i) (1 - t)^i t^(n - i) P_i``, so layer 0 takes the *last*
  control point's ``y`` and the last layer the first's (the ``bezier`` kind reversed, evaluated in ``t``).
* ``linear``: piecewise linear through all control points.
* ``step``: piecewise constant; each layer takes the ``y`` of the control point nearest in ``x``
  (a layer exactly halfway between two points takes the later one).

Because ``x`` is normalised depth, one curve applies to models with any number of layers.

Default factor grid (:data:`DEFAULT_GRID`): values below and above 1 with fine steps near 1.
Measured on SmolLM2-135M (word KV, 30 keys): a uniform factor 1.2 destroys most accuracy and 1.5
all of it, 1.05-1.1 barely change it, 0.9 leaves it unchanged, and factors below 1 in late layers
helped the end positions; hence 0.5..1.5 with 0.02-0.05 steps around 1.
"""
from __future__ import annotations

from math import comb
from typing import Sequence

import numpy as np

DEFAULT_GRID: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0,
                                   1.02, 1.05, 1.1, 1.15, 1.2, 1.3, 1.5)
CURVE_KINDS = ("bezier", "bezier-t", "linear", "step")
X_FREE_CURVES = ("bezier-t",)  # curves whose factors do not depend on the control x

__all__ = ["DEFAULT_GRID", "CURVE_KINDS", "X_FREE_CURVES", "bezier_t_factors",
           "check_control_points", "layer_depths", "bezier_factors",
           "curve_factors", "round_to_grid", "snap_to_grid", "check_grid"]


def check_grid(grid: Sequence[float]) -> tuple[float, ...]:
    g = tuple(float(v) for v in grid)
    if len(g) < 2:
        raise ValueError(f"the factor grid needs at least 2 values, got {list(g)}")
    if any(not np.isfinite(v) or v <= 0 for v in g):
        raise ValueError(f"every grid value must be a finite factor > 0, got {list(g)}")
    if any(b <= a for a, b in zip(g, g[1:])):
        raise ValueError(f"the factor grid must be strictly increasing, got {list(g)}")
    return g


def check_control_points(points) -> np.ndarray:
    """Validate control points; return them as a ``(C, 2)`` float array."""
    try:
        p = np.asarray(points, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"control points must be [[x, y], ...], got {points!r}") from None
    if p.ndim != 2 or p.shape[1] != 2 or p.shape[0] < 2:
        raise ValueError(f"control points must be at least 2 pairs [[x, y], ...], got shape {p.shape}")
    if not np.all(np.isfinite(p)):
        raise ValueError("control points must be finite numbers")
    x, y = p[:, 0], p[:, 1]
    if x[0] != 0.0 or x[-1] != 1.0:
        raise ValueError(f"the first control x must be 0 and the last 1 (normalised depth), got {x[0]} and {x[-1]}")
    if np.any(np.diff(x) <= 0):
        raise ValueError(f"control x must be strictly increasing, got {x.tolist()}")
    if np.any(y <= 0):
        raise ValueError(f"control y (factors) must be > 0, got {y.tolist()}")
    return p


def layer_depths(num_layers: int) -> np.ndarray:
    """Normalised depth ``l / (L - 1)`` of each layer (a single layer sits at 0)."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if num_layers == 1:
        return np.zeros(1)
    return np.arange(num_layers) / (num_layers - 1)


def _bernstein(n: int, t: np.ndarray) -> np.ndarray:
    """``(len(t), n + 1)`` Bernstein basis of degree ``n``."""

    k = np.arange(n + 1)
    coef = np.array([comb(n, i) for i in k], dtype=float)
    t = t[:, None]
    return coef * t ** k * (1 - t) ** (n - k)


def bezier_factors(points, xs: np.ndarray, *, iters: int = 60) -> np.ndarray:
    """``y`` of the Bézier curve at abscissae ``xs`` (solving ``x(t) = xs`` by bisection)."""
    p = check_control_points(points)
    n = len(p) - 1
    xs = np.asarray(xs, dtype=float)
    lo, hi = np.zeros_like(xs), np.ones_like(xs)
    for _ in range(iters):  # x(t) is increasing in t
        mid = (lo + hi) / 2
        below = _bernstein(n, mid) @ p[:, 0] < xs
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    t = (lo + hi) / 2
    t = np.where(xs <= 0.0, 0.0, np.where(xs >= 1.0, 1.0, t))  # exact endpoints
    return _bernstein(n, t) @ p[:, 1]


def bezier_t_factors(points, num_layers: int) -> np.ndarray:
    """``y`` of the ``bezier-t`` curve (module docstring) at ``t = linspace(0, 1, num_layers)``: shape
    ``(num_layers,)``; layer 0 takes the last control point's ``y``."""
    p = check_control_points(points)
    t = np.linspace(0.0, 1.0, num_layers) if num_layers > 1 else np.zeros(1)
    return _bernstein(len(p) - 1, t) @ p[::-1, 1]


def snap_to_grid(values, grid: Sequence[float]) -> np.ndarray:
    """Snap each value to the nearest grid value (ties go to the smaller one)."""
    g = np.asarray(check_grid(grid))
    v = np.asarray(values, dtype=float)
    idx = np.abs(v[..., None] - g).argmin(axis=-1)
    return g[idx]


round_to_grid = snap_to_grid


def curve_factors(kind: str, control_points, num_layers: int,
                  round_to_grid: Sequence[float] | None = None) -> np.ndarray:
    """Per-layer factors of a curve for a model with ``num_layers`` decoder layers.

    Args:
        kind: ``"bezier"``, ``"bezier-t"``, ``"linear"`` or ``"step"``.
        control_points: ``[[x, y], ...]`` with ``x_0 = 0``, ``x_{C-1} = 1``, strictly increasing.
        round_to_grid: snap the factors to the nearest of these values.
    """
    p = check_control_points(control_points)
    xs = layer_depths(num_layers)
    if kind == "bezier":
        out = bezier_factors(p, xs)
    elif kind == "bezier-t":
        out = bezier_t_factors(p, num_layers)
    elif kind == "linear":
        out = np.interp(xs, p[:, 0], p[:, 1])
    elif kind == "step":
        mids = (p[:-1, 0] + p[1:, 0]) / 2
        out = p[np.searchsorted(mids, xs, side="right"), 1]
    else:
        raise ValueError(f"unknown curve kind {kind!r}; choose one of {', '.join(CURVE_KINDS)}")
    # drop float noise (a Bézier through y = 1 everywhere gives 0.9999999999999999): a factor of
    # exactly 1 leaves its layer untouched, so the identity curve must give exactly 1.0
    out = np.round(np.asarray(out, dtype=float), 12)
    if round_to_grid is not None:
        out = snap_to_grid(out, round_to_grid)
    return np.asarray(out, dtype=float)
