"""Accuracy-against-depth plots (matplotlib, Agg backend, PNG files)."""
from __future__ import annotations

from pathlib import Path


def plot_accuracy_by_depth(curves: dict[str, list[dict]], path: str | Path, title: str = "") -> Path:
    """One line per curve: accuracy (%) against gold depth with 95% Wilson intervals as bands.

    Args:
        curves: label -> rows from :func:`posbias.evaluation.stats.accuracy_by_depth`.
    """
    from posbias.utils.figures import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(6, 4))
    for label, rows in curves.items():
        if not rows:
            continue
        x = [r["depth"] for r in rows]
        ax.plot(x, [100 * r["accuracy"] for r in rows], marker="o", label=label)
        ax.fill_between(x, [100 * r["ci_low"] for r in rows], [100 * r["ci_high"] for r in rows], alpha=0.15)
    ax.set_xlabel("relative depth of the gold item (0 = beginning, 1 = end)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-2, 102)
    ax.set_xlim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
