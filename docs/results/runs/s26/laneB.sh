#!/usr/bin/env bash
# session 26, #13: Qwen's kv100 LPES factors (seed 0) on another task, multi-key NIAH (RULER multikey_2 style: needle
# haystack of distractor needles, one asked key, ~2.5K tokens), with the PI factor chosen on Qwen's kv100 search split
# (0.9). Held-out seed 0; the setting was chosen on seed-1 instances (probe_niah.sh: 100% at every depth at 1.5K and 2.5K,
# so accuracy is at the ceiling and the paired per-token gold log-prob is the measure that can move).
cd /work/main
OMP_NUM_THREADS=1 .venv/bin/posbias compare --model qwen2.5-coder-0.5b --task niah --haystack needle --num-needles 1 \
  --length 2500 --depths 0,0.5,1 --n 20 --seed 0 --batch-size 4 \
  --methods none,lpes,pi@factor=0.9 --factors docs/results/qwen2.5-coder-0.5b_kv100_seed0_factors.json \
  --out runs/s26/compare-qwen-niah-needle2500
