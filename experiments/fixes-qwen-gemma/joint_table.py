"""One paired table and one plot from method folders of different runs on the same instances.

    python experiments/fixes-qwen-gemma/joint_table.py --out runs/fixes-qwen-gemma/table-qwen \
        none=runs/.../none lpes=runs/.../lpes temperature=runs/.../temperature ...

Each ``label=folder`` names a method folder written by ``posbias eval`` / ``posbias compare``
(``results.jsonl``, ``summary.json``); the first is the reference of the paired columns. The folders
must hold the same instances (same task, seed, split, n): the ids are checked. Writes ``table.md``
(accuracy per depth with 95% Wilson intervals, then the paired differences) and ``table.png``, as
``posbias compare`` writes its own (:func:`posbias.evaluation.compare.write_comparison`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posbias.evaluation.compare import folder_records, write_comparison
from posbias.utils.io import read_json


def parse_folders(items: list[str]) -> dict[str, Path]:
    """``{label: folder}`` from ``label=folder`` arguments; each folder must hold a finished method run."""
    folders = {}
    for item in items:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            raise ValueError(f"{item!r}: give label=folder")
        folder = Path(path)
        for name in ("results.jsonl", "summary.json"):
            if not (folder / name).is_file():
                raise ValueError(f"{folder}: no {name} (a finished posbias eval / compare method folder)")
        folders[label] = folder
    return folders


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for table.md and table.png")
    ap.add_argument("--title", default="", help="plot title")
    ap.add_argument("folders", nargs="+", help="label=folder, the reference first")
    args = ap.parse_args(argv)
    try:
        folders = parse_folders(args.folders)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    records = folder_records(folders)
    ids = set(next(iter(records.values())))
    differ = [lab for lab, recs in records.items() if set(recs) != ids]
    if differ:
        print(f"error: {', '.join(differ)} scored other instances than {next(iter(records))}", file=sys.stderr)
        return 2
    summaries = {lab: read_json(f / "summary.json") for lab, f in folders.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(write_comparison(summaries, folders, out / "table", title=args.title))
    print(f"outputs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
