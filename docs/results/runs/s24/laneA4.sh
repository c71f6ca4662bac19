#!/usr/bin/env bash
# session 24, after laneA2.sh: the same folder at 64x (16K tokens), noise and held-out text.
cd /work/main
while pgrep -f "bash laneA2.sh" > /dev/null; do sleep 20; done
set -x
OMP_NUM_THREADS=1 .venv/bin/posbias study --preset tiny --schemes ggd --tokenizer bpe:1024 --train-steps 8000 --train-context 256 \
  --train-opt batch_size=8 --train-opt lr=3e-3 --train-opt warmup_steps=50 --train-opt probe_every=100 --train-opt probe_n=20 \
  --train-opt probe_target=0.95 --train-opt passkey_haystack=mixed --passkey-rate 0.5 --niah-rate 0 --depths 0,0.5,1 --n 7 \
  --n-beyond 64=3 --modes teacher-forced --dead-after 2 --ppl-tokens 32768 --train-opt probe_tasks=passkey \
  --multipliers 1,2,4,8,16,32,64 --seed 0 --needle-draw per-depth --out runs/s24/study-c256pk-s0-ggd --passkey-heldout \
  --ppl-multipliers 1
