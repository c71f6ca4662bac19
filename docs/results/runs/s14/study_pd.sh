#!/usr/bin/env bash
# #16: both-probes protocol, per-depth needles, one scheme per call, the seed and the study folder as arguments
# (s13/study_s1.sh calls it with seed 1).
# usage: study_pd.sh SEED OUT SCHEME MULTIPLIERS [TRAIN_STEPS (default 4000: the cap of seeds 0-3 in sessions 11-17)]
#        [SCHEDULE (cosine | constant | wsd; default: none passed = the trainer's cosine, as in sessions 11-18)]
# STUDY_EXTRA="--model-opt rope_theta=10000" adds options (session 21's RoPE-base run).
set -x
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"  # the repository root, wherever the script is copied
OMP_NUM_THREADS=1 .venv/bin/posbias study --preset tiny --schemes "$3" --tokenizer bpe:1024 --train-steps "${5:-4000}" --train-context 256 \
  --train-opt batch_size=8 --train-opt lr=3e-3 --train-opt warmup_steps=50 --train-opt probe_every=100 --train-opt probe_n=20 \
  --train-opt probe_target=0.95 --train-opt passkey_haystack=mixed --passkey-rate 0.35 --niah-rate 0.15 --depths 0,0.5,1 --n 7 \
  --modes teacher-forced --passkey-essay --passkey-heldout --dead-after 2 --ppl-multipliers 1,4,16 --ppl-tokens 32768 \
  --train-opt niah_haystack=mixed --train-opt probe_tasks=passkey,niah --niah --niah-essay --multipliers "$4" \
  --seed "$1" --needle-draw per-depth --out "$2" ${6:+--train-opt schedule=$6} ${STUDY_EXTRA:-}
