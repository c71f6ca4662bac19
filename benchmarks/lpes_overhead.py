"""LPES overhead: forward latency of the per-layer-scaled model vs the unpatched one.

Patched and unpatched forwards are interleaved (A B A B ...) in one process so drift in machine
load hits both alike; the median of each is reported with their ratio (target <= 1.02: the patch
only adds one cos/sin computation per distinct factor per forward).

    .venv/bin/python benchmarks/lpes_overhead.py --lengths 1024,4096 --reps 5
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from posbias.models import get_decoder_layers, load_model
from posbias.patching.rope_scaling import apply_layer_scaling, load_factors_file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", default="1024,4096", help="comma-separated token counts")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--factors", default=None, help="factors file (default: a distinct factor per layer, worst case)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = ap.parse_args()


    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_model(args.model)
    n_layers = len(get_decoder_layers(model))
    if args.factors:
        factors = load_factors_file(args.factors, num_layers=n_layers)["factors"]
    else:  # every layer its own factor: the most cos/sin work the patch can add
        factors = [0.8 + 0.4 * i / max(n_layers - 1, 1) for i in range(n_layers)]
    distinct = len(set(f for f in factors if f != 1.0))
    vocab = model.config.vocab_size
    print(f"model {args.model}: {n_layers} layers, {distinct} distinct factors != 1, threads {torch.get_num_threads()}")
    print(f"{'tokens':>7} {'unpatched s':>12} {'patched s':>10} {'ratio':>7}")
    for n in [int(x) for x in args.lengths.split(",") if x.strip()]:
        ids = torch.randint(10, vocab - 1, (1, n), generator=torch.Generator().manual_seed(n))
        times = {"base": [], "lpes": []}
        with torch.inference_mode():
            for rep in range(args.warmup + args.reps):
                for kind in (("base", "lpes") if rep % 2 == 0 else ("lpes", "base")):
                    handle = apply_layer_scaling(model, factors) if kind == "lpes" else None
                    t0 = time.perf_counter()
                    model(input_ids=ids, use_cache=False, logits_to_keep=1)
                    dt = time.perf_counter() - t0
                    if handle is not None:
                        handle.remove()
                    if rep >= args.warmup:
                        times[kind].append(dt)
        b, p = statistics.median(times["base"]), statistics.median(times["lpes"])
        print(f"{n:>7} {b:>12.3f} {p:>10.3f} {p / b:>7.3f}", flush=True)


if __name__ == "__main__":
    main()
