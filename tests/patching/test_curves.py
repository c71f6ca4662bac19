"""Layer -> factor curves."""
from __future__ import annotations

import numpy as np
import pytest

from posbias.patching.curves import (
    DEFAULT_GRID,
    bezier_factors,
    check_control_points,
    curve_factors,
    layer_depths,
    snap_to_grid,
)

PTS = [[0.0, 1.0], [0.3, 1.3], [0.7, 0.6], [1.0, 0.9]]


@pytest.mark.parametrize("kind", ["bezier", "linear", "step"])
def test_endpoints_are_first_and_last_control_y(kind):
    f = curve_factors(kind, PTS, 30)
    assert f[0] == pytest.approx(1.0) and f[-1] == pytest.approx(0.9)
    assert f.shape == (30,)


def test_bezier_matches_parametric_curve():
    """Points (x(t), y(t)) of the Bézier curve are reproduced when evaluated at x(t)."""
    from math import comb

    p = np.array(PTS)
    for t in np.linspace(0, 1, 11):
        b = np.array([comb(3, k) * t ** k * (1 - t) ** (3 - k) for k in range(4)])
        x, y = b @ p[:, 0], b @ p[:, 1]
        assert bezier_factors(p, np.array([x]))[0] == pytest.approx(y, abs=1e-9)


def test_bezier_with_collinear_points_is_linear():
    pts = [[0.0, 1.0], [1 / 3, 1.1], [2 / 3, 1.2], [1.0, 1.3]]
    np.testing.assert_allclose(curve_factors("bezier", pts, 7), np.linspace(1.0, 1.3, 7), atol=1e-9)


def test_bezier_respects_monotone_x_even_when_points_cluster():
    pts = [[0.0, 0.5], [0.05, 1.5], [0.1, 0.5], [1.0, 1.0]]
    f = curve_factors("bezier", pts, 200)
    assert np.all(np.isfinite(f)) and f.min() >= 0.5 - 1e-9 and f.max() <= 1.5 + 1e-9


def test_linear_and_step_exact_values():
    pts = [[0.0, 1.0], [0.5, 2.0], [1.0, 0.5]]
    np.testing.assert_allclose(curve_factors("linear", pts, 5), [1.0, 1.5, 2.0, 1.25, 0.5])
    # step: nearest control point, halfway goes to the later one (depths 0, .25, .5, .75, 1)
    np.testing.assert_allclose(curve_factors("step", pts, 5), [1.0, 2.0, 2.0, 0.5, 0.5])


@pytest.mark.parametrize("kind", ["bezier", "linear", "step"])
def test_constant_curve_is_exactly_constant(kind):
    pts = [[0.0, 1.0], [0.35, 1.0], [0.65, 1.0], [1.0, 1.0]]
    assert curve_factors(kind, pts, 30).tolist() == [1.0] * 30


def test_curve_applies_to_any_layer_count():
    for n in (1, 2, 12, 30, 64):
        f = curve_factors("bezier", PTS, n)
        assert len(f) == n and f[0] == pytest.approx(1.0)
    assert layer_depths(1).tolist() == [0.0]
    # same depth in two models -> same factor (layer 15 of 31 and layer 30 of 61 sit at 0.5)
    assert curve_factors("bezier", PTS, 31)[15] == pytest.approx(curve_factors("bezier", PTS, 61)[30])


def test_rounding_to_grid():
    f = curve_factors("bezier", PTS, 20, round_to_grid=DEFAULT_GRID)
    assert set(f.tolist()) <= set(DEFAULT_GRID)
    assert snap_to_grid([0.97, 1.01, 1.04, 9.0, 0.1], DEFAULT_GRID).tolist() == [0.95, 1.0, 1.05, 1.5, 0.5]


def test_default_grid_brackets_one_finely():
    g = np.array(DEFAULT_GRID)
    assert 1.0 in g and g.min() < 1 < g.max()
    i = int(np.where(g == 1.0)[0][0])
    assert g[i + 1] - g[i] <= 0.05 + 1e-9 and g[i] - g[i - 1] <= 0.05 + 1e-9


@pytest.mark.parametrize("bad, msg", [
    ([[0.1, 1.0], [1.0, 1.0]], "first control x must be 0"),
    ([[0.0, 1.0], [0.9, 1.0]], "last 1"),
    ([[0.0, 1.0], [0.6, 1.0], [0.4, 1.0], [1.0, 1.0]], "strictly increasing"),
    ([[0.0, 1.0], [1.0, 0.0]], "must be > 0"),
    ([[0.0, 1.0]], "at least 2 pairs"),
])
def test_bad_control_points(bad, msg):
    with pytest.raises(ValueError, match=msg):
        check_control_points(bad)


def test_unknown_kind():
    with pytest.raises(ValueError, match="unknown curve kind"):
        curve_factors("spline", PTS, 4)
