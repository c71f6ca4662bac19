"""The figures of a position-bias map (matplotlib, Agg, PNG via :func:`posbias.utils.figures.save_figure`).

* ``heatmap_<method>.png``: depth x length, accuracy and mean gold log-prob per token;
* ``diff_<method>.png``: each method after the first minus the first, cells whose paired 95%
  interval excludes 0 outlined (and starred);
* ``accuracy_by_depth.png``: accuracy against depth, one line per length, one panel per method;
* ``accuracy_by_distance.png``: accuracy against the tokens between the gold item and the question;
* ``failure_offsets.png`` (``--mode both``): where the items retrieved instead of the gold one sit.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import NullFormatter

from posbias.evaluation.attention_summary import plot_attention
from posbias.evaluation.compare import method_folder
from posbias.evaluation.plots import short_label
from posbias.utils.figures import pyplot, save_figure


def heatmap_path(cfg) -> Path:
    """The heatmap of a map's first method (the one a user looks at first)."""
    return Path(cfg.out) / f"heatmap_{method_folder(cfg.methods[0])}.png"


def plot_map(cfg, out: Path, summary: dict) -> list[Path]:
    """Every figure of the map into ``out``; returns their paths (the first: the first method's heatmap)."""
    paths = [plot_heatmaps(summary, out / f"heatmap_{method_folder(m)}.png", m) for m in summary["methods"]]
    paths += [plot_difference(summary, out / f"diff_{method_folder(m)}.png", m) for m in summary["cell_differences"]]
    paths.append(plot_depth_curves(summary, out / "accuracy_by_depth.png"))
    if summary.get("by_distance"):
        paths.append(plot_distance(summary, out / "accuracy_by_distance.png"))
    if summary.get("failures"):
        paths.append(plot_failure_offsets(summary, out / "failure_offsets.png"))
    for m, a in (summary.get("attention") or {}).items():
        paths.append(plot_attention(a["by_length"][str(a["longest"])], a["top1_by_layer"],
                                    out / f"attention_{method_folder(m)}.png",
                                    title=f"{short_label(m)} at {a['longest']} tokens: {subtitle(summary)}"))
    return paths


def subtitle(s: dict) -> str:
    """``model / task, n = N per cell``: what every map figure names."""
    return f"{s['model']} / {s['task']}, n = {s['n_per_cell']} per cell"


def _grid(s: dict, rows: list[dict], key: str) -> np.ndarray:
    """``(lengths, depths)`` array of ``key`` (NaN where a cell is missing)."""
    lengths = [x["tokens"] for x in s["lengths"]]
    depths = [round(float(d), 6) for d in s["depths"]]
    a = np.full((len(lengths), len(depths)), np.nan)
    for r in rows:
        if r["length"] in lengths and round(float(r["depth"]), 6) in depths and r.get(key) is not None:
            a[lengths.index(r["length"]), depths.index(round(float(r["depth"]), 6))] = r[key]
    return a


def _heat(ax, s: dict, values: np.ndarray, *, cmap: str, vmin: float, vmax: float, fmt: str, label: str):
    plt = pyplot()
    im = ax.imshow(values, origin="lower", aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax)
    for (i, j), v in np.ndenumerate(values):
        if not np.isnan(v):
            r, g, b, _ = im.cmap(im.norm(v))
            ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=7,
                    color="black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white")
    ax.set_xticks(range(len(s["depths"])), [f"{d:g}" for d in s["depths"]])
    ax.set_yticks(range(len(s["lengths"])), [str(x["tokens"]) for x in s["lengths"]])
    ax.set_xlabel("relative depth of the gold item (0 = beginning, 1 = end)")
    ax.set_ylabel("prompt length (tokens)")
    plt.colorbar(im, ax=ax, label=label, fraction=0.046, pad=0.03)
    return im


def plot_heatmaps(s: dict, path: Path, method: str) -> Path:
    """Accuracy (%) and mean gold log-prob per answer token, depth x length, for one method."""
    rows = [r for r in s["cells"] if r["method"] == method]
    fig, axes = pyplot().subplots(1, 2, figsize=(13, 0.5 * len(s["lengths"]) + 3))
    acc = 100 * _grid(s, rows, "accuracy")
    _heat(axes[0], s, acc, cmap="viridis", vmin=0, vmax=100, fmt=".0f", label="accuracy (%)")
    axes[0].set_title("teacher-forced accuracy (%)", fontsize=9)
    lp = _grid(s, rows, "logprob_per_token")
    low = float(np.nanmin(lp)) if np.isfinite(lp).any() else -1.0
    high = float(np.nanmax(lp)) if np.isfinite(lp).any() else 0.0
    _heat(axes[1], s, lp, cmap="magma", vmin=low, vmax=max(high, low + 0.1), fmt=".2f",
          label="gold log-prob per token (colour: this map's range)")
    axes[1].set_title("mean gold log-prob per answer token", fontsize=9)
    fig.suptitle(f"{short_label(method)}: {subtitle(s)}")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_difference(s: dict, path: Path, method: str) -> Path:
    """``method`` minus the first method per cell (points); cells whose paired 95% interval excludes 0
    are outlined and starred, the others greyed and hatched (a difference within their questions' noise)."""
    rows = s["cell_differences"][method]
    fig, ax = pyplot().subplots(figsize=(7.5, 0.5 * len(s["lengths"]) + 3))
    diff = 100 * _grid(s, rows, "diff")
    top = max(10.0, float(np.nanmax(np.abs(diff))) if np.isfinite(diff).any() else 10.0)
    _heat(ax, s, diff, cmap="RdBu", vmin=-top, vmax=top, fmt="+.0f", label="accuracy difference (points)")
    lengths = [x["tokens"] for x in s["lengths"]]
    depths = [round(float(d), 6) for d in s["depths"]]
    for r in rows:
        i, j = lengths.index(r["length"]), depths.index(round(float(r["depth"]), 6))
        if r["significant"]:
            ax.add_patch(pyplot().Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=2, ec="black"))
            ax.text(j + 0.3, i + 0.25, "*", ha="center", va="center", fontsize=9)
        else:  # within the noise of its few questions: greyed, not painted red or blue
            ax.add_patch(pyplot().Rectangle((j - 0.5, i - 0.5), 1, 1, fc="lightgrey", alpha=0.85, hatch="//",
                                            ec="grey", lw=0))
            ax.text(j, i, f"{100 * r['diff']:+.0f}", ha="center", va="center", fontsize=8, color="dimgrey")
    ref = short_label(s["methods"][0])
    ax.set_title(f"{short_label(method)} minus {ref} (outlined *: paired 95% interval excludes 0; grey: it "
                 f"includes 0)\n{subtitle(s)}", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_depth_curves(s: dict, path: Path) -> Path:
    """Accuracy against depth, one line per length (with 95% Wilson bands), one panel per method."""
    plt = pyplot()
    methods = s["methods"]
    fig, axes = plt.subplots(1, len(methods), figsize=(5.5 * len(methods), 4), squeeze=False, sharey=True)
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(s["lengths"])))
    for ax, m in zip(axes[0], methods):
        for x, color in zip(s["lengths"], colors):
            rows = sorted((r for r in s["cells"] if r["method"] == m and r["length"] == x["tokens"]),
                          key=lambda r: r["depth"])
            d = [r["depth"] for r in rows]
            ax.plot(d, [100 * r["accuracy"] for r in rows], marker="o", ms=3, color=color,
                    label=f"{x['tokens']} tokens")
            ax.fill_between(d, [100 * r["ci_low"] for r in rows], [100 * r["ci_high"] for r in rows], color=color,
                            alpha=0.08)
        ax.set_title(short_label(m), fontsize=9)
        ax.set_xlabel("relative depth of the gold item")
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy (%)")
    axes[0][-1].legend(fontsize=7, title="prompt length", title_fontsize=7)
    fig.suptitle(f"accuracy by depth, one line per length (bands: 95% Wilson): {subtitle(s)}", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_distance(s: dict, path: Path) -> Path:
    """Accuracy against the tokens between the gold item and the question (log-spaced bins), one
    line per method, 95% Wilson intervals as error bars."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for m, rows in s["by_distance"].items():
        x = [r["center"] for r in rows]
        y = [100 * r["accuracy"] for r in rows]
        err = [[max(0.0, 100 * (r["accuracy"] - r["ci_low"])) for r in rows],  # rounding: never below 0
               [max(0.0, 100 * (r["ci_high"] - r["accuracy"])) for r in rows]]
        ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=2, label=short_label(m))
    ax.set_xscale("log")

    edges = sorted({e for rows in s["by_distance"].values() for r in rows for e in (r["low"], r["high"])})
    ax.set_xticks(edges, [str(e) for e in edges], fontsize=7)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ns = [r["n"] for rows in s["by_distance"].values() for r in rows]
    ax.set_xlabel("tokens between the gold item and the question (log scale; ticks: bin edges, points: bin centres)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"accuracy by distance to the question, all lengths pooled (bars: 95% Wilson)\n"
                 f"{s['model']} / {s['task']}, n = {min(ns)}-{max(ns)} questions per point", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_failure_offsets(s: dict, path: Path) -> Path:
    """Histogram of ``retrieved item index - gold item index`` over the wrong answers that named
    another item of the context, one bar colour per method."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    methods = list(s["failures"])
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        offs = s["failures"][m]["offsets"]
        x = np.array([int(k) for k in offs], dtype=float) + (i - (len(methods) - 1) / 2) * width
        ax.bar(x, list(offs.values()), width=width, label=short_label(m))
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("retrieved item - gold item (items; < 0: an earlier item)")
    ax.set_ylabel("wrong answers")
    ax.legend(fontsize=8)
    ax.set_title(f"which item a wrong answer retrieved instead: {subtitle(s)}", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
