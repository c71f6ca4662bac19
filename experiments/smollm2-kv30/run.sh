#!/usr/bin/env bash
# SmolLM2-135M, kv 30 keys: the demo, the standard LPES search with its held-out table, MoICE routers and
# every method on the same 50 held-out instances. SmolLM2 comes with the base install. Page: docs/results/smollm2-kv30.
source "$(dirname "$0")/../common.sh"
OUT=runs/smollm2-kv30

posbias demo --out "$OUT/demo"                                                          # 452 s
posbias search --model "$SMOLLM2" --task kv --preset standard --seed 0 --heldout-n 20 --out "$OUT/search"  # 9-34 min
posbias train-moice --model "$SMOLLM2" --steps 100 --seq-len 512 --seed 0 --out "$OUT/moice"  # 19 min
posbias compare --model "$SMOLLM2" --task kv --num-keys 30 --n 10 --seed 0 \
  --methods none,pi@factor=1.1,ms-poe,moice,attention-buckets,lpes --routers "$OUT/moice" \
  --factors "$OUT/search/best_factors.json" --out "$OUT/compare-kv30"                   # 16 min
