#!/usr/bin/env bash
# Searched factors applied to other models (each curve re-evaluated at the target's layer count by normalised
# depth), with PI 0.9 beside them; the committed factors files of each model's seed-0 search. KV_FILE=path/to/
# kv-retrieval-75_keys.jsonl.gz adds Qwen's factors on the real lost-in-the-middle file. Needs
# pip install -e '.[models]'. Page: docs/results/factor-transfer.
source "$(dirname "$0")/../common.sh"
OUT=runs/factor-transfer

posbias compare --model "$GEMMA" --task kv --num-keys 30 --n 20 --seed 0 \
  --methods "none,lpes@factors=$QWEN_FACTORS,lpes@factors=$SMOLLM2_FACTORS,pi@factor=0.9" \
  --out "$OUT/onto-gemma-kv30"
posbias compare --model "$SMOLLM2" --task kv --num-keys 30 --n 10 --seed 0 \
  --methods "none,lpes@factors=$SMOLLM2_FACTORS,lpes@factors=$QWEN_FACTORS,pi@factor=0.9" \
  --out "$OUT/onto-smollm2-kv30"
posbias compare --model "$QWEN" --task kv --num-keys 100 --n 30 --seed 0 --batch-size 4 \
  --methods "none,lpes@factors=$QWEN_FACTORS,lpes@factors=$GEMMA_FACTORS,lpes@factors=$SMOLLM2_FACTORS" \
  --out "$OUT/onto-qwen-kv100"                                                          # ~2 h
if [[ -n "${KV_FILE:-}" ]]; then
  posbias compare --model "$QWEN" --task kv-uuid --path "$KV_FILE" --num-keys 25 --depths 0,0.5,1 --n 20 \
    --seed 0 --batch-size 4 --methods none,lpes --factors "$QWEN_FACTORS" --out "$OUT/qwen-kv25file"  # 42 min
fi
