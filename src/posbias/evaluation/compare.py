"""Several methods side by side on the same held-out instances (one model load)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from posbias.evaluation.plots import plot_accuracy_by_depth
from posbias.evaluation.session import EvalConfig, plan_eval, run_planned
from posbias.evaluation.stats import paired_difference, percent_cell
from posbias.methods.registry import variant_options
from posbias.models import load_model, model_identity
from posbias.models.adapter import adapter_record
from posbias.models.options import LoadOptions, load_settings, options_for
from posbias.utils.io import append_jsonl, atomic_write_text, read_json, read_jsonl
from posbias.utils.run_folder import INVOCATIONS, open_run, safe_name

# Settings every method's results in a comparison folder share (each method's folder checks its
# own method options; the method list may change between invocations).
COMPARE_KEYS = ("model", "model_path", "task", "depths", "seed", "mode", "chat", "task_options", "dtype")


@dataclass
class CompareConfig:
    """The settings of one comparison: every method in ``methods`` on the same held-out (``eval``
    split) instances, as :class:`~posbias.evaluation.session.EvalConfig` has them for one method.

    ``methods`` are names or variants ``name@key=value@...`` (:func:`posbias.methods.registry.variant_options`:
    the variant's options override ``method_options[name]``, so ``ms-poe@r_min=1.2@r_max=1.8`` beside a
    tuned ``ms-poe`` shows the published default next to the tuned setting); ``method_options``: options
    per method name.
    """

    model: str
    task: str
    methods: list[str]
    depths: list[float]
    n: int
    out: str | Path
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed: int = 0
    mode: str = "teacher-forced"
    batch_size: int = 8
    chat: bool = False
    task_options: dict = field(default_factory=dict)

    def method_config(self, label: str, out: str | Path) -> EvalConfig:
        """The evaluation of the method (or variant) ``label`` into ``out``."""
        name, options = variant_options(label, self.method_options or {})
        return EvalConfig(model=self.model, task=self.task, depths=self.depths, n=self.n, out=out, seed=self.seed,
                          split="eval", mode=self.mode, batch_size=self.batch_size, chat=self.chat, method=name,
                          method_options=options, task_options=dict(self.task_options or {}))


def compare_methods(cfg: CompareConfig, *, loaded=None, load: LoadOptions | None = None) -> dict:
    """Evaluate every method of ``cfg.methods`` into ``cfg.out/<method>`` and write a joint table and plot.

    Returns ``{label: summary}``; ``load``: device, dtype and Hub revision of the model. Each method's
    folder (``out/<label>``, :func:`method_folder`) resumes independently. Every method is
    checked (name, options, factors file, its folder) before the model loads or anything is
    scored, and nothing is written before the first result.
    """

    method_options = cfg.method_options or {}
    task_options = dict(cfg.task_options or {})
    load = options_for(load, loaded)
    check_method_list(cfg.methods)
    adapter = adapter_record(cfg.model)  # a folder of posbias apply: every "none" row runs with its method
    adapter_note = f"adapter: {adapter['method']} active in every row" if adapter else ""
    top = open_run(cfg.out, "compare",
                   {"model": cfg.model, "model_path": model_identity(cfg.model), "task": cfg.task,
                    "methods": cfg.methods, "depths": cfg.depths, "n": cfg.n, "seed": cfg.seed, "mode": cfg.mode,
                    "chat": cfg.chat, "task_options": task_options, "method_options": method_options,
                    "batch_size": cfg.batch_size, "out": str(cfg.out), **load_settings(cfg.model, load),
                    **({"adapter": adapter} if adapter else {})},
                   check_keys=COMPARE_KEYS)
    plans, instances = {}, None
    for label in cfg.methods:
        plans[label] = plan_eval(cfg.method_config(label, top.path / method_folder(label)), parent=top,
                                 instances=instances, load=load)
        instances = plans[label].instances
    loaded = loaded or load_model(cfg.model, load)
    summaries = {}
    for name, plan in plans.items():
        start = time.time()
        summaries[name] = run_planned(plan, loaded)
        append_jsonl(top.path / "metrics.jsonl", {"method": name, "overall": summaries[name]["overall"],
                                                  "by_depth": summaries[name]["by_depth"],
                                                  "seconds": round(time.time() - start, 1)})
    joint = finished_summaries(top.path, summaries)
    title = f"{cfg.model} / {cfg.task}" + (f" ({adapter_note})" if adapter else "")
    write_comparison(joint, {label: top.path / method_folder(label) for label in joint},
                     top.path / "comparison", title=title, note=adapter_note)
    return summaries


def write_comparison(summaries: dict[str, dict], folders: dict[str, Path], stem: Path, title: str = "",
                     note: str = "") -> str:
    """``stem.md`` (``note`` as its first paragraph when given, accuracy per depth, then every method paired
    against the first on the same instances) and ``stem.png`` from each method's ``summaries[label]`` and the
    records in ``folders[label]``; returns the markdown."""
    records = folder_records(folders)
    text = (f"{note}\n\n" if note else "") + comparison_table(summaries) + "\n\n" + paired_table(records) + "\n"
    atomic_write_text(stem.with_suffix(".md"), text)
    plot_accuracy_by_depth({m: s["by_depth"] for m, s in summaries.items()}, stem.with_suffix(".png"),
                           title=title, paired=paired_by_depth(records))
    return text


def folder_methods(top: Path, current: list[str]) -> list[str]:
    """Every method label a comparison folder has been asked for, in first-asked order: the labels of
    its earlier invocations (``invocations.jsonl``), then those of ``current`` not among them."""
    asked = [m for inv in read_jsonl(top / INVOCATIONS) for m in inv.get("config", {}).get("methods", [])]
    return list(dict.fromkeys(asked + current))


def finished_summaries(top: Path, summaries: dict[str, dict]) -> dict[str, dict]:
    """``{label: summary}`` of every method this comparison folder has finished, in first-asked order
    (:func:`folder_methods`): this invocation's ``summaries``, and the ``summary.json`` of the methods
    earlier invocations (or a concurrent process) scored, so ``comparison.md`` shows them all."""
    joint = {}
    for label in folder_methods(top, list(summaries)):
        found = top / method_folder(label) / "summary.json"
        if label in summaries:
            joint[label] = summaries[label]
        elif found.exists():
            joint[label] = read_json(found)
    return joint


def check_method_list(methods: list[str]) -> None:
    """At least one method, none twice."""
    if not methods:
        raise ValueError("--methods is empty: give one or more methods, comma-separated")
    twice = sorted({m for m in methods if methods.count(m) > 1})
    if twice:
        raise ValueError(f"--methods lists {', '.join(twice)} more than once")
    folders = [method_folder(m) for m in methods]
    clash = sorted({m for m, f in zip(methods, folders) if folders.count(f) > 1})
    if clash:
        raise ValueError(f"--methods {', '.join(clash)} would share one folder; rename a variant")


def paired_table(recs: dict[str, dict[str, dict]]) -> str:
    """Markdown: every method against the first on the very same instances, per depth and over all:
    instances gained / lost, the accuracy difference (points) and the per-token gold log-prob
    difference (teacher-forced records), each with its 95% normal interval (:func:`paired_difference`).
    ``recs``: ``{label: {id: record}}`` (:func:`folder_records`), the first label the reference."""
    labels = list(recs)
    if len(labels) < 2:
        return ""
    base = labels[0]
    depths = _depths(recs[base])
    lines = [f"Paired against `{base}` (the same instances): gained/lost, accuracy difference in points "
             "[95% interval], per-token gold log-prob difference +- 95% half-width",
             "", "| method | " + " | ".join(f"depth {d:g}" for d in depths) + " | all |",
             "|---|" + "---|" * (len(depths) + 1)]
    for lab in labels[1:]:
        cells = [_paired_cell(recs[base], recs[lab], d) for d in depths + [None]]
        lines.append(f"| {lab} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_by_depth(recs: dict[str, dict[str, dict]]) -> dict[str, list[dict]]:
    """For every method after the first: ``[{"depth", "n", "diff", "ci_low", "ci_high"}]`` per depth, the
    accuracy difference to the first method (fractions) on the instances both scored, with its 95%
    normal interval (:func:`paired_difference`, the figures of :func:`paired_table`). ``recs`` as there."""
    labels = list(recs)
    if len(labels) < 2:
        return {}
    base = recs[labels[0]]
    out = {}
    for lab in labels[1:]:
        rows = []
        for d in _depths(base):
            ids = _shared_ids(base, recs[lab], d)
            if ids:
                acc = paired_difference([float(base[i]["correct"]) for i in ids],
                                        [float(recs[lab][i]["correct"]) for i in ids])
                rows.append({"depth": d, "n": acc["n"], "diff": acc["diff"], "ci_low": acc["ci95"][0],
                             "ci_high": acc["ci95"][1]})
        out[lab] = rows
    return out


def folder_records(folders: dict[str, Path]) -> dict[str, dict[str, dict]]:
    """``{label: {instance id: record}}`` from each method folder's ``results.jsonl``, read once for the
    table and the plot."""
    return {lab: {r["id"]: r for r in read_jsonl(Path(f) / "results.jsonl", key="id")} for lab, f in folders.items()}


def _depths(records: dict[str, dict]) -> list[float]:
    return sorted({float(r["depth"]) for r in records.values()})


def _shared_ids(base: dict, other: dict, depth: float | None) -> list[str]:
    return [i for i, r in base.items() if i in other and (depth is None or float(r["depth"]) == depth)]


def _paired_cell(base: dict, other: dict, depth: float | None) -> str:
    return paired_cell(base, other, _shared_ids(base, other, depth))


def paired_cell(base: dict, other: dict, ids: Sequence[str], *, correct_key: str = "correct") -> str:
    """One paired comparison of two methods on the instances ``ids`` (records ``{id: record}`` of each):
    ``"+gained/-lost, points [95% interval]"``, plus ``", log-prob diff +- half-width"`` (per token)
    when every record carries ``tf_logprob`` and ``n_tokens``; ``"-"`` without instances. ``correct_key``:
    the record field that says right / wrong (``correct`` in eval records, ``tf_em`` in a study's)."""
    if not ids:
        return "-"
    a, b = [float(base[i][correct_key]) for i in ids], [float(other[i][correct_key]) for i in ids]
    gained, lost = sum(y > x for x, y in zip(a, b)), sum(y < x for x, y in zip(a, b))
    acc = paired_difference(a, b)
    cell = f"+{gained}/-{lost}, {100 * acc['diff']:+.0f} [{100 * acc['ci95'][0]:+.0f}, {100 * acc['ci95'][1]:+.0f}]"
    if all(r.get("tf_logprob") is not None and r.get("n_tokens") for r in [*(base[i] for i in ids),
                                                                           *(other[i] for i in ids)]):
        lp = paired_difference([base[i]["tf_logprob"] / base[i]["n_tokens"] for i in ids],
                               [other[i]["tf_logprob"] / other[i]["n_tokens"] for i in ids],
                               bounds=(-math.inf, math.inf))  # log-probs are not bounded like accuracies
        cell += f", {lp['diff']:+.3f} +- {(lp['ci95'][1] - lp['ci95'][0]) / 2:.3f}"
    return cell


def method_folder(label: str) -> str:
    """The subfolder name of a method label (:func:`posbias.utils.run_folder.safe_name`; a variant may
    name a file: ``lpes@factors=runs/a.json``)."""
    return safe_name(label)


def comparison_table(summaries: dict[str, dict]) -> str:
    """Markdown: one row per method, one column per depth (accuracy % [95% CI]), n per cell."""
    depths = sorted({r["depth"] for s in summaries.values() for r in s["by_depth"]})
    head = "| method | " + " | ".join(f"depth {d:g}" for d in depths) + " | mean |"
    lines = [head, "|---|" + "---:|" * (len(depths) + 1)]
    for name, s in summaries.items():
        cells = {r["depth"]: r for r in s["by_depth"]}
        row = [percent_cell(cells[d]["accuracy"], cells[d]["ci_low"], cells[d]["ci_high"])
               if d in cells else "-" for d in depths]
        lines.append(f"| {name} | " + " | ".join(row) + f" | {100 * s['overall']:.1f} |")
    ns = sorted({r["n"] for s in summaries.values() for r in s["by_depth"]})
    n = "0" if not ns else str(ns[0]) if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
    lines.append(f"\naccuracy % [95% Wilson interval], n = {n} per depth")
    return "\n".join(lines)
