#!/usr/bin/env bash
# session 24, #16: the 1000x point. NIAH documents need ~147 tokens, so at a 128-token training context the mix is
# passkey only (rate 0.5 = the share of retrieval documents of the 256-token protocol, 0.35 + 0.15), probes passkey only.
# usage: [NBEYOND="--n-beyond 64=1"] study_c128.sh SEED OUT SCHEME MULTIPLIERS [EXTRA OPTIONS...] (default 64=3)
set -x
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel 2>/dev/null || echo /work/main)"
seed=$1; out=$2; scheme=$3; mult=$4; shift 4
OMP_NUM_THREADS=1 .venv/bin/posbias study --preset tiny --schemes "$scheme" --tokenizer bpe:1024 --train-steps 8000 --train-context 128 \
  --train-opt batch_size=8 --train-opt lr=3e-3 --train-opt warmup_steps=50 --train-opt probe_every=100 --train-opt probe_n=20 \
  --train-opt probe_target=0.95 --train-opt passkey_haystack=mixed --passkey-rate 0.5 --niah-rate 0 --depths 0,0.5,1 --n 7 \
  ${NBEYOND:---n-beyond 64=3} --modes teacher-forced --dead-after 2 --ppl-tokens 32768 --train-opt probe_tasks=passkey \
  --multipliers "$mult" --seed "$seed" --needle-draw per-depth --out "$out" "$@"
