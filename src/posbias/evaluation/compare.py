"""Several methods side by side on the same held-out instances (one model load)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from posbias.evaluation.plots import plot_accuracy_by_depth
from posbias.evaluation.session import run_eval
from posbias.utils.io import append_jsonl, atomic_write_text, prepare_run_dir


def compare_methods(*, model: str, task: str, methods: list[str], depths: list[float], n: int, out: str | Path,
                    method_options: dict[str, dict[str, Any]] | None = None, seed: int = 0, mode: str = "teacher-forced",
                    batch_size: int = 8, chat: bool = False, task_options: dict | None = None, loaded=None) -> dict:
    """Evaluate every method in ``methods`` into ``out/<method>`` and write a joint table and plot.

    Returns ``{method: summary}``. Each method's folder resumes independently.
    """
    from posbias.models import load_model

    method_options = method_options or {}
    out = prepare_run_dir(out, {"model": model, "task": task, "methods": methods, "depths": depths, "n": n,
                                "seed": seed, "mode": mode, "chat": chat, "task_options": task_options or {},
                                "method_options": method_options})
    loaded = loaded or load_model(model)
    summaries = {}
    for name in methods:
        start = time.time()
        summaries[name] = run_eval(model=model, task=task, depths=depths, n=n, out=out / name, seed=seed, split="eval",
                                   mode=mode, batch_size=batch_size, chat=chat, method=name,
                                   method_options=method_options.get(name, {}), task_options=task_options,
                                   loaded=loaded)
        append_jsonl(out / "metrics.jsonl", {"method": name, "overall": summaries[name]["overall"],
                                             "by_depth": summaries[name]["by_depth"],
                                             "seconds": round(time.time() - start, 1)})
    atomic_write_text(out / "comparison.md", comparison_table(summaries) + "\n")
    plot_accuracy_by_depth({m: s["by_depth"] for m, s in summaries.items()}, out / "comparison.png",
                           title=f"{model} / {task}")
    return summaries


def comparison_table(summaries: dict[str, dict]) -> str:
    """Markdown: one row per method, one column per depth (accuracy % [95% CI]), n per cell."""
    depths = sorted({r["depth"] for s in summaries.values() for r in s["by_depth"]})
    head = "| method | " + " | ".join(f"depth {d:g}" for d in depths) + " | mean |"
    lines = [head, "|---|" + "---:|" * (len(depths) + 1)]
    for name, s in summaries.items():
        cells = {r["depth"]: r for r in s["by_depth"]}
        row = [f"{100 * cells[d]['accuracy']:.0f} [{100 * cells[d]['ci_low']:.0f}, {100 * cells[d]['ci_high']:.0f}]"
               if d in cells else "-" for d in depths]
        lines.append(f"| {name} | " + " | ".join(row) + f" | {100 * s['overall']:.1f} |")
    n = next(iter(summaries.values()))["by_depth"][0]["n"] if summaries else 0
    lines.append(f"\naccuracy % [95% Wilson interval], n = {n} per depth")
    return "\n".join(lines)
