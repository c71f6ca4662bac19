#!/bin/bash
# Session 29, lane A (#13): MoICE routers on Qwen retrained the session-5 way (the 2026-12-01 folder
# did not survive), then MoICE scored on the 150 held-out instances in runs/s8/compare-qwen-kv100.
set -e
cd /work/main
export OMP_NUM_THREADS=${THREADS:-2}
.venv/bin/posbias train-moice --model qwen2.5-coder-0.5b --steps 100 --seq-len 512 --seed 0 \
  --out runs/s29/moice-qwen
.venv/bin/posbias compare --model qwen2.5-coder-0.5b --task kv --num-keys 100 --n 30 --seed 0 \
  --batch-size 4 --methods moice --routers runs/s29/moice-qwen --out runs/s8/compare-qwen-kv100
