#!/usr/bin/env bash
# The context / mix / training-length ablation: ggd at the 256-token context with either training mix, scored on
# passkey in the grass/sky noise and in held-out text (1x-64x, n = 21 per length).
#   MIX = pk      passkey only (rate 0.5, passkey probe), as the 128-token protocol
#   MIX = pkniah  passkey 0.35 + RULER single-needle 0.15, both probes, as the 256-token protocol
# usage: [PROBE_TARGET=0.95] mix.sh SEED OUT MIX MULTIPLIERS [EXTRA OPTIONS, e.g. --train-opt final_step=2800]
source "$(dirname "$0")/../common.sh"
seed=$1; out=$2; mix=$3; mult=$4; shift 4
case "$mix" in
  pk) data=(--passkey-rate 0.5 --niah-rate 0 --train-opt probe_tasks=passkey) ;;
  pkniah) data=(--passkey-rate 0.35 --niah-rate 0.15 --train-opt niah_haystack=mixed --train-opt probe_tasks=passkey,niah) ;;
  *) echo "MIX must be pk or pkniah, got $mix" >&2; exit 2 ;;
esac
posbias study --preset tiny --schemes ggd --tokenizer bpe:1024 --train-steps 8000 --train-context 256 \
  --train-opt batch_size=8 --train-opt lr=3e-3 --train-opt warmup_steps=50 --train-opt probe_every=100 \
  --train-opt probe_n=20 --train-opt probe_target="${PROBE_TARGET:-0.95}" --train-opt passkey_haystack=mixed \
  "${data[@]}" --depths 0,0.5,1 --n 7 --n-beyond 64=3 --modes teacher-forced --dead-after 2 --ppl-tokens 32768 \
  --passkey-heldout --ppl-multipliers 1 --multipliers "$mult" --seed "$seed" --needle-draw per-depth --out "$out" "$@"
