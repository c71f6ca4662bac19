"""Scored questions per second: one prompt per question, shared contexts, and greedy generation.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/scoring.py --model qwen2.5-coder-0.5b \
        --num-keys 100 --contexts 2 --questions 5,15 --reps 2 --threads 2

Word-key KV contexts (``--num-keys`` records, ~1,200 tokens for 100 keys on Qwen2.5) asked at
``k`` evenly spaced depths each. Every scorer runs on the same questions, interleaved per
repetition (one-per-question, shared k=5, shared k=15, generate, then again) so machine load affects
all alike; the best repetition of each is reported. Also checks that the shared scores equal the
one-per-question ones (exact match identical, log-probabilities within 1e-3).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from posbias.evaluation.generation import greedy_generate
from posbias.evaluation.teacher_forced import score_instances
from posbias.models import load_model
from posbias.tasks.kv import make_kv
from posbias.utils.io import atomic_write_json


def _questions(k: int, contexts: int, num_keys: int):

    depths = [i / (k - 1) for i in range(k)] if k > 1 else [0.5]
    return make_kv(n=contexts, depths=depths, seed=0, split="eval", num_keys=num_keys, shared_context=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--num-keys", type=int, default=30)
    ap.add_argument("--contexts", type=int, default=2)
    ap.add_argument("--questions", default="5,15", help="questions per shared context")
    ap.add_argument("--batch-size", type=int, default=4, help="one-per-question and generation batch size")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the result as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)


    model, tok = load_model(args.model)
    ks = [int(k) for k in args.questions.split(",")]
    sets = {k: _questions(k, args.contexts, args.num_keys) for k in ks}
    base = sets[max(ks)]
    runs = {"one prompt per question": lambda: score_instances(model, tok, base, batch_size=args.batch_size,
                                                              shared=False)}
    for k in ks:
        runs[f"shared, {k} questions"] = (lambda k=k: score_instances(model, tok, sets[k], batch_size=16))
    runs["greedy generation"] = lambda: greedy_generate(model, tok, base, max_new_tokens=args.max_new_tokens,
                                                        batch_size=args.batch_size)
    counts = {"one prompt per question": len(base), "greedy generation": len(base),
              **{f"shared, {k} questions": len(sets[k]) for k in ks}}
    best = {name: float("inf") for name in runs}
    outputs = {}
    for _ in range(args.reps):
        for name, fn in runs.items():
            start = time.perf_counter()
            outputs[name] = fn()
            best[name] = min(best[name], time.perf_counter() - start)
    single = {r["id"]: r for r in outputs["one prompt per question"]}
    shared = outputs[f"shared, {max(ks)} questions"]
    agree = all(single[r["id"]]["em"] == r["em"] for r in shared)
    max_diff = max(abs(single[r["id"]]["logprob"] - r["logprob"]) for r in shared)
    rate = {name: counts[name] / best[name] for name in runs}
    result = {"model": args.model, "num_keys": args.num_keys, "contexts": args.contexts, "threads": args.threads,
              "prompt_tokens": sum(r["prompt_tokens"] for r in shared) / len(shared),
              "questions_per_s": rate, "speedup_over_one_per_question":
                  {n: r / rate["one prompt per question"] for n, r in rate.items()},
              "shared_equals_single_em": agree, "max_logprob_diff": max_diff}
    print(json.dumps(result, indent=2))
    if args.out:

        atomic_write_json(args.out, result)


if __name__ == "__main__":
    main()
