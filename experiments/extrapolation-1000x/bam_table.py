"""The BAM reference's long-range passkey protocol beside posbias's: one markdown table from the folders
``bam_protocol.sh`` writes (``ROOT/<model>/[posbias-]given<0|1>-<m>x/summary.json``), exact match %
[95% Wilson] (right / n, mean seconds per instance) per model, template, setting and length.
A "first digit given" cell with no folder of its own is read from the given0 pass's ``tf_hits`` (digits
2-5 right: the same tokens at the same positions, teacher-forced), marked "same pass".

usage: bam_table.py ROOT [OUT.md]
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from posbias.evaluation.stats import percent_cell, wilson_interval
from posbias.utils.io import atomic_write_text, read_json, read_jsonl

FOLDER = re.compile(r"(posbias-)?given(\d)-(\d+)x")
TEMPLATES = {"": "bam", "posbias-": "posbias"}


def cells(model: Path) -> dict[tuple[str, int, int], str]:
    """``{(template, given, multiplier): "acc [lo, hi] (k/n, s)"}`` of one model's folders."""
    out = {}
    for run in sorted(model.iterdir()):
        m = FOLDER.fullmatch(run.name)
        if not m or not (run / "summary.json").exists():
            continue
        summary = read_json(run / "summary.json")
        depth = summary["by_depth"][0]
        right = round(depth["accuracy"] * depth["n"])
        seconds = mean_seconds(run, summary)
        shown = f"{seconds:.0f}" if seconds >= 100 else f"{seconds:.2g}"
        out[TEMPLATES[m[1] or ""], int(m[2]), int(m[3])] = (
            f"{percent_cell(depth['accuracy'], depth['ci_low'], depth['ci_high'])} ({right}/{depth['n']}, "
            f"{shown} s)")
    for template, _, mult in [k for k in out if k[1] == 0]:
        prefix = next(p for p, t in TEMPLATES.items() if t == template)
        derived = first_digit_given(model / f"{prefix}given0-{mult}x")
        if (template, 1, mult) not in out and derived:
            out[template, 1, mult] = derived
    return out


def mean_seconds(run: Path, summary: dict) -> float:
    """Mean seconds per instance: the records' own (eval records carry them), else the summary's total
    over its instances (exact only for a run that was not resumed)."""
    timed = [r["seconds"] for r in read_jsonl(run / "results.jsonl") if "seconds" in r]
    if timed:
        return sum(timed) / len(timed)
    return summary.get("seconds_this_invocation", 0) / max(1, summary["n_instances"])


def first_digit_given(run: Path) -> str | None:
    """The "first digit given" cell read from a given0 run's per-digit hits, or None without them."""
    records = read_jsonl(run / "results.jsonl")
    if not records or any("tf_hits" not in r for r in records):
        return None
    right, n = sum(all(r["tf_hits"][1:]) for r in records), len(records)
    return f"{percent_cell(right / n, *wilson_interval(right, n))} ({right}/{n}, same pass)"


def table(root: Path) -> str:
    models = sorted(p for p in root.iterdir() if p.is_dir())
    found = {m.name: cells(m) for m in models}
    mults = sorted({k[2] for c in found.values() for k in c})
    lines = ["| model | template | first digit given | " + " | ".join(f"{m}x" for m in mults) + " |",
             "|---|---|---|" + "---|" * len(mults)]
    for name, c in found.items():
        for template in sorted({k[0] for k in c}):
            for given in (0, 1):
                row = [c.get((template, given, m), "not run") for m in mults]
                lines.append(f"| {name} | {template} | {'yes (4 digits scored)' if given else 'no (5 digits)'} | "
                             + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if not argv or not Path(argv[0]).is_dir():
        print("usage: bam_table.py ROOT [OUT.md] (ROOT: the folder bam_protocol.sh wrote into)", file=sys.stderr)
        return 2
    text = table(Path(argv[0]))
    if len(argv) > 1:
        atomic_write_text(argv[1], text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
