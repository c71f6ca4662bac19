#!/usr/bin/env bash
# session 28: after the alibi 1000x resume (runs/s28/resume_alibi.sh) ends, #13's control-point ablation on Qwen:
# Bezier with 6 control points, same budget / seed / split as the 4-point search, then the 150 held-out instances.
set -ex
cd /work/main
while pgrep -f resume_alibi.sh > /dev/null; do sleep 20; done
OMP_NUM_THREADS=1 .venv/bin/posbias search --model qwen2.5-coder-0.5b --preset standard --objective logprob --seed 0 \
  --heldout-n 0 --control-points 6 --out runs/s28/qwen-search-6pt
while pgrep -f runs/s28/laneA.sh > /dev/null; do sleep 20; done  # one process per run folder
cp runs/s28/qwen-search-6pt/best_factors.json docs/results/qwen2.5-coder-0.5b_kv100_6pt_seed0_factors.json
OMP_NUM_THREADS=1 .venv/bin/posbias compare --model qwen2.5-coder-0.5b --task kv --num-keys 100 --n 30 --seed 0 --batch-size 4 \
  --methods lpes@factors=docs/results/qwen2.5-coder-0.5b_kv100_6pt_seed0_factors.json --out runs/s8/compare-qwen-kv100
