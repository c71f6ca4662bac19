"""Does a study model fit its training text better than the held-out text? (a generalisation gap)

For each model of each study folder: perplexity at its training context (non-overlapping windows)
on the last ``--tokens`` tokens of the held-out split (what ``perplexity.jsonl`` reports at 1x) and
on the last ``--tokens`` tokens of the training split (``data/train.jsonl``, text the model trained
on, possibly for many epochs), plus the training steps and tokens from its ``metrics.jsonl``. A
large gap that grows with the steps says the held-out perplexity measures memorisation of a small
corpus, not the positional scheme.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/study_generalisation.py runs/s9/study-mixed-s0 \\
        runs/s10/study-mixed-s1

Writes nothing; prints one markdown row per model (seconds each for the tiny preset).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path


def steps_and_tokens(model_dir: Path) -> tuple[int | None, int | None]:
    """The last step and the tokens seen, from a trained model's ``metrics.jsonl``."""
    from posbias.utils.io import read_jsonl

    rows = read_jsonl(model_dir / "metrics.jsonl")
    stops = [r for r in rows if "stopped_by" in r]
    if stops:
        return stops[-1]["step"], stops[-1].get("tokens")
    steps = [r["step"] for r in rows if "step" in r]
    return (max(steps) if steps else None), None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("studies", nargs="+", help="study folders (with data/train.jsonl and data/heldout.jsonl)")
    ap.add_argument("--tokens", type=int, default=32768, help="tokens of each split to score")
    args = ap.parse_args()

    from posbias.evaluation.perplexity import perplexity
    from posbias.study.grid import eval_tokens_from_corpus
    from posbias.study.training import load_trained
    from posbias.utils.io import read_json

    print("| study | model | steps | training tokens | ppl training text | ppl held-out text | ratio | s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for study in map(Path, args.studies):
        context = int(read_json(study / "config.json")["config"]["train_context"])
        for name, rel in read_json(study / "models.json").items():
            start = time.time()
            model_dir = study / rel
            model, tok = load_trained(model_dir, device="cpu")
            ppl = {split: perplexity(model, eval_tokens_from_corpus(tok, str(study / "data" / f"{split}.jsonl"),
                                                                    args.tokens), context=context)["ppl"]
                   for split in ("train", "heldout")}
            steps, tokens = steps_and_tokens(model_dir.parent if model_dir.name == "final" else model_dir)
            print(f"| {study} | {name} | {steps} | {tokens} | {ppl['train']:.1f} | {ppl['heldout']:.1f} | "
                  f"{ppl['heldout'] / ppl['train']:.2f} | {time.time() - start:.0f} |", flush=True)
            assert math.isfinite(ppl["train"]) and math.isfinite(ppl["heldout"])


if __name__ == "__main__":
    main()
