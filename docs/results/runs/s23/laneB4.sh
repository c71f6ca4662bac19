#!/usr/bin/env bash
# session 23: the 256x point in held-out text too (noise view done and skipped); --ppl-multipliers 1 (done, skipped) because --passkey-heldout needs the perplexity split.
cd /work/main
while pgrep -f "bash laneB3.sh" > /dev/null; do sleep 20; done
set -x
OMP_NUM_THREADS=1 .venv/bin/posbias study --preset tiny --schemes ggd --tokenizer bpe:1024 --train-steps 8000 --train-context 256 \
  --train-opt batch_size=8 --train-opt lr=3e-3 --train-opt warmup_steps=50 --train-opt probe_every=100 --train-opt probe_n=20 \
  --train-opt probe_target=0.95 --train-opt passkey_haystack=mixed --passkey-rate 0.35 --niah-rate 0.15 --depths 0,0.5,1 --n 7 \
  --n-beyond 64=3 --modes teacher-forced --dead-after 2 --ppl-multipliers 1 --ppl-tokens 32768 \
  --train-opt niah_haystack=mixed --train-opt probe_tasks=passkey,niah --multipliers 256 --passkey-heldout \
  --seed 3 --needle-draw per-depth --out runs/s16/study-pd8k-s3
