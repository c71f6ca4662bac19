"""PNG figures of the extrapolation study (matplotlib, Agg backend; no display needed).

* :func:`plot_heatmap` - one model's accuracy over input length (x) x needle depth (y);
* :func:`plot_accuracy_vs_length` - accuracy against length, one line per model / scheme;
* :func:`plot_perplexity_vs_length` - perplexity against length, both modes (solid =
  non-overlapping, dashed = sliding window), one colour per model / scheme.
* :func:`plot_probe_curves` - the trainer's probes at the training length (passkey, NIAH) against
  the training step, one line per scheme / seed: when, and whether, retrieval was learned.

Every function takes plain Python data (lists / dicts), writes the PNG atomically and returns its
path. The learned-prior and attention-map views are in :mod:`posbias.study.priors`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from posbias.utils.figures import save_figure  # noqa: E402,F401 (the one figure writer)


def _fmt_len(n: int) -> str:
    n = int(n)
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    return str(n)


def plot_heatmap(rows: Iterable[Mapping], path: str | Path, *, title: str = "", value: str = "tf_acc",
                 train_context: int | None = None) -> Path:
    """Accuracy heatmap of one model: x = length, y = depth (0 = beginning at the top).

    Args:
        rows: cells ``{length, depth, <value>}`` (e.g. from ``summarize_grid`` for one model/task).
        value: the field to show (``"tf_acc"`` or ``"gen_acc"``), in [0, 1].
        train_context: marks the training length with a vertical line when given.
    """
    rows = [r for r in rows if r.get(value) is not None]
    lengths = sorted({int(r["length"]) for r in rows})
    depths = sorted({float(r["depth"]) for r in rows})
    grid = [[math.nan] * len(lengths) for _ in depths]
    for r in rows:
        grid[depths.index(float(r["depth"]))][lengths.index(int(r["length"]))] = float(r[value])
    fig, ax = plt.subplots(figsize=(1.0 + 0.7 * max(3, len(lengths)), 1.2 + 0.45 * max(3, len(depths))))
    im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [_fmt_len(L) for L in lengths], rotation=45)
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_xlabel("input length (tokens)")
    ax.set_ylabel("needle depth (0 = start)")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if not math.isnan(v):
                ax.text(j, i, f"{100 * v:.0f}", ha="center", va="center", fontsize=7)
    if train_context and lengths:
        # position of the training length on the (categorical) x axis
        xs = [j for j, L in enumerate(lengths) if L <= train_context]
        if xs:
            ax.axvline(max(xs) + 0.5, color="k", lw=1, ls="--")
    fig.colorbar(im, ax=ax, label="accuracy")
    ax.set_title(title or value)
    return save_figure(fig, path)


def plot_accuracy_vs_length(curves: Mapping[str, Mapping[int, float]], path: str | Path, *,
                            title: str = "passkey accuracy", train_context: int | None = None,
                            ylabel: str = "accuracy") -> Path:
    """One line per model / scheme: accuracy (mean over depths and instances) against length."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, by_len in sorted(curves.items()):
        xs = sorted(int(k) for k in by_len)
        if xs:
            ax.plot(xs, [by_len[x] if x in by_len else by_len[str(x)] for x in xs], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("input length (tokens, log scale)")
    ax.set_ylabel(ylabel)
    if train_context:
        ax.axvline(train_context, color="k", lw=1, ls="--", label="training length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    return save_figure(fig, path)


def plot_perplexity_vs_length(rows: Iterable[Mapping], path: str | Path, *, title: str = "perplexity",
                              train_context: int | None = None, cap: float = 1e4) -> Path:
    """Perplexity against evaluation context, both modes.

    Args:
        rows: ``{model, context, mode, ppl}`` (mode ``"non-overlapping"`` or ``"sliding"``).
        cap: perplexities above it (or infinite) are drawn at ``cap`` so a collapse stays visible.
    """
    rows = list(rows)
    models = sorted({r["model"] for r in rows})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for k, m in enumerate(models):
        for mode, ls in (("non-overlapping", "-"), ("sliding", "--")):
            pts = sorted((int(r["context"]), float(r["ppl"])) for r in rows if r["model"] == m and r["mode"] == mode)
            if pts:
                ys = [min(cap, p) if math.isfinite(p) else cap for _, p in pts]
                ax.plot([x for x, _ in pts], ys, ls=ls, marker="o", color=colors[k % len(colors)],
                        label=f"{m} ({mode})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation context (tokens, log scale)")
    ax.set_ylabel(f"perplexity (capped at {cap:g})")
    if train_context:
        ax.axvline(train_context, color="k", lw=1, ls=":")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(title + "  (solid: non-overlapping, dashed: sliding window)")
    return save_figure(fig, path)


def plot_probe_curves(history: Mapping[str, list[Mapping]], path: str | Path, *, title: str = "",
                      target: float | None = None) -> Path:
    """Probe exact match against the training step: one panel per probed task (passkey, and NIAH when
    any run probed it), one line per key of ``history`` (``{name: [{step, passkey_em, niah_em}]}``,
    as :func:`posbias.study.report.probe_history` reads it); ``target`` is drawn as a dotted line."""
    tasks = ["passkey"] + (["niah"] if any(r.get("niah_em") is not None for rs in history.values() for r in rs) else [])
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 3.8), squeeze=False)
    colors = plt.get_cmap("tab20" if len(history) > 10 else "tab10").colors  # one distinct colour per line
    for ax, task in zip(axes[0], tasks):
        for k, (name, records) in enumerate(sorted(history.items())):
            pts = [(r["step"], r[f"{task}_em"]) for r in records if r.get(f"{task}_em") is not None]
            if pts:
                ax.plot([s for s, _ in pts], [e for _, e in pts], marker=".", ms=3, label=name,
                        color=colors[k % len(colors)])
        if target:
            ax.axhline(target, color="k", lw=1, ls=":", label=f"target {target:g}")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("training step")
        ax.set_ylabel(f"{task} probe exact match (1x)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title or "retrieval at the training length during training")
    return save_figure(fig, path)
