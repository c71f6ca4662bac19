#!/usr/bin/env bash
# LPES on Qwen2.5-Coder-0.5B, kv 100 keys: searches (seeds 0 and 1, three more curve families), the held-out
# table of every found curve on the same 150 instances, and the CKA analysis. Needs pip install -e '.[models]'.
# Page: docs/results/lpes-qwen.
source "$(dirname "$0")/../common.sh"
OUT=runs/lpes-qwen
SEARCH=(search --model "$QWEN" --preset standard --objective logprob --heldout-n 0)

posbias "${SEARCH[@]}" --seed 0 --out "$OUT/search-s0"                                  # 91 min
posbias "${SEARCH[@]}" --seed 1 --generations 4 --out "$OUT/search-s1"                  # 99 min
posbias "${SEARCH[@]}" --seed 0 --curve linear --out "$OUT/search-linear"               # 60 min
posbias "${SEARCH[@]}" --seed 0 --curve step --out "$OUT/search-step"                   # 65 min
posbias "${SEARCH[@]}" --seed 0 --control-points 6 --out "$OUT/search-cp6"              # 70 min

methods=none
for s in s0 s1 linear step cp6; do methods+=",lpes@factors=$OUT/search-$s/best_factors.json"; done
posbias compare --model "$QWEN" --task kv --num-keys 100 --n 30 --seed 0 --batch-size 4 \
  --methods "$methods" --out "$OUT/compare-kv100"                                       # ~30 min per method

posbias analyze --model "$QWEN" --task kv --num-keys 100 --n 2 --controls 3 --seed 0 \
  --factors "$OUT/search-s0/best_factors.json" --out "$OUT/cka"                         # 28 min
