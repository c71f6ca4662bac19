#!/usr/bin/env bash
# One scheme of the 128-token protocol (1000x = 128,000 tokens): passkey documents only (rate 0.5, half
# grass/sky noise, half training sentences; NIAH documents need ~147 tokens), trained until the passkey probe
# holds >= 95% three probes in a row (cap 8,000 steps), 7 fresh needles per depth to 64x, 3 beyond.
# usage: study.sh SEED OUT SCHEME MULTIPLIERS [EXTRA OPTIONS...]; NBEYOND overrides "--n-beyond 64=3".
source "$(dirname "$0")/../common.sh"
seed=$1; out=$2; scheme=$3; mult=$4; shift 4
# shellcheck disable=SC2086  # NBEYOND is a list of options
posbias study --preset tiny --schemes "$scheme" --tokenizer bpe:1024 --train-steps 8000 --train-context 128 \
  --train-opt batch_size=8 --train-opt lr=3e-3 --train-opt warmup_steps=50 --train-opt probe_every=100 \
  --train-opt probe_n=20 --train-opt probe_target=0.95 --train-opt passkey_haystack=mixed --passkey-rate 0.5 \
  --niah-rate 0 --depths 0,0.5,1 --n 7 ${NBEYOND:---n-beyond 64=3} --modes teacher-forced --dead-after 2 \
  --ppl-tokens 32768 --train-opt probe_tasks=passkey --multipliers "$mult" --seed "$seed" --needle-draw per-depth \
  --out "$out" "$@"
