"""Accuracy-against-depth plots (matplotlib, Agg backend, PNG files)."""
from __future__ import annotations

import re
from pathlib import Path

from posbias.utils.figures import pyplot, save_figure

# Above this many curves the accuracy panel draws only the first curve's interval band (the paired
# panel carries every method's interval against it), so the lines stay readable.
MAX_BANDS = 3


def plot_accuracy_by_depth(curves: dict[str, list[dict]], path: str | Path, title: str = "",
                           paired: dict[str, list[dict]] | None = None) -> Path:
    """Accuracy (%) against gold depth, one line per curve, with 95% Wilson intervals as bands.

    Args:
        curves: label -> rows from :func:`posbias.evaluation.stats.accuracy_by_depth`; the first curve
            is the reference.
        paired: optional label -> rows ``{"depth", "diff", "ci_low", "ci_high"}`` (fractions; the paired
            difference to the first curve on the same instances, :func:`posbias.evaluation.compare.paired_by_depth`).
            Given, a second panel plots them as points with 95% error bars, one offset per method.
    """

    drawn = {label: rows for label, rows in curves.items() if rows}
    two = bool(paired)
    fig, axes = pyplot().subplots(1, 2 if two else 1, figsize=(11 if two else 6, 4), squeeze=False)
    colors = _colors(pyplot(), list(drawn))
    _accuracy_panel(axes[0][0], drawn, colors)
    if two:
        _paired_panel(axes[0][1], paired, colors, reference=next(iter(drawn), ""))
    if title:
        fig.suptitle(title)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2 if two else 1, fontsize=8,
               frameon=False)
    fig.tight_layout()
    return save_figure(fig, path)


def short_label(label: str) -> str:
    """A method label for a legend: an option value naming a file becomes the file's stem
    (``lpes@factors=docs/results/a_factors.json`` -> ``lpes@factors=a_factors``)."""
    return re.sub(r"=([^@=]*[/\\])?([^@=/\\]+?)\.(json|safetensors)(?=@|$)", r"=\2", label)


def _colors(plt, labels: list[str]) -> dict[str, object]:
    cycle = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20").colors
    return {label: cycle[i % len(cycle)] for i, label in enumerate(labels)}


def _accuracy_panel(ax, curves: dict[str, list[dict]], colors: dict) -> None:
    for i, (label, rows) in enumerate(curves.items()):
        x = [r["depth"] for r in rows]
        ax.plot(x, [100 * r["accuracy"] for r in rows], marker="o", color=colors[label], label=short_label(label))
        if len(curves) <= MAX_BANDS or i == 0:
            ax.fill_between(x, [100 * r["ci_low"] for r in rows], [100 * r["ci_high"] for r in rows],
                            color=colors[label], alpha=0.15)
    ax.set_xlabel("relative depth of the gold item (0 = beginning, 1 = end)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-2, 102)
    ax.set_xlim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    if len(curves) > MAX_BANDS:
        ax.set_title(f"band: 95% interval of {short_label(next(iter(curves)))}", fontsize=8)


def _paired_panel(ax, paired: dict[str, list[dict]], colors: dict, reference: str) -> None:
    width = 0.12 / max(1, len(paired))
    for i, (label, rows) in enumerate(paired.items()):
        x = [r["depth"] + (i - (len(paired) - 1) / 2) * width for r in rows]
        y = [100 * r["diff"] for r in rows]
        err = [[100 * (r["diff"] - r["ci_low"]) for r in rows], [100 * (r["ci_high"] - r["diff"]) for r in rows]]
        ax.errorbar(x, y, yerr=err, fmt="o", ms=4, capsize=2, color=colors.get(label))
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("relative depth of the gold item")
    ax.set_ylabel(f"accuracy - {short_label(reference)} (points)")
    ax.set_title("paired difference on the same instances, 95% interval", fontsize=8)
    ax.set_xlim(-0.1, 1.1)
    ax.grid(alpha=0.3)
