"""Accuracy summaries with 95% Wilson score intervals, and paired differences between methods."""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable, Sequence


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (Wilson 1927).

    ``successes`` may be fractional (e.g. string_match_all averages); it is used as is.
    """
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def percent_cell(accuracy: float, low: float, high: float) -> str:
    """``"81 [60, 92]"``: an accuracy and its interval (fractions) as whole percents, for tables."""
    return f"{100 * accuracy:.0f} [{100 * low:.0f}, {100 * high:.0f}]"


def accuracy_by_depth(records: Iterable[dict], key: str = "correct") -> list[dict]:
    """Group per-instance records by ``depth`` and return rows
    ``{depth, n, accuracy, ci_low, ci_high}`` sorted by depth."""
    groups: dict[float, list[float]] = defaultdict(list)
    for r in records:
        if r.get(key) is not None:
            groups[round(float(r["depth"]), 6)].append(float(r[key]))
    rows = []
    for depth in sorted(groups):
        vals = groups[depth]
        lo, hi = wilson_interval(sum(vals), len(vals))
        rows.append({"depth": depth, "n": len(vals), "accuracy": sum(vals) / len(vals), "ci_low": lo, "ci_high": hi})
    return rows


def format_table(rows: list[dict], title: str = "") -> str:
    """Markdown table of accuracy by depth (percent, with the 95% Wilson interval)."""
    lines = [f"**{title}**", ""] if title else []
    lines += ["| depth | n | accuracy | 95% CI |", "|---:|---:|---:|:---:|"]
    for r in rows:
        lines.append(
            f"| {r['depth']:.2f} | {r['n']} | {100 * r['accuracy']:.1f}% | "
            f"[{100 * r['ci_low']:.1f}, {100 * r['ci_high']:.1f}] |"
        )
    return "\n".join(lines)


def paired_difference(a: Sequence[float], b: Sequence[float], bounds: tuple[float, float] = (-1.0, 1.0)) -> dict:
    """Mean of ``b - a`` over paired items (the same questions under two methods) with a 95% interval.

    Right / wrong outcomes (every value 0 or 1, accuracy bounds): Newcombe's hybrid score interval for a
    difference of paired proportions (:func:`newcombe_paired`), which is never of zero width and stays
    inside [-1, 1], so a handful of questions that all agree give a wide interval, not ``+0 [+0, +0]``.
    Other scores (log-probs, partial credit): the normal interval, clipped to ``bounds``. ``n`` 0 gives
    NaN; ``interval`` names the method used."""
    d = [y - x for x, y in zip(a, b)]
    n = len(d)
    if not n:
        return {"n": 0, "diff": float("nan"), "ci95": [float("nan"), float("nan")], "interval": "none"}
    mean = sum(d) / n
    binary = all(float(v) in (0.0, 1.0) for v in (*a, *b))
    if binary and tuple(bounds) == (-1.0, 1.0):
        return {"n": n, "diff": mean, "ci95": list(newcombe_paired(a, b)), "interval": "newcombe"}
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    half = 1.96 * sd / math.sqrt(n)
    low, high = bounds
    return {"n": n, "diff": mean, "ci95": [max(low, mean - half), min(high, mean + half)], "interval": "normal"}


def newcombe_paired(a: Sequence[float], b: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """95% interval of ``mean(b) - mean(a)`` for paired right / wrong outcomes: Newcombe's method 10 (Stat.
    Med. 1998, 17:2635), built from the two Wilson score intervals and the correlation of the pairs (with
    Newcombe's continuity correction of that correlation)."""
    n = len(a)
    both = sum(x == 1 and y == 1 for x, y in zip(a, b))
    gained = sum(x == 0 and y == 1 for x, y in zip(a, b))
    lost = sum(x == 1 and y == 0 for x, y in zip(a, b))
    neither = n - both - gained - lost
    p1, p2 = (both + gained) / n, (both + lost) / n  # b's accuracy, a's accuracy
    l1, u1 = wilson_interval(both + gained, n, z)
    l2, u2 = wilson_interval(both + lost, n, z)
    cross = both * neither - gained * lost
    denom = math.sqrt((both + gained) * (lost + neither) * (both + lost) * (gained + neither))
    phi = 0.0 if denom == 0 else (max(cross - n / 2, 0.0) if cross > 0 else cross) / denom
    diff = p1 - p2
    low = diff - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = diff + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, low), min(1.0, high)
