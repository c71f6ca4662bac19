#!/usr/bin/env bash
# session 28: replaces laneB.sh's last steps (laneB.sh was stopped while its search ran on) so that the 6-point
# curve's held-out run does not wait for laneA's compare: it is scored in a copy of runs/s8/compare-qwen-kv100
# (same instances; `none` there for the pairing), and its method folder is moved into the original afterwards.
set -ex
cd /work/main
while pgrep -f "out runs/s28/qwen-search-6pt" > /dev/null; do sleep 20; done
test "$(python3 -c 'import json; print(json.load(open("runs/s28/qwen-search-6pt/best_factors.json"))["complete"])')" = True
cp runs/s28/qwen-search-6pt/best_factors.json docs/results/qwen2.5-coder-0.5b_kv100_6pt_seed0_factors.json
mkdir -p runs/s28/compare-qwen-kv100-6pt
cp -r runs/s8/compare-qwen-kv100/none runs/s8/compare-qwen-kv100/config.json runs/s8/compare-qwen-kv100/invocations.jsonl \
  runs/s28/compare-qwen-kv100-6pt/
OMP_NUM_THREADS=1 .venv/bin/posbias compare --model qwen2.5-coder-0.5b --task kv --num-keys 100 --n 30 --seed 0 --batch-size 4 \
  --methods lpes@factors=docs/results/qwen2.5-coder-0.5b_kv100_6pt_seed0_factors.json --out runs/s28/compare-qwen-kv100-6pt
