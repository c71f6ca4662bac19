#!/usr/bin/env bash
# Lost in the middle on three models: one resumable `posbias eval` folder per setting, n = 20 per depth, seed 0.
# Needs pip install -e '.[models]' (Qwen, Gemma). KV_FILE=path/to/kv-retrieval-75_keys.jsonl.gz (the
# lost-in-the-middle data) adds the kv25file rows. Page: docs/results/lost-in-the-middle.
source "$(dirname "$0")/../common.sh"
OUT=runs/lost-in-the-middle
LIM=experiments/lost-in-the-middle/lost_in_the_middle.py

declare -A SETTINGS=(
  [$QWEN]=kv60,kv100,niah24,passkey1k
  [$GEMMA]=kv30,kv60,kv100,kv30c2,kv60c2,passkey1k
  [$SMOLLM2]=kv30,kv60,niah24,passkey1k
)
for model in "$QWEN" "$GEMMA" "$SMOLLM2"; do
  script "$LIM" --model "$model" --out "$OUT/$model" --n 20 --only "${SETTINGS[$model]}"
  if [[ -n "${KV_FILE:-}" ]]; then
    script "$LIM" --model "$model" --out "$OUT/$model" --n 20 --depths 0,0.5,1 --only kv25file --mode both --kv-path "$KV_FILE"
  fi
done
# Gemma's multi-key NIAH with greedy generation beside teacher forcing (Gemma answers in the needle's form)
script "$LIM" --model "$GEMMA" --out "$OUT/$GEMMA" --n 20 --only niah24 --mode both
