#!/usr/bin/env bash
# Rank consistency of the search objectives (accuracy vs log-prob) between two disjoint search splits.
# Qwen needs pip install -e '.[models]'. Page: docs/results/search-objective.
source "$(dirname "$0")/../common.sh"
OUT=runs/search-objective
OC=experiments/search-objective/objective_consistency.py

script "$OC" --model "$SMOLLM2" --num-keys 30 --contexts 8 --genomes 16 --out "$OUT/smollm2"           # 10 min
script "$OC" --model "$QWEN" --num-keys 100 --contexts 5 --genomes 12 --batch-size 4 --out "$OUT/qwen"  # 34 min
