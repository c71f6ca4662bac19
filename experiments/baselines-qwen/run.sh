#!/usr/bin/env bash
# Baselines on Qwen2.5-Coder-0.5B, kv 100 keys, on the LPES page's 150 held-out instances, and multi-key NIAH.
# PI and Ms-PoE are tuned on the LPES search split; `lpes` is the committed seed-0 factors file (run
# experiments/lpes-qwen/run.sh and pass FACTORS=runs/lpes-qwen/search-s0/best_factors.json to use your own).
# Needs pip install -e '.[models]'. Page: docs/results/baselines-qwen.
source "$(dirname "$0")/../common.sh"
OUT=runs/baselines-qwen
FACTORS=${FACTORS:-$QWEN_FACTORS}

posbias tune --model "$QWEN" --task kv --num-keys 100 --methods pi,ms-poe --n-per-depth 12 --seed 0 \
  --batch-size 4 --out "$OUT/tune-kv100"                                                # ~2.5 h
posbias train-moice --model "$QWEN" --steps 100 --seq-len 512 --seed 0 --out "$OUT/moice"   # 33 min
posbias compare --model "$QWEN" --task kv --num-keys 100 --n 30 --seed 0 --batch-size 4 \
  --methods none,lpes,pi,ms-poe@r_min=1.2@r_max=1.8,ms-poe,attention-buckets,moice \
  --factors "$FACTORS" --settings "$OUT/tune-kv100/best_settings.json" --routers "$OUT/moice" \
  --out "$OUT/compare-kv100"                                                            # ~6 h (AB ~2.5 h)

NIAH=(compare --model "$QWEN" --task niah --haystack needle --num-needles 1 --length 2500 --n 20 --seed 0
      --batch-size 4 --methods none,lpes,pi@factor=0.9 --factors "$FACTORS")
posbias "${NIAH[@]}" --depths 0,0.5,1 --out "$OUT/compare-niah-needle2500"              # ~85 min
posbias "${NIAH[@]}" --depths 0.25,0.75 --out "$OUT/compare-niah-mid"                   # ~55 min
