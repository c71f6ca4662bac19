#!/usr/bin/env bash
# #13 general ability: MMLU on the fixed stratified sample (18 per subject, 1,026 questions), none vs LPES.
# One process per folder: lane A scores `none` in the main folder, lane B `lpes` in a side folder whose
# lpes/ subfolder is moved into the main one afterwards; then `... --methods none,lpes` on the main folder
# (everything resumed) writes ability.md. Lane Q: Qwen, the same, resumable per subject.
cd /work/main
lane=$1
date
common="--tasks mmlu --limit 18"
case "$lane" in
  A) OMP_NUM_THREADS=1 .venv/bin/posbias ability --model smollm2-135m --methods none $common \
       --out runs/s30/ability-smollm2-mmlu1026 ;;
  B) OMP_NUM_THREADS=1 .venv/bin/posbias ability --model smollm2-135m --methods lpes $common \
       --factors docs/results/smollm2-135m_kv30_seed0_factors.json --out runs/s30/ability-smollm2-mmlu1026-lpes ;;
  Q) OMP_NUM_THREADS=1 .venv/bin/posbias ability --model qwen2.5-coder-0.5b --methods none,lpes $common \
       --factors docs/results/qwen2.5-coder-0.5b_kv100_seed0_factors.json --out runs/s30/ability-qwen-mmlu1026 ;;
  QL) OMP_NUM_THREADS=1 .venv/bin/posbias ability --model qwen2.5-coder-0.5b --methods lpes $common \
       --factors docs/results/qwen2.5-coder-0.5b_kv100_seed0_factors.json --out runs/s30/ability-qwen-mmlu1026-lpes ;;
esac
date
