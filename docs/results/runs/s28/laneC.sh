#!/usr/bin/env bash
# session 28 (end), #13: multi-key NIAH at the depths session 26 left out (0.25, 0.75), n = 20, seed 0, same setting as
# docs/results/runs/s26/laneB.sh. Two processes, one folder each (a folder takes one process): X scores none then PI 0.9
# into runs/s28/compare-qwen-niah-mid, Y scores LPES into runs/s28/compare-qwen-niah-mid-lpes; move Y's method folder
# into X's afterwards and rerun X's command with --methods none,lpes,pi@factor=0.9 to rebuild one table. Resumable.
cd /work/main
common="--model qwen2.5-coder-0.5b --task niah --haystack needle --num-needles 1 --length 2500 --depths 0.25,0.75 --n 20 --seed 0 --batch-size 4"
lane=$1
if [ "$lane" = X ]; then
  OMP_NUM_THREADS=1 .venv/bin/posbias compare $common --methods none,pi@factor=0.9 --out runs/s28/compare-qwen-niah-mid
else
  OMP_NUM_THREADS=1 .venv/bin/posbias compare $common --methods lpes --factors docs/results/qwen2.5-coder-0.5b_kv100_seed0_factors.json \
    --out runs/s28/compare-qwen-niah-mid-lpes
fi
