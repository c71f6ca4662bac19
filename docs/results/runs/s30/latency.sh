#!/usr/bin/env bash
# #13: 4K latency of every Qwen method, 5 repetitions, methods interleaved, idle machine (session 30).
cd /work/main
date
OMP_NUM_THREADS=2 .venv/bin/python benchmarks/latency.py --model qwen2.5-coder-0.5b --lengths 4096 --reps 5 --decode 16 --threads 2 --methods none,pi,lpes,ms-poe,moice,attention-buckets --lpes-factors docs/results/qwen2.5-coder-0.5b_kv100_seed0_factors.json --warmup 0 --out runs/s30/latency_4k.json
date
