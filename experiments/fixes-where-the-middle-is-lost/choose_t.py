"""The calibration temperature chosen on the search split: the ``t<value>`` folder with the highest accuracy, then
the highest mean gold log-prob per token (``posbias tune``'s order of objectives). Prints the value."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def score(folder: Path) -> tuple[float, float]:
    records = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    return (statistics.fmean(float(r["tf_em"]) for r in records),
            statistics.fmean(r["tf_logprob"] / r["n_tokens"] for r in records))


def main(root: str) -> str:
    folders = [f for f in Path(root).glob("t*") if (f / "results.jsonl").is_file()]
    if not folders:
        raise SystemExit(f"no t* folders with results under {root}")
    return max(folders, key=score).name[1:]


if __name__ == "__main__":
    print(main(sys.argv[1]))
