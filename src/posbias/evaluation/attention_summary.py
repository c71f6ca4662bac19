"""Summaries and figures of the attention diagnostic (:mod:`posbias.evaluation.attention_probe`) by depth.

For each gold depth: how often the gold record is the most attended record (``top1``, with its 95% Wilson
interval), its median rank and mean attention mass, the retrieval-head hit rate, and the median rank
among the questions answered right and among those answered wrong: a wrong answer whose gold record was
ranked first was looked at and copied wrong; one ranked far down was never looked at.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from matplotlib.ticker import NullFormatter

from posbias.evaluation.stats import wilson_interval
from posbias.utils.figures import pyplot, save_figure


def attention_records(records: Iterable[dict]) -> list[dict]:
    """The records that carry the diagnostic."""
    return [r for r in records if "attn_gold_rank" in r]


def attention_by_depth(records: Iterable[dict]) -> list[dict]:
    """One row per depth (module docstring); ``records``: eval / map records with ``attn_*`` fields."""
    groups: dict[float, list[dict]] = defaultdict(list)
    for r in attention_records(records):
        groups[round(float(r["depth"]), 6)].append(r)
    rows = []
    for depth in sorted(groups):
        rs = groups[depth]
        ranks = [r["attn_gold_rank"] for r in rs]
        top = sum(k == 1 for k in ranks)
        lo, hi = wilson_interval(top, len(rs))
        right = [r["attn_gold_rank"] for r in rs if float(r.get("correct", 0)) >= 1]
        wrong = [r["attn_gold_rank"] for r in rs if float(r.get("correct", 0)) < 1]
        rows.append({"depth": depth, "n": len(rs), "accuracy": sum(float(r.get("correct", 0)) for r in rs) / len(rs),
                     "top1": top / len(rs), "top1_low": lo, "top1_high": hi,
                     "median_rank": statistics.median(ranks),
                     "rank_q1": _quantile(ranks, 0.25), "rank_q3": _quantile(ranks, 0.75),
                     "gold_mass": statistics.fmean(r["attn_gold_mass"] for r in rs),
                     "hit_rate": statistics.fmean(r["attn_hit_rate"] for r in rs),
                     "median_rank_right": statistics.median(right) if right else None,
                     "median_rank_wrong": statistics.median(wrong) if wrong else None})
    return rows


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def top1_by_layer(records: Iterable[dict]) -> dict:
    """``{"depths": [...], "top1": [[share per depth] per layer]}``: how often the gold record is the most
    attended record in each layer (the layer x depth panel)."""
    groups: dict[float, list[list[int]]] = defaultdict(list)
    for r in attention_records(records):
        groups[round(float(r["depth"]), 6)].append(r["attn_layers"]["gold_rank"])
    depths = sorted(groups)
    if not depths:
        return {"depths": [], "top1": []}
    layers = len(groups[depths[0]][0])
    return {"depths": depths,
            "top1": [[statistics.fmean(ranks[layer] == 1 for ranks in groups[d]) for d in depths]
                     for layer in range(layers)]}


def format_attention_table(rows: list[dict], title: str = "") -> str:
    """Markdown: per depth, accuracy beside where the attention of the last prompt position went."""
    lines = [f"**{title}**", ""] if title else []
    lines += ["| depth | n | accuracy | gold most attended (95% CI) | median gold rank [IQR] | gold mass | "
              "retrieval-head hits | median rank right / wrong |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        right = "-" if r["median_rank_right"] is None else f"{r['median_rank_right']:g}"
        wrong = "-" if r["median_rank_wrong"] is None else f"{r['median_rank_wrong']:g}"
        lines.append(f"| {r['depth']:.2f} | {r['n']} | {100 * r['accuracy']:.0f}% | {100 * r['top1']:.0f}% "
                     f"[{100 * r['top1_low']:.0f}, {100 * r['top1_high']:.0f}] | {r['median_rank']:g} "
                     f"[{r['rank_q1']:g}, {r['rank_q3']:g}] | {r['gold_mass']:.4f} | {100 * r['hit_rate']:.1f}% | "
                     f"{right} / {wrong} |")
    return "\n".join(lines)


def plot_attention(rows: list[dict], layers: dict, path: str | Path, title: str = "") -> Path:
    """Three panels: accuracy by depth; the gold record's attention rank by depth (median, IQR band; rank 1
    at the top); the share of questions whose gold record is the most attended one, layer x depth."""
    plt = pyplot()
    fig, (acc, rank, heat) = plt.subplots(1, 3, figsize=(15, 4))
    x = [r["depth"] for r in rows]
    acc.plot(x, [100 * r["accuracy"] for r in rows], marker="o", label="accuracy")
    acc.plot(x, [100 * r["top1"] for r in rows], marker="s", label="gold record most attended")
    acc.fill_between(x, [100 * r["top1_low"] for r in rows], [100 * r["top1_high"] for r in rows], alpha=0.15,
                     color="tab:orange")
    acc.set_ylim(-2, 102)
    acc.set_ylabel("% of questions")
    acc.legend(fontsize=8)
    rank.plot(x, [r["median_rank"] for r in rows], marker="o", color="tab:green")
    rank.fill_between(x, [r["rank_q1"] for r in rows], [r["rank_q3"] for r in rows], alpha=0.15, color="tab:green")
    rank.set_yscale("log")
    top = max([r["rank_q3"] for r in rows] + [2])
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if t <= top * 1.5]
    rank.set_yticks(ticks, [str(t) for t in ticks])
    rank.yaxis.set_minor_formatter(NullFormatter())
    rank.invert_yaxis()
    rank.set_ylabel("gold record's attention rank (1 = most attended)")
    for ax in (acc, rank):
        ax.set_xlabel("relative depth of the gold item")
        ax.grid(alpha=0.3)
    if layers["top1"]:
        image = heat.imshow(layers["top1"], aspect="auto", origin="lower", vmin=0, vmax=1, cmap="viridis")
        heat.set_xticks(range(len(layers["depths"])), [f"{d:g}" for d in layers["depths"]])
        heat.set_xlabel("relative depth of the gold item")
        heat.set_ylabel("layer")
        heat.set_title("share with the gold record most attended", fontsize=9)
        fig.colorbar(image, ax=heat)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)
