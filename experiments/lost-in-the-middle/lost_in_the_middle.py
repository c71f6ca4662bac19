"""The lost-in-the-middle sweep behind the README tables, for any model.

    OMP_NUM_THREADS=1 .venv/bin/python experiments/lost-in-the-middle/lost_in_the_middle.py --model gemma-3-270m \
        --out runs/lim-gemma --n 20 --only kv30,kv60,kv100,niah24,passkey1k,kv75file \
        --kv-path ../shared/data/lost-in-the-middle/kv-retrieval-75_keys.jsonl.gz

Each setting is one resumable ``posbias eval`` run folder under ``--out``; the combined table
(accuracy by depth, n, 95% Wilson intervals, mean prompt tokens, seconds per instance) is printed
and written to ``--out/table.md``, the curves to ``--out/lim.png``, for every finished setting in
``--out`` (also those of earlier invocations, e.g. one with another ``--mode``). Settings whose folder
is already complete are only summarised.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from posbias.evaluation.plots import plot_accuracy_by_depth
from posbias.evaluation.session import EvalConfig, run_eval
from posbias.models import load_model

# name -> (task, task options, instances per depth, batch size); --n overrides the count
SETTINGS = {
    "kv15": ("kv", {"num_keys": 15}, 10, 4),
    "kv30": ("kv", {"num_keys": 30}, 20, 4),
    "kv60": ("kv", {"num_keys": 60}, 10, 4),
    "kv100": ("kv", {"num_keys": 100}, 20, 2),
    "kv140": ("kv", {"num_keys": 140}, 20, 1),
    "niah24": ("niah", {"num_needles": 24, "length": 860}, 20, 4),
    "mdqa10": ("mdqa", {"num_docs": 10}, 20, 2),
    "passkey1k": ("passkey", {"length": 1024}, 10, 2),
    "kv30c2": ("kv", {"num_keys": 30, "key_words": 2}, 20, 4),  # compound keys: apple-river: 1234567
    "kv60c2": ("kv", {"num_keys": 60, "key_words": 2}, 20, 2),
    "kv75file": ("kv-uuid", {}, 20, 1),  # the real lost-in-the-middle file, --kv-path (~5.4K tokens)
    "kv25file": ("kv-uuid", {"num_keys": 25}, 20, 1),  # its gold pair + 24 of its other pairs (~1.8K tokens)
}
DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", default="runs/lim")
    ap.add_argument("--mdqa-path", default=None, help="nq-open-oracle.jsonl.gz (mdqa is skipped without it)")
    ap.add_argument("--kv-path", default=None, help="kv-retrieval-75_keys.jsonl.gz (kv75file is skipped without it)")
    ap.add_argument("--n", type=int, default=None, help="instances per depth for every setting (default: per setting)")
    ap.add_argument("--depths", default=None, help="comma-separated depths (default 0,0.25,0.5,0.75,1)")
    ap.add_argument("--only", default=None, help="comma-separated subset of: " + ",".join(SETTINGS))
    ap.add_argument("--mode", default="teacher-forced", help="teacher-forced | generate | both (posbias eval's "
                                                             "--mode; both adds a greedy-generation row)")
    args = ap.parse_args()

    loaded = load_model(args.model)
    names = args.only.split(",") if args.only else list(SETTINGS)
    for name in names:
        task, opts, n, bs = SETTINGS[name]
        n = args.n or n
        data = {"mdqa": args.mdqa_path, "kv-uuid": args.kv_path}.get(task, "")
        if data is None:
            continue
        if data:
            opts = {**opts, "path": data}
        start = time.time()
        depths = [float(d) for d in args.depths.split(",")] if args.depths else DEPTHS
        run_eval(EvalConfig(model=args.model, task=task, depths=depths, n=n, out=Path(args.out) / name,
                            batch_size=bs, task_options=opts, mode=args.mode), loaded=loaded)
        seconds = time.time() - start
        timing = Path(args.out) / name / "timing.json"
        if not timing.exists():  # the wall time of the run that scored it (a resume of a finished folder: 0)
            timing.write_text(json.dumps({"seconds": seconds, "instances": n * len(depths)}))
        print(f"{name}: {seconds:.0f} s", flush=True)
    finished = [name for name in SETTINGS if (Path(args.out) / name / "summary.json").exists()]
    table = summary_table(Path(args.out), finished)  # every finished setting in --out, this run's or earlier
    (Path(args.out) / "table.md").write_text(table + "\n")
    print(table)
    plot_settings(Path(args.out), finished, args.model)


def plot_settings(root: Path, names: list[str], model: str) -> None:
    """``root/lim.png``: accuracy against depth, one curve per finished setting."""

    curves = {name: json.loads((root / name / "summary.json").read_text())["by_depth"]
              for name in names if (root / name / "summary.json").exists()}
    if curves:
        plot_accuracy_by_depth(curves, root / "lim.png", title=f"{model}: accuracy by gold depth")


def summary_table(root: Path, names: list[str]) -> str:
    """One row per setting: accuracy % [95% CI] at each depth, n per depth, mean prompt tokens."""
    lines = ["| setting | tokens | n/depth | s/instance | " + " | ".join(f"depth {d:g}" for d in DEPTHS) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(DEPTHS)]
    for name in names:
        path = root / name / "summary.json"
        if not path.exists():
            continue
        summary = json.loads(path.read_text())
        results = [json.loads(x) for x in (root / name / "results.jsonl").read_text().splitlines() if x.strip()]
        tokens = sum(r.get("prompt_tokens", 0) for r in results) / max(1, len(results))
        n = summary["by_depth"][0]["n"] if summary["by_depth"] else 0
        timing = root / name / "timing.json"
        per = "-"
        if timing.exists():
            t = json.loads(timing.read_text())
            per = f"{t['seconds'] / max(1, t['instances']):.1f}"
        rows = [(name, summary["by_depth"])]  # mode both: the teacher-forced row, then greedy generation's
        if "by_depth_generate" in summary:
            rows = [(f"{name} (teacher-forced)", summary["by_depth"]),
                    (f"{name} (generation)", summary["by_depth_generate"])]
        for label, by_depth in rows:
            lines.append(f"| {label} | {tokens:.0f} | {n} | {per} | " + " | ".join(depth_cells(by_depth)) + " |")
    return "\n".join(lines)


def depth_cells(by_depth: list[dict]) -> list[str]:
    """Accuracy % [95% CI] at each of :data:`DEPTHS` ("-" where the run has no such depth)."""
    cells = {r["depth"]: r for r in by_depth}
    return [f"{100 * c['accuracy']:.0f} [{100 * c['ci_low']:.0f}, {100 * c['ci_high']:.0f}]"
            if (c := cells.get(d)) else "-" for d in DEPTHS]


if __name__ == "__main__":
    main()
