#!/usr/bin/env bash
# Latency of every method (ratios to the unpatched model, methods interleaved per repetition), LPES's
# per-forward overhead, and the per-model cost. Run on an otherwise idle machine: ratios are only comparable
# inside one run. Qwen and Gemma need pip install -e '.[models]'. Each latency.py run resumes at its next
# repetition. Page: docs/results/latency.
source "$(dirname "$0")/../common.sh"
OUT=runs/latency
mkdir -p "$OUT"
LAT=(benchmarks/latency.py --model "$QWEN" --decode 16 --threads 2 --lpes-factors "$QWEN_FACTORS")
ALL=none,pi,lpes,ms-poe,moice,attention-buckets

OMP_NUM_THREADS=1 script benchmarks/model_cost.py --models "$SMOLLM2,$GEMMA,$QWEN" --tokens 1024 --reps 3 \
  --threads 1 | tee "$OUT/model_cost.txt"
OMP_NUM_THREADS=1 script benchmarks/lpes_overhead.py --lengths 1024,4096 --reps 4 --threads 1 \
  | tee "$OUT/lpes_overhead.txt"
export OMP_NUM_THREADS=2
script "${LAT[@]}" --lengths 1024 --reps 5 --methods "$ALL" --out "$OUT/qwen_1k.json"              # 10 min
script "${LAT[@]}" --lengths 1024,2048,4096 --reps 2 --decode 4 --methods none,lpes --warmup 1 \
  --out "$OUT/qwen_scaling.json"                                                                    # 9 min
script "${LAT[@]}" --lengths 4096 --reps 5 --methods "$ALL" --warmup 0 --order fixed \
  --out "$OUT/qwen_4k_5reps.json"                                                                   # 91 min
script "${LAT[@]}" --lengths 4096 --reps 9 --methods none,pi,lpes --warmup 0 --order rotate \
  --out "$OUT/qwen_4k_rotate_9reps.json"                                                            # 32 min
script benchmarks/latency.py --model "$SMOLLM2" --lengths 1024,2048 --reps 4 --decode 16 --threads 2 \
  --methods none,ms-poe,ms-poe@rotated_cache=false,moice,moice@rotated_cache=false \
  --out "$OUT/smollm2_rotated_cache.json"                                                           # 7.5 min
