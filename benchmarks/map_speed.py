"""How long the default position-bias map takes, and what the shared prefill saves.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/map_speed.py --out runs/map_speed --json map_speed.json

1. Times ``posbias map`` on ``--model`` with the map's defaults (11 depths x 4 lengths, n = 10 per
   cell, ``--methods none``) into ``--out`` (a fresh folder: a resumed one would time nothing),
   and counts its prompt prefills and scored questions (``metrics.jsonl``).
2. On a sub-grid (``--sub-lengths``, ``--sub-n`` contexts per length, every depth) scores the same
   questions twice, interleaved per repetition: the map's way (one prefill per context, all its
   depths from it) and one prompt per question; reports the time of each, the prefills and the
   ratio, and checks that both give the same exact matches and log-probabilities (within 1e-3).

The machine's load average is recorded at the start and the end (timings on a shared machine say
little without it).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from posbias.evaluation.batching import model_max_positions
from posbias.evaluation.bias_map import (
    DEFAULT_LENGTHS,
    MapConfig,
    grid_instances,
    map_lengths,
    prefills_of,
    question_groups,
    run_map,
    score_group,
)
from posbias.models import load_model
from posbias.utils.io import atomic_write_json, read_jsonl
from posbias.utils.options import parse_names


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def time_map(cfg, loaded) -> dict:
    """Run the map ``cfg`` (a fresh folder, checked by :func:`main`) and return its wall time, prefills
    and questions."""
    start = time.perf_counter()
    summary = run_map(cfg, loaded, log=print)
    seconds = time.perf_counter() - start
    rows = read_jsonl(Path(cfg.out) / "metrics.jsonl")
    return {"seconds": round(seconds, 1), "scoring_seconds": round(sum(r["seconds"] for r in rows), 1),
            "prefills": sum(r["prefills"] for r in rows), "questions": sum(r["questions"] for r in rows),
            "lengths": summary["lengths"], "n_per_cell": summary["n_per_cell"], "depths": len(summary["depths"])}


def compare_prefills(cfg, loaded, lengths, reps: int) -> dict:
    """Shared prefill vs one prompt per question on the same questions (best of ``reps``)."""
    model, tok = loaded
    grid = map_lengths(cfg, model_max_positions(model))
    chosen = [x for x in grid if x.spec in lengths or str(x.tokens) in lengths] or grid[:1]
    by_length = {x.tokens: grid_instances(cfg, tok, x, 0) for x in chosen}
    modes = (("shared prefill", True), ("one prompt per question", False))
    best = {name: float("inf") for name, _ in modes}
    scores: dict[str, dict] = {}
    for _ in range(reps):
        for name, shared in modes:
            start = time.perf_counter()
            scores[name] = {(L, r["id"]): r for L, insts in by_length.items()
                            for g in question_groups(insts, cfg.batch_size, shared)
                            for r in score_group(model, tok, g, cfg, shared=shared)}
            best[name] = min(best[name], time.perf_counter() - start)
    a, b = scores["shared prefill"], scores["one prompt per question"]
    same = all(a[k]["correct"] == b[k]["correct"] and abs(a[k]["tf_logprob"] - b[k]["tf_logprob"]) <= 1e-3 for k in a)
    prefills = {name: sum(prefills_of(g, model, shared) for insts in by_length.values()
                          for g in question_groups(insts, cfg.batch_size, shared)) for name, shared in modes}
    instances = [i for insts in by_length.values() for i in insts]
    return {"lengths": [x.tokens for x in chosen], "questions": len(instances),
            "seconds": {k: round(v, 2) for k, v in best.items()}, "prefills": prefills,
            "speedup": round(best["one prompt per question"] / best["shared prefill"], 2), "same_scores": same}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="alias, HF folder or .gguf")
    ap.add_argument("--out", default="runs/map_speed", help="a fresh map folder")
    ap.add_argument("--lengths", default=",".join(DEFAULT_LENGTHS))
    ap.add_argument("--depths", type=int, default=11, help="evenly spaced depths 0..1")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--methods", default="none")
    ap.add_argument("--sub-lengths", default="0.0625w,0.125w", help="lengths of the shared-vs-single comparison")
    ap.add_argument("--sub-n", type=int, default=2, help="contexts per length in the comparison")
    ap.add_argument("--reps", type=int, default=1, help="repetitions of the comparison (best kept)")
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--json", default=None, help="write the result here")
    args = ap.parse_args(argv)

    if Path(args.out).exists() and any(Path(args.out).iterdir()):
        raise SystemExit(f"{args.out} is not empty: give a fresh --out (a resumed map would time nothing)")

    depths = [round(i / (args.depths - 1), 4) for i in range(args.depths)] if args.depths > 1 else [0.5]
    cfg = MapConfig(model=args.model, out=args.out, lengths=parse_names(args.lengths), depths=depths, n=args.n,
                    methods=parse_names(args.methods), bootstrap=args.bootstrap)
    result = {"model": args.model, "cpu_count": os.cpu_count(), "load_average_start": load_average()}
    start = time.perf_counter()
    loaded = load_model(args.model)
    result["load_seconds"] = round(time.perf_counter() - start, 1)
    result["map"] = time_map(cfg, loaded)
    sub = MapConfig(**{**cfg.__dict__, "n": args.sub_n, "out": args.out + "_sub"})
    result["shared_vs_single"] = compare_prefills(sub, loaded, parse_names(args.sub_lengths), args.reps)
    result["load_average_end"] = load_average()
    print(json.dumps(result, indent=1))
    if args.json:
        atomic_write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
