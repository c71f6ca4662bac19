#!/usr/bin/env bash
# session 22 lane B, second part: perplexity at 64x for the new sinusoidal run, then alibi seed 0 at 32x/64x
cd /work/main
step() { local label=$1; shift; local start=$(date +%s); "$@"; echo "[lane] $label rc=$? in $(( $(date +%s) - start )) s"; }
STUDY_EXTRA="--ppl-multipliers 1,4,16,64" step "ppl sininit s0" bash docs/results/runs/s14/study_pd.sh 0 runs/s22/study-pd16k-sininit-s0 sinusoidal 1 16000
STUDY_EXTRA="--ppl-multipliers 1,4,16,64" step "alibi s0 64x" bash docs/results/runs/s14/study_pd.sh 0 runs/s16/study-pd8k-s0 alibi 1,2,4,8,16,32,64 8000
