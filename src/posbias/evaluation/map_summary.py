"""What a position-bias map says: per-cell accuracy, the bias summary with bootstrap intervals, the
paired differences to the first method and the run-to-run noise floor (``summary.json``, ``map.md``).

Bias statistics of one method (accuracies pooled over the map's lengths, depth ``d`` over all its
questions):

* **primacy** = accuracy at the first depth (0) - mean accuracy of the middle third (depths in [1/3, 2/3]);
* **recency** = accuracy at the last depth (1) - the middle third;
* **middle dip** = min(primacy, recency): positive only when the middle is below *both* ends (the
  lost-in-the-middle U of Liu et al. 2024);
* **effective length** = the first length (ascending) whose middle-third accuracy falls below the
  threshold (none: every length stays above it).

Intervals: 95% percentile bootstrap over contexts (the unit that carries all depths of one length:
``(repeat, length, instance index)``), resampled within each length, seeded by the map's seed; the
differences between methods resample the same contexts for both (paired). Per-cell accuracy carries
its Wilson interval, per-cell differences the paired normal interval of
:func:`posbias.evaluation.stats.paired_difference`.

Noise floor (``repeats >= 2``): each statistic is computed on every repeat's instance set alone; its
run-to-run spread is the largest minus the smallest. A difference between two methods is "within
noise" when its size does not exceed the larger spread of the two methods' statistic (what the same
measurement moves between two independent draws of instances).
"""
from __future__ import annotations

import math
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np

from posbias.evaluation.attention_summary import attention_by_depth, attention_records, top1_by_layer
from posbias.evaluation.map_failures import failure_markdown, failure_summary
from posbias.evaluation.stats import paired_difference, wilson_interval
from posbias.utils.io import atomic_write_json, atomic_write_text, read_jsonl

STATS = ("overall", "primacy", "recency", "middle_dip", "effective_length")
STAT_NAMES = {"overall": "accuracy", "primacy": "primacy", "recency": "recency", "middle_dip": "middle dip",
              "effective_length": "effective length"}


def map_records(cfg, out: Path, lengths) -> list[dict]:
    """The records of ``results.jsonl`` this map's settings ask for (methods, repeats, lengths, n, depths)."""
    tokens = {x.tokens for x in lengths}
    depths = {round(float(d), 6) for d in cfg.depths}
    return [r for r in read_jsonl(out / "results.jsonl")
            if r["method"] in cfg.methods and r["repeat"] < cfg.repeats and r["length"] in tokens
            and r["index"] < cfg.n and round(float(r["depth"]), 6) in depths]


def cell_rows(records: Sequence[dict]) -> list[dict]:
    """One row per (method, length, depth): ``n``, accuracy with its 95% Wilson interval, mean gold
    log-prob per answer token, mean prompt tokens and mean tokens between the gold item and the question."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["method"], r["length"], round(float(r["depth"]), 6))].append(r)
    rows = []
    for (method, length, depth), rs in groups.items():
        k = sum(r["correct"] for r in rs)
        lo, hi = wilson_interval(k, len(rs))
        dist = [r["distance_tokens"] for r in rs if r.get("distance_tokens") is not None]
        rows.append({"method": method, "length": length, "depth": depth, "n": len(rs), "accuracy": k / len(rs),
                     "ci_low": lo, "ci_high": hi,
                     "logprob_per_token": float(np.mean([r["tf_logprob"] / r["n_tokens"] for r in rs])),
                     "prompt_tokens": float(np.mean([r["prompt_tokens"] for r in rs])),
                     "distance_tokens": float(np.mean(dist)) if dist else None})
    return sorted(rows, key=lambda r: (r["method"], r["length"], r["depth"]))


def distance_rows(records: Sequence[dict], methods: Sequence[str], bins: int = 8) -> dict[str, list[dict]]:
    """Accuracy against the tokens between the gold item and the question, per method, in ``bins``
    log-spaced bins over all lengths: ``[{"low", "high", "center", "n", "accuracy", "ci_low", "ci_high"}]``."""
    dist = [r["distance_tokens"] for r in records if r.get("distance_tokens")]
    if not dist:
        return {}
    edges = np.unique(np.round(np.geomspace(max(1, min(dist)), max(dist) + 1, bins + 1)))
    out = {}
    for m in methods:
        rows = []
        for lo, hi in zip(edges[:-1], edges[1:]):
            vals = [r["correct"] for r in records if r["method"] == m and r.get("distance_tokens")
                    and lo <= r["distance_tokens"] < hi]
            if vals:
                ci = wilson_interval(sum(vals), len(vals))
                rows.append({"low": int(lo), "high": int(hi), "center": float(np.sqrt(lo * hi)), "n": len(vals),
                             "accuracy": sum(vals) / len(vals), "ci_low": ci[0], "ci_high": ci[1]})
        out[m] = rows
    return out


class UnitMatrix:
    """Correctness as arrays: for every length, ``(units, depths)`` with NaN where a question is
    missing; the units (``(repeat, index)``) are the reference method's, in the same order for every
    method, so a resample of rows is paired across methods."""

    def __init__(self, records: Sequence[dict], methods: Sequence[str], lengths: Sequence[int],
                 depths: Sequence[float]):
        self.lengths, self.depths = list(lengths), [round(float(d), 6) for d in depths]
        col = {d: j for j, d in enumerate(self.depths)}
        units = {L: sorted({(r["repeat"], r["index"]) for r in records if r["length"] == L}) for L in self.lengths}
        self.units = units
        self.values = {m: {L: np.full((len(units[L]), len(self.depths)), np.nan) for L in self.lengths}
                       for m in methods}
        row = {L: {u: i for i, u in enumerate(units[L])} for L in self.lengths}
        for r in records:
            if r["method"] in self.values:
                L = r["length"]
                at = row[L][(r["repeat"], r["index"])], col[round(float(r["depth"]), 6)]
                self.values[r["method"]][L][at] = r["correct"]

    def rows_of_repeat(self, repeat: int) -> dict[int, np.ndarray]:
        return {L: np.array([i for i, u in enumerate(self.units[L]) if u[0] == repeat], dtype=int)
                for L in self.lengths}


def bias_stats(per_length: dict[int, np.ndarray], depths: Sequence[float], threshold: float) -> dict[str, float]:
    """The statistics of the module docstring from ``{length: (units, depths)}`` correctness arrays
    (NaN missing). Effective length is ``inf`` when no length falls below ``threshold``."""
    pooled = (np.concatenate([a for a in per_length.values() if len(a)], axis=0) if per_length
              else np.zeros((0, len(depths))))
    middle = [j for j, d in enumerate(depths) if 1 / 3 - 1e-9 <= d <= 2 / 3 + 1e-9]
    with np.errstate(all="ignore"), _quiet():
        by_depth = np.nanmean(pooled, axis=0) if len(pooled) else np.full(len(depths), np.nan)
        mid = float(np.nanmean(by_depth[middle])) if middle else float("nan")
        primacy, recency = float(by_depth[0] - mid), float(by_depth[-1] - mid)
        eff = math.inf
        for L in sorted(per_length):
            a = per_length[L]
            if len(a) and middle and float(np.nanmean(a[:, middle])) < threshold:
                eff = float(L)
                break
        overall = float(np.nanmean(pooled)) if len(pooled) else float("nan")
    return {"overall": overall, "primacy": primacy, "recency": recency, "middle_dip": min(primacy, recency),
            "effective_length": eff}


class _quiet:
    """Silence numpy's all-NaN warnings (a resample can miss a depth; its statistic is then NaN)."""

    def __enter__(self):
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        self._w.__exit__(*exc)


def bootstrap(matrix: UnitMatrix, methods: Sequence[str], threshold: float, draws: int,
              seed: int) -> dict[str, list[dict]]:
    """``{method: [stats of one resample]}``: the same resampled contexts for every method (paired)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 51]))
    out: dict[str, list[dict]] = {m: [] for m in methods}
    for _ in range(draws):
        pick = {L: rng.integers(0, len(matrix.units[L]), len(matrix.units[L])) for L in matrix.lengths}
        for m in methods:
            out[m].append(bias_stats({L: matrix.values[m][L][pick[L]] for L in matrix.lengths}, matrix.depths,
                                     threshold))
    return out


def interval(values: Sequence[float]) -> list[float]:
    """The 2.5th and 97.5th percentiles (``inf`` kept: an effective length beyond the map), NaN dropped."""
    v = np.array([x for x in values if not (isinstance(x, float) and math.isnan(x))], dtype=float)
    if not len(v):
        return [float("nan"), float("nan")]
    return [float(np.percentile(v, 2.5, method="nearest")), float(np.percentile(v, 97.5, method="nearest"))]


def summarise_bias(matrix: UnitMatrix, methods: Sequence[str], cfg) -> dict:
    """``bias``, ``differences`` (each method minus the first, paired) and ``noise`` (per-repeat spread)."""
    whole = {m: bias_stats(matrix.values[m], matrix.depths, cfg.threshold) for m in methods}
    boots = bootstrap(matrix, methods, cfg.threshold, cfg.bootstrap, cfg.seed)
    bias = {m: {s: {"value": whole[m][s], "ci95": interval([b[s] for b in boots[m]])} for s in STATS} for m in methods}
    noise = run_to_run_spread(matrix, methods, cfg) if cfg.repeats >= 2 else {}
    ref = methods[0]
    diffs = {}
    for m in methods[1:]:
        diffs[m] = {}
        for s in STATS:
            value = whole[m][s] - whole[ref][s] if math.isfinite(whole[m][s]) or math.isfinite(whole[ref][s]) else 0.0
            paired = [bm[s] - br[s] if not (math.isinf(bm[s]) and math.isinf(br[s])) else 0.0
                      for bm, br in zip(boots[m], boots[ref])]
            entry = {"value": value, "ci95": interval(paired)}
            if noise:
                floor = max(noise[m][s], noise[ref][s])
                entry.update(noise=floor, within_noise=bool(not abs(value) > floor))
            diffs[m][s] = entry
    return {"bias": bias, "differences": diffs, "noise": noise}


def run_to_run_spread(matrix: UnitMatrix, methods: Sequence[str], cfg) -> dict[str, dict[str, float]]:
    """``{method: {statistic: max - min over repeats}}``, each repeat's instances alone."""
    out = {}
    for m in methods:
        per = []
        for r in range(cfg.repeats):
            rows = matrix.rows_of_repeat(r)
            per.append(bias_stats({L: matrix.values[m][L][rows[L]] for L in matrix.lengths}, matrix.depths,
                                  cfg.threshold))
        out[m] = {s: _spread([p[s] for p in per]) for s in STATS}
    return out


def _spread(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return float("nan")
    if any(math.isinf(v) for v in finite):
        return 0.0 if all(math.isinf(v) for v in finite) else math.inf
    return max(finite) - min(finite)


def cell_differences(records: Sequence[dict], methods: Sequence[str], repeats: int) -> dict[str, list[dict]]:
    """Per cell, each method after the first minus the first on the same questions: ``diff`` with its
    paired 95% interval, ``significant`` (the interval excludes 0) and, with repeats, ``noise`` (the
    largest minus the smallest per-repeat accuracy of the first method in that cell) and ``within_noise``."""
    by = defaultdict(dict)
    for r in records:
        by[(r["length"], round(float(r["depth"]), 6))][(r["method"], r["repeat"], r["index"])] = r["correct"]
    ref, out = methods[0], {}
    for m in methods[1:]:
        rows = []
        for (L, d), vals in sorted(by.items()):
            keys = [(rep, i) for (meth, rep, i) in vals if meth == ref and (m, rep, i) in vals]
            if not keys:
                continue
            p = paired_difference([vals[(ref, *k)] for k in keys], [vals[(m, *k)] for k in keys])
            row = {"length": L, "depth": d, "n": p["n"], "diff": p["diff"], "ci_low": p["ci95"][0],
                   "ci_high": p["ci95"][1], "significant": bool(p["ci95"][0] > 0 or p["ci95"][1] < 0)}
            if repeats >= 2:
                accs = [np.mean([vals[(ref, *k)] for k in keys if k[0] == rep]) for rep in range(repeats)
                        if any(k[0] == rep for k in keys)]
                row["noise"] = float(max(accs) - min(accs)) if len(accs) >= 2 else float("nan")
                row["within_noise"] = bool(not abs(p["diff"]) > row["noise"])
            rows.append(row)
        out[m] = rows
    return out


def cost_of(out: Path, cfg) -> dict:
    """Scoring cost from ``metrics.jsonl``: seconds, prefills and questions, per method and in all."""
    per: dict[str, dict] = defaultdict(lambda: {"seconds": 0.0, "prefills": 0, "questions": 0})
    for r in read_jsonl(out / "metrics.jsonl"):
        if r.get("method") in cfg.methods:
            for k in ("seconds", "prefills", "questions"):
                per[r["method"]][k] += r.get(k, 0)
    total = {k: sum(p[k] for p in per.values()) for k in ("seconds", "prefills", "questions")}
    return {"per_method": dict(per), "total": total}


def write_summary(cfg, out: Path, lengths) -> dict:
    """Write ``summary.json`` and ``map.md`` from the folder's results; returns the summary."""
    records = map_records(cfg, out, lengths)
    methods = [m for m in cfg.methods if any(r["method"] == m for r in records)]
    if not methods:
        raise ValueError(f"{out} holds no results of this map yet")
    matrix = UnitMatrix(records, methods, [x.tokens for x in lengths], cfg.depths)
    summary = {"model": cfg.model, "task": cfg.task, "methods": methods,
               "lengths": [{"spec": x.spec, "tokens": x.tokens} for x in lengths], "depths": list(cfg.depths),
               "n_per_cell": cfg.n * cfg.repeats, "repeats": cfg.repeats, "seed": cfg.seed,
               "threshold": cfg.threshold, "bootstrap": cfg.bootstrap, "cells": cell_rows(records),
               **summarise_bias(matrix, methods, cfg),
               "cell_differences": cell_differences(records, methods, cfg.repeats),
               "by_distance": distance_rows(records, methods), "cost": cost_of(out, cfg)}
    if cfg.mode == "both":
        summary["failures"] = failure_summary(records, methods)
    if attention_records(records):
        summary["attention"] = map_attention(records, methods)
    atomic_write_json(out / "summary.json", _finite(summary))
    atomic_write_text(out / "map.md", map_markdown(summary) + "\n")
    return summary


def map_attention(records: Sequence[dict], methods: Sequence[str]) -> dict:
    """Per method: per length (tokens, as a string key) the attention diagnostic by depth
    (:func:`~posbias.evaluation.attention_summary.attention_by_depth`), and the layer x depth shares at the
    longest length (:func:`~posbias.evaluation.attention_summary.top1_by_layer`)."""
    out = {}
    for m in methods:
        rs = [r for r in attention_records(records) if r["method"] == m]
        if not rs:
            continue
        lengths = sorted({r["length"] for r in rs})
        out[m] = {"by_length": {str(L): attention_by_depth([r for r in rs if r["length"] == L]) for L in lengths},
                  "longest": lengths[-1],
                  "top1_by_layer": top1_by_layer([r for r in rs if r["length"] == lengths[-1]])}
    return out


def attention_markdown(s: dict) -> list[str]:
    """The attention section of ``map.md``: per method a length x depth grid of "gold record most attended
    (%) / median rank"."""
    lines = ["", "## Where the last prompt position's attention went", "",
             "Per cell: % of questions whose gold record is the most attended record (head- and layer-averaged "
             "attention of the last prompt position) / the gold record's median rank among the records.", ""]
    for m, a in s["attention"].items():
        cells = {(int(L), r["depth"]): f"{100 * r['top1']:.0f}% / {r['median_rank']:g}"
                 for L, rows in a["by_length"].items() for r in rows}
        lines += [f"### {m}", ""] + _grid(s, cells) + [""]
    return lines


def _finite(obj):
    """JSON without Infinity / NaN: ``inf`` -> ``"inf"``, NaN -> None."""
    if isinstance(obj, float):
        return None if math.isnan(obj) else "inf" if math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


# --------------------------------------------------------------------------------------------- markdown


def stat_text(stat: str, value: float, ci: Sequence[float], lengths: Sequence[int], diff: bool = False) -> str:
    """One statistic as table text: points for accuracies, tokens for the effective length."""
    if stat == "effective_length":
        if diff:
            return "-" if math.isnan(value) else f"{value:+.0f} tokens" if math.isfinite(value) else "n/a"
        top = max(lengths) if lengths else 0

        def show(x):
            return f"> {top}" if math.isinf(x) else "?" if math.isnan(x) else f"{x:.0f}"
        return f"{show(value)} [{show(ci[0])}, {show(ci[1])}]"
    if math.isnan(value):
        return "-"
    sign = "+" if diff or stat != "overall" else ""

    def points(x: float) -> str:
        return "?" if math.isnan(x) else f"{round(100 * x) + 0:{sign}d}"  # + 0: no "-0"
    return f"{points(value)} [{points(ci[0])}, {points(ci[1])}]"


def map_markdown(s: dict) -> str:
    """``map.md``: the bias summary (one line per method), differences, noise, per-cell tables, cost."""
    tokens = [x["tokens"] for x in s["lengths"]]
    lines = [f"# Position-bias map: {s['model']}, task {s['task']}", "",
             f"Lengths {', '.join(_length_text(x) for x in s['lengths'])} tokens; depths "
             f"{', '.join(f'{d:g}' for d in s['depths'])}; n = {s['n_per_cell']} questions per cell "
             f"({s['repeats']} repeat(s) of n = {s['n_per_cell'] // s['repeats']}), seed {s['seed']}.", "",
             "## Bias summary", "",
             f"Points (accuracy %, differences in points) [95% bootstrap interval, {s['bootstrap']} resamples of "
             "contexts]; primacy = depth 0 minus the middle third, recency = depth 1 minus the middle third, "
             "middle dip = the smaller of the two (> 0: a U), effective length = first length whose middle third "
             f"falls below {100 * s['threshold']:.0f}%.", "",
             "| method | " + " | ".join(STAT_NAMES[k] for k in STATS) + " |", "|---|" + "---:|" * len(STATS)]
    for m in s["methods"]:
        b = s["bias"][m]
        lines.append(f"| {m} | " + " | ".join(stat_text(k, b[k]["value"], b[k]["ci95"], tokens) for k in STATS) + " |")
    if s["differences"]:
        ref = s["methods"][0]
        lines += ["", f"## Against `{ref}` (paired, the same contexts)", "",
                  "Difference [95% paired bootstrap interval]"
                  + ("; *within noise*: not larger than the run-to-run spread of the statistic between repeats"
                     if s["noise"] else "; run `--repeats 2` for the run-to-run noise floor"), "",
                  "| method | " + " | ".join(STAT_NAMES[k] for k in STATS if k != "effective_length") + " |",
                  "|---|" + "---:|" * (len(STATS) - 1)]
        for m, d in s["differences"].items():
            cells = []
            for k in STATS:
                if k == "effective_length":
                    continue
                text = stat_text(k, d[k]["value"], d[k]["ci95"], tokens, diff=True).replace("+nan", "-")
                if "within_noise" in d[k]:
                    text += " *within noise*" if d[k]["within_noise"] else f" (> noise {100 * d[k]['noise']:.0f})"
                cells.append(text)
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    if s["noise"]:
        lines += ["", "## Run-to-run noise (largest minus smallest over repeats, points)", "",
                  "| method | " + " | ".join(STAT_NAMES[k] for k in STATS if k != "effective_length") + " |",
                  "|---|" + "---:|" * (len(STATS) - 1)]
        for m, nz in s["noise"].items():
            lines.append(f"| {m} | " + " | ".join(f"{100 * nz[k]:.0f}" if math.isfinite(nz[k]) else "-"
                                                  for k in STATS if k != "effective_length") + " |")
    lines += ["", "## Accuracy per cell (%, rows: prompt length in tokens, mean prompt tokens in brackets)", ""]
    lines += _cell_tables(s)
    for m, rows in s["cell_differences"].items():
        lines += ["", f"### {m} minus {s['methods'][0]} (points; * paired 95% interval excludes 0"
                  + ("; ~ within the run-to-run noise of the cell)" if s["noise"] else ")"), ""]
        lines += _grid(s, {(r["length"], r["depth"]): f"{100 * r['diff']:+.0f}{'*' if r['significant'] else ''}"
                           f"{'~' if r.get('within_noise') else ''}" for r in rows})
    if "failures" in s:
        lines += ["", failure_markdown(s["failures"])]
    if s.get("attention"):
        lines += attention_markdown(s)
    c = s["cost"]["total"]
    lines += ["", f"Scoring: {c['questions']} questions from {c['prefills']} prompt prefills in {c['seconds']:.0f} s "
                  "(all invocations of this folder)."]
    return "\n".join(lines)


def _length_text(x: dict) -> str:
    """``512 (0.0625w)``, or ``512`` for a length given in tokens."""
    return str(x["tokens"]) if x["spec"] == str(x["tokens"]) else f"{x['tokens']} ({x['spec']})"


def _grid(s: dict, cells: dict, extra: dict | None = None) -> list[str]:
    lines = ["| length | " + " | ".join(f"{d:g}" for d in s["depths"]) + " |", "|---|" + "---:|" * len(s["depths"])]
    for x in s["lengths"]:
        L = x["tokens"]
        head = f"{L}" + (f" [{extra[L]:.0f}]" if extra and L in extra else "")
        lines.append(f"| {head} | " + " | ".join(cells.get((L, round(float(d), 6)), "-") for d in s["depths"]) + " |")
    return lines


def _cell_tables(s: dict) -> list[str]:
    lines = []
    for m in s["methods"]:
        rows = [r for r in s["cells"] if r["method"] == m]
        prompt = defaultdict(list)
        for r in rows:
            prompt[r["length"]].append(r["prompt_tokens"])
        lines += [f"**{m}**", ""]
        lines += _grid(s, {(r["length"], r["depth"]): f"{100 * r['accuracy']:.0f}" for r in rows},
                       {L: float(np.mean(v)) for L, v in prompt.items()})
        lines.append("")
    return lines
