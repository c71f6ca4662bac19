#!/usr/bin/env bash
# session 27, #13: the paper's curve-type ablation on Qwen, same budget as the bezier seed-0 search
# (standard preset, objective logprob, seed 0, same search split), then the found curve on the same 150
# held-out instances as every row of runs/s8/compare-qwen-kv100. One thread.
set -ex
cd /work/main
OMP_NUM_THREADS=1 .venv/bin/posbias search --model qwen2.5-coder-0.5b --preset standard --objective logprob --seed 0 \
  --heldout-n 0 --curve linear --out runs/s27/qwen-search-linear
cp runs/s27/qwen-search-linear/best_factors.json docs/results/qwen2.5-coder-0.5b_kv100_linear_seed0_factors.json
OMP_NUM_THREADS=1 .venv/bin/posbias compare --model qwen2.5-coder-0.5b --task kv --num-keys 100 --n 30 --seed 0 --batch-size 4 \
  --methods lpes@factors=docs/results/qwen2.5-coder-0.5b_kv100_linear_seed0_factors.json --out runs/s8/compare-qwen-kv100
