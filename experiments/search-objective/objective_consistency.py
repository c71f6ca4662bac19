"""Which search objective ranks genomes more consistently across two disjoint search splits?

    OMP_NUM_THREADS=1 .venv/bin/python experiments/search-objective/objective_consistency.py --model smollm2-135m \
        --num-keys 30 --contexts 12 --genomes 20 --out runs/objective-smollm2

``--genomes`` random genomes of the curve-constrained GA (plus the identity) are scored on two
disjoint sets of shared KV contexts of equal cost (search split, seeds 0 and 1; ``--contexts``
contexts x 3 depths each). For each objective (``accuracy``: teacher-forced exact match with the
log-prob tie-break; ``logprob``: the depth-weighted mean per-token gold log-probability) the
Spearman rank correlation between the two splits' rankings is reported, with a bootstrap interval
over genomes. Every genome's scores are appended to ``--out/scores.jsonl`` (a rerun resumes).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from posbias.models import get_decoder_layers, load_model
from posbias.search.fitness import DEFAULT_DEPTHS, TeacherForcedFitness
from posbias.search.ga import GAConfig, genome_factors, identity_genome, random_genome
from posbias.tasks.kv import make_kv
from posbias.utils.io import append_jsonl, read_jsonl


def spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def bootstrap(a, b, reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a), np.asarray(b)
    vals = []
    for _ in range(reps):
        idx = rng.integers(0, len(a), len(a))
        if len(set(a[idx])) > 1 and len(set(b[idx])) > 1:
            vals.append(spearman(a[idx], b[idx]))
    return float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))


def ranking_keys(rows: list[dict], objective: str, split: str) -> list[float]:
    """One sortable number per genome: lexicographic keys flattened (the tie-break is << one step)."""
    if objective == "accuracy":
        return [r[split]["accuracy"] + 1e-6 * r[split]["mean_logprob"] for r in rows]
    return [r[split]["weighted_logprob"] for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--num-keys", type=int, default=30)
    ap.add_argument("--contexts", type=int, default=12, help="shared contexts per split (x 3 depths)")
    ap.add_argument("--genomes", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out", default="runs/objective-consistency")
    args = ap.parse_args()


    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_model(args.model)
    n_layers = len(get_decoder_layers(model))
    cfg = GAConfig()
    rng = np.random.default_rng(args.seed)
    genomes = [identity_genome(cfg)] + [random_genome(rng, cfg) for _ in range(args.genomes)]
    fits = {}
    for name, seed in (("A", 0), ("B", 1)):
        insts = make_kv(n=args.contexts, depths=list(DEFAULT_DEPTHS), seed=seed, split="search",
                        num_keys=args.num_keys, shared_context=True)
        fits[name] = TeacherForcedFitness(model, tok, insts, batch_size=args.batch_size, chat=False)
    path = out / "scores.jsonl"
    done = {json.dumps(r["genome"]) for r in read_jsonl(path)} if path.exists() else set()
    for i, g in enumerate(genomes):
        if json.dumps(g.to_list()) in done:
            continue
        factors = [float(f) for f in genome_factors(g, cfg, n_layers)]
        row = {"genome": g.to_list(), "factors": factors}
        start = time.perf_counter()
        for name, fit in fits.items():
            row[name] = fit.score(factors).summary()
        row["seconds"] = time.perf_counter() - start
        append_jsonl(path, row)
        print(f"genome {i + 1}/{len(genomes)}: A acc {row['A']['accuracy']:.3f} lp {row['A']['weighted_logprob']:.3f}"
              f" | B acc {row['B']['accuracy']:.3f} lp {row['B']['weighted_logprob']:.3f} ({row['seconds']:.0f} s)",
              flush=True)
    rows = list(read_jsonl(path))
    report = {"model": args.model, "num_keys": args.num_keys, "contexts_per_split": args.contexts,
              "questions_per_split": 3 * args.contexts, "genomes": len(rows),
              "seconds_per_genome_and_split": float(np.mean([r["seconds"] for r in rows]) / 2)}
    for objective in ("accuracy", "logprob"):
        a, b = ranking_keys(rows, objective, "A"), ranking_keys(rows, objective, "B")
        lo, hi = bootstrap(a, b)
        report[objective] = {"spearman": spearman(a, b), "ci95": [lo, hi],
                             "distinct_values_A": len(set(a)), "distinct_values_B": len(set(b))}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
