"""Forward time per 1K tokens and peak memory of each model, one fresh process per model.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/model_cost.py \
        --models smollm2-135m,gemma-3-270m,qwen2.5-coder-0.5b --tokens 1024 --reps 3 --threads 2

Each model is loaded in its own subprocess (so peak resident memory is that model's alone), then
runs ``--reps`` teacher-forced forward passes over ``--tokens`` random tokens with logits only at
the last position (as the scorer does). Reports load time, the median forward time and the peak
RSS of the process (``ru_maxrss``: weights in fp32 + activations + the Python/torch runtime).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def measure(model: str, tokens: int, reps: int, threads: int) -> dict:

    import torch  # noqa: PLC0415 (heavy: only the measuring child process loads torch)

    torch.set_num_threads(threads)
    from posbias.models import load_model  # noqa: PLC0415 (heavy: only the measuring child process loads torch)

    start = time.perf_counter()
    lm, _ = load_model(model)
    load_s = time.perf_counter() - start
    ids = torch.randint(100, 1000, (1, tokens), generator=torch.Generator().manual_seed(0))
    times = []
    with torch.inference_mode():
        lm(input_ids=ids[:, :64], logits_to_keep=1)  # warm-up
        for _ in range(reps):
            start = time.perf_counter()
            lm(input_ids=ids, logits_to_keep=1)
            times.append(time.perf_counter() - start)
    params = sum(p.numel() for p in lm.parameters())
    return {"model": model, "tokens": tokens, "threads": threads, "load_s": round(load_s, 1),
            "forward_s": [round(t, 3) for t in times], "forward_median_s": round(statistics.median(times), 3),
            "params_m": round(params / 1e6, 1),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m,gemma-3-270m,qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.tokens, args.reps, args.threads)))
        return
    rows = []
    for model in args.models.split(","):
        cmd = [sys.executable, __file__, "--child", model, "--tokens", str(args.tokens), "--reps", str(args.reps),
               "--threads", str(args.threads)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n| model | params | load (cached) | forward / {args.tokens} tokens | peak RSS |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['params_m']}M | {r['load_s']} s | {r['forward_median_s']} s | {r['peak_rss_gb']} "
              "GB |")


if __name__ == "__main__":
    main()
