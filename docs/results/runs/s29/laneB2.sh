#!/bin/bash
# Session 29, lane B2 (#13): the rows of the 2026-12-01 table whose folders did not survive (LPES seed 0 and
# seed 1, tuned PI 0.9, Ms-PoE at its published 1.2-1.8), rescored on the same 150 held-out instances, in a
# copy of runs/s8/compare-qwen-kv100 holding `none` (lane A holds that folder); the method folders are
# moved into it afterwards and its table rebuilt.
cd /work/main
while pgrep -f "runs/s29/lane[BC].sh" > /dev/null; do sleep 30; done
set -e
export OMP_NUM_THREADS=1
dst=runs/s29/compare-qwen-kv100-b
if [ ! -d $dst ]; then
  mkdir -p $dst && cp runs/s8/compare-qwen-kv100/config.json $dst/ && cp -r runs/s8/compare-qwen-kv100/none $dst/
fi
.venv/bin/posbias compare --model qwen2.5-coder-0.5b --task kv --num-keys 100 --n 30 --seed 0 --batch-size 4 \
  --methods none,lpes@factors=docs/results/qwen2.5-coder-0.5b_kv100_seed0_factors.json,pi@factor=0.9,lpes@factors=docs/results/qwen2.5-coder-0.5b_kv100_seed1_factors.json,ms-poe@r_min=1.2@r_max=1.8 \
  --out $dst
