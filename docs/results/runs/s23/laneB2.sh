#!/usr/bin/env bash
# session 23, after laneB.sh: ggd seed 3 (the best at 64x and 128x) at 256x = 64K tokens, passkey in the
# grass/sky noise only, 3 needles per depth (n = 9), no perplexity (laneA2.sh, which tried this first,
# was refused: fixed in this session, an invocation without perplexity now resumes).
cd /work/main
while pgrep -f "bash laneB.sh" > /dev/null; do sleep 20; done
set -x
OMP_NUM_THREADS=1 .venv/bin/posbias study --preset tiny --schemes ggd --tokenizer bpe:1024 --train-steps 8000 --train-context 256 \
  --train-opt batch_size=8 --train-opt lr=3e-3 --train-opt warmup_steps=50 --train-opt probe_every=100 --train-opt probe_n=20 \
  --train-opt probe_target=0.95 --train-opt passkey_haystack=mixed --passkey-rate 0.35 --niah-rate 0.15 --depths 0,0.5,1 --n 7 \
  --n-beyond 64=3 --modes teacher-forced --dead-after 2 --ppl-multipliers '' --ppl-tokens 32768 \
  --train-opt niah_haystack=mixed --train-opt probe_tasks=passkey,niah --multipliers 256 \
  --seed 3 --needle-draw per-depth --out runs/s16/study-pd8k-s3
