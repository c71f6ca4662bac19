#!/usr/bin/env bash
# #13 follow-up: LPES decode overhead at 4K after fbd1742 (tables grow by missing rows) with the rotating
# method order (none, pi, lpes each run first / second / third in 3 of the 9 repetitions). Idle machine.
cd /work/main
date; git log --oneline | head -1
OMP_NUM_THREADS=2 .venv/bin/python benchmarks/latency.py --model qwen2.5-coder-0.5b --lengths 4096 --reps 9 \
  --decode 16 --threads 2 --methods none,pi,lpes --lpes-factors docs/results/qwen2.5-coder-0.5b_kv100_seed0_factors.json \
  --warmup 0 --order rotate --out runs/s31/latency_4k_rotate.json
date
