#!/usr/bin/env bash
# session 26, #13: choose a multi-key NIAH setting where unpatched Qwen has a middle to rescue (seed 1 instances,
# not the held-out seed 0 ones): RULER multikey_2 style (needle haystack), ~1.5K and ~2.5K tokens, n = 4 per depth.
cd /work/main
for L in 1500 2500; do
OMP_NUM_THREADS=1 .venv/bin/posbias compare --model qwen2.5-coder-0.5b --task niah --haystack needle --num-needles 1 \
  --length $L --depths 0,0.5,1 --n 4 --seed 1 --batch-size 4 --methods none --out runs/s26/probe-niah-needle-$L
done
