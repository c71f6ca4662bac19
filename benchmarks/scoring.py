"""Instances per second: teacher-forced scoring vs greedy generation, on the same instances.

    .venv/bin/python benchmarks/scoring.py --model smollm2-135m --task kv --n 4 --max-new-tokens 16

Both scorers run interleaved (tf, gen, tf, gen, ...) on the same instances in one process so
machine load affects both alike. Also reports how often the two agree (teacher-forced exact
match vs the task metric on the generated text).
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="kv")
    ap.add_argument("--n", type=int, default=4, help="instances per depth")
    ap.add_argument("--depths", default="0,0.5,1")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--out", default=None, help="write the result as JSON here")
    args = ap.parse_args()

    from posbias.evaluation.generation import greedy_generate
    from posbias.evaluation.metrics import score
    from posbias.evaluation.teacher_forced import score_teacher_forced
    from posbias.models import load_model
    from posbias.tasks import make_instances

    model, tok = load_model(args.model)
    insts = make_instances(args.task, tokenizer=tok, n=args.n, depths=[float(d) for d in args.depths.split(",")],
                           seed=0, split="eval")
    times = {"teacher-forced": [], "generate": []}
    tf = gen = None
    for _ in range(args.reps):
        t = time.perf_counter()
        tf = score_teacher_forced(model, tok, insts, batch_size=args.batch_size, chat=args.chat)
        times["teacher-forced"].append(time.perf_counter() - t)
        t = time.perf_counter()
        gen = greedy_generate(model, tok, insts, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                              chat=args.chat)
        times["generate"].append(time.perf_counter() - t)
    gen_scores = [score(i.metric, p, i.answers) for i, p in zip(insts, gen)]
    agree = sum(float(r["em"]) == (s >= 1.0) for r, s in zip(tf, gen_scores)) / len(insts)
    result = {
        "model": args.model, "task": args.task, "instances": len(insts), "threads": torch.get_num_threads(),
        "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
        "inst_per_s": {k: len(insts) / min(v) for k, v in times.items()},
        "speedup_tf_over_generate": min(times["generate"]) / min(times["teacher-forced"]),
        "agreement": agree, "tf_accuracy": sum(r["em"] for r in tf) / len(insts),
        "generate_accuracy": sum(gen_scores) / len(insts),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        from posbias.utils.io import atomic_write_json

        atomic_write_json(args.out, result)


if __name__ == "__main__":
    main()
