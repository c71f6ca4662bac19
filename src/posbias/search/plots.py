"""Plots of a search: the found factors per layer (with the curve's control points) and the fitness
per generation; written atomically by :func:`posbias.utils.figures.save_figure`."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from posbias.utils.figures import pyplot, save_figure

__all__ = ["plot_factors", "plot_fitness"]


def plot_factors(path: str | Path, factors: Sequence[float], points: Sequence[Sequence[float]] | None = None,
                 title: str = "LPES factors", ylabel: str = "RoPE interpolation factor s_l",
                 per_layer: str = "factor per layer") -> None:
    """Per-layer values (RoPE factors, or temperatures with their own ``ylabel`` / ``per_layer`` label)."""
    n = len(factors)
    fig, ax = pyplot().subplots(figsize=(6, 3.5))
    ax.plot(range(n), factors, "o-", ms=3, label=per_layer)
    if points:
        ax.plot([p[0] * (n - 1) for p in points], [p[1] for p in points], "s--", color="tab:red", alpha=0.6,
                label="control points")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("decoder layer")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def plot_fitness(path: str | Path, history: Sequence[dict]) -> None:
    """Best and population-mean objective per generation (accuracy for searches logged without it)."""
    gens = [h["generation"] for h in history]
    objective = history[-1].get("objective", "accuracy") if history else "accuracy"
    best = [h.get("best_value", h["best_accuracy"]) for h in history]
    mean = [h.get("mean_value", h["mean_accuracy"]) for h in history]
    fig, ax = pyplot().subplots(figsize=(6, 3.5))
    ax.plot(gens, best, "o-", label="best")
    ax.plot(gens, mean, "o--", label="population mean")
    ax.set_xlabel("generation")
    ax.set_ylabel("fitness (weighted accuracy)" if objective == "accuracy"
                  else "fitness (depth-weighted gold log-prob per token)")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
