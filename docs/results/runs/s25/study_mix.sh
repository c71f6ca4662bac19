#!/usr/bin/env bash
# session 25, #16: mix or tokens? ggd at the study's 256-token context with either training mix, evaluated on passkey
# in the grass/sky noise and in held-out text (1x-64x, n = 21 per length).
#   MIX = pk      passkey only (rate 0.5, passkey probe): session 24's runs/s24/laneA2.sh protocol
#   MIX = pkniah  passkey 0.35 + RULER single-needle 0.15, both probes: the 256-token protocol of sessions 14-23
# usage: [PROBE_TARGET=0.95] study_mix.sh SEED OUT MIX MULTIPLIERS [EXTRA OPTIONS, e.g. --train-opt final_step=2300]
set -x
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel 2>/dev/null || echo /work/main)"
seed=$1; out=$2; mix=$3; mult=$4; shift 4
case "$mix" in
  pk) data=(--passkey-rate 0.5 --niah-rate 0 --train-opt probe_tasks=passkey) ;;
  pkniah) data=(--passkey-rate 0.35 --niah-rate 0.15 --train-opt niah_haystack=mixed --train-opt probe_tasks=passkey,niah) ;;
  *) echo "MIX must be pk or pkniah, got $mix" >&2; exit 2 ;;
esac
OMP_NUM_THREADS=1 .venv/bin/posbias study --preset tiny --schemes ggd --tokenizer bpe:1024 --train-steps 8000 --train-context 256 \
  --train-opt batch_size=8 --train-opt lr=3e-3 --train-opt warmup_steps=50 --train-opt probe_every=100 --train-opt probe_n=20 \
  --train-opt probe_target="${PROBE_TARGET:-0.95}" --train-opt passkey_haystack=mixed "${data[@]}" --depths 0,0.5,1 --n 7 \
  --n-beyond 64=3 --modes teacher-forced --dead-after 2 --ppl-tokens 32768 --passkey-heldout --ppl-multipliers 1 \
  --multipliers "$mult" --seed "$seed" --needle-draw per-depth --out "$out" "$@"
