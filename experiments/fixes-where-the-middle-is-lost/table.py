"""Held-out table of the fixes on Qwen2.5-Coder-0.5B's 4K-token word-KV bed, each paired with the bed's `none` row.

    script experiments/fixes-where-the-middle-is-lost/table.py --runs runs/fixes-where-the-middle-is-lost \
        --bed runs/where-the-middle-is-lost/qwen2.5-coder-0.5b/kv340 --out docs/results/fixes-where-the-middle-is-lost

Writes ``heldout.md`` (accuracy by depth per method, then questions gained / lost, accuracy difference
[95% Newcombe interval] and per-token gold log-prob difference, by depth, for the middle third and all) and
``heldout.json``. A method folder is any ``<runs>/<model>/kv340-*`` with a ``results.jsonl`` of all 150 ids.
Likewise ``search.md`` / ``search.json`` for the search-split runs (10 contexts x 5 depths) of the prompt-level
methods tuned there (``tune-attention-sorting-kv340/<order>``), paired with the search split's ``none``
(``tune-calibration-kv340/none``); a run still going is shown with the questions it has.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from posbias.evaluation.compare import paired_cell
from posbias.utils.io import atomic_write_json, atomic_write_text, read_jsonl

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
MIDDLE = (0.25, 0.5, 0.75)
MODEL = "qwen2.5-coder-0.5b"


def records(folder: Path) -> dict[str, dict]:
    """``{id: record}`` of one eval run folder."""
    return {r["id"]: r for r in read_jsonl(folder / "results.jsonl")}


def ids_at(recs: dict[str, dict], depths) -> list[str]:
    return sorted(i for i, r in recs.items() if r["depth"] in depths)


def accuracy(recs: dict[str, dict], ids) -> float:
    return 100 * sum(float(recs[i]["correct"]) for i in ids) / len(ids)


def method_rows(runs: Path, bed: Path) -> dict[str, dict[str, dict]]:
    """``{label: records}``: ``none`` (the bed) first, then each complete method folder."""
    none = records(bed)
    out = {"none": none}
    for folder in sorted((runs / MODEL).glob("kv340-*")):
        if (folder / "results.jsonl").exists():
            recs = records(folder)
            if set(recs) == set(none):
                out[folder.name.removeprefix("kv340-")] = recs
    return out


def search_rows(runs: Path) -> dict[str, dict[str, dict]]:
    """``{label: records}`` of the search split: ``none`` first, then each attention-sorting order (any number of
    its questions; pairs are taken on the questions both have)."""
    base = runs / MODEL
    out = {"none": records(base / "tune-calibration-kv340" / "none")}
    for folder in sorted((base / "tune-attention-sorting-kv340").glob("*")):
        if (folder / "results.jsonl").exists():
            out[f"attention sorting, most attended {folder.name}"] = records(folder)
    return out


def table(rows: dict[str, dict[str, dict]]) -> tuple[str, dict]:
    none = rows["none"]
    rows = {label: {i: r for i, r in recs.items() if i in none} for label, recs in rows.items()}
    head = "| method | " + " | ".join(f"{d:g}" for d in DEPTHS) + " | middle third | all |"
    lines = ["Accuracy % by depth (n per depth in brackets where a run is unfinished):", "", head,
             "|---|" + "---:|" * (len(DEPTHS) + 2)]
    data: dict[str, dict] = {}
    for label, recs in rows.items():
        cells = [accuracy(recs, ids_at(recs, (d,))) for d in DEPTHS]
        middle, every = accuracy(recs, ids_at(recs, MIDDLE)), accuracy(recs, list(recs))
        counts = [len(ids_at(recs, (d,))) for d in DEPTHS]
        shown = [f"{c:.0f}" + ("" if k == max(counts) and len(recs) == len(none) else f" (n {k})")
                 for c, k in zip(cells, counts)]
        lines.append(f"| {label} | " + " | ".join(shown) + f" | {middle:.0f} | {every:.0f} |")
        data[label] = {"by_depth": dict(zip(map(str, DEPTHS), cells)), "middle": middle, "all": every}
    lines += ["", "Paired with `none` on the same questions: gained / lost, accuracy difference in points "
              "[95% Newcombe interval], per-token gold log-prob difference +- 95% half-width:", "",
              "| method | " + " | ".join(f"{d:g}" for d in DEPTHS) + " | middle third | all |",
              "|---|" + "---|" * (len(DEPTHS) + 2)]
    for label, recs in rows.items():
        if label == "none":
            continue
        groups = [(d,) for d in DEPTHS] + [MIDDLE, DEPTHS]
        cells = [paired_cell(none, recs, ids_at(recs, g)) for g in groups]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        data[label]["paired"] = dict(zip([*map(str, DEPTHS), "middle", "all"], cells))
    return "\n".join(lines) + "\n", data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=Path("runs/fixes-where-the-middle-is-lost"))
    ap.add_argument("--bed", type=Path, default=Path(f"runs/where-the-middle-is-lost/{MODEL}/kv340"))
    ap.add_argument("--out", type=Path, default=Path("docs/results/fixes-where-the-middle-is-lost"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("heldout", method_rows(args.runs, args.bed)), ("search", search_rows(args.runs))):
        if len(rows) > 1:
            text, data = table(rows)
            atomic_write_text(args.out / f"{name}.md", text)
            atomic_write_json(args.out / f"{name}.json", data)
            print(f"{name}:\n{text}")


if __name__ == "__main__":
    main()
