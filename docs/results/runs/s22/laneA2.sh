#!/usr/bin/env bash
# session 22 lane A, from its second step on (laneA.sh was stopped after its first step started, to put
# ggd seed 3 at 128x before alibi at 32x/64x): perplexity at 64x for every README folder, ggd s3 at 128x
cd /work/main
while pgrep -f "study-pd8k-s2 ggd 1,2,4,8,16,32,64 8000" > /dev/null; do sleep 20; done
echo "[lane] ggd s2 64x finished (laneA.sh's first step)"
step() {  # LABEL, then the command
  local label=$1; shift; local start=$(date +%s)
  "$@"; echo "[lane] $label rc=$? in $(( $(date +%s) - start )) s"
}
ppl() { STUDY_EXTRA="--ppl-multipliers 1,4,16,64 ${EXTRA:-}" bash docs/results/runs/s14/study_pd.sh "$@"; }
step "ppl s1" ppl 1 runs/s16/study-pd8k-s1 ggd,ggd+ssmax 1 8000
step "ppl s3" ppl 3 runs/s16/study-pd8k-s3 ggd 1 8000
step "ppl s0" ppl 0 runs/s16/study-pd8k-s0 ggd,alibi,rope,nope 1 8000
step "ppl s2" ppl 2 runs/s16/study-pd8k-s2 ggd,ggd+ssmax,alibi,rope,sinusoidal 1 8000
step "ppl pd12k s0" ppl 0 runs/s20/study-pd12k-s0 nope,rope 1 12000
step "ppl pd12k s2" ppl 2 runs/s20/study-pd12k-s2 nope,sinusoidal 1 12000
EXTRA="--model-opt rope_theta=10000" step "ppl rope1e4 s0" ppl 0 runs/s21/study-pd12k-rope1e4-s0 rope 1 12000
EXTRA="--model-opt rope_theta=10000" step "ppl rope1e4 s2" ppl 2 runs/s21/study-pd12k-rope1e4-s2 rope 1 12000
step "ppl sininit s2" ppl 2 runs/s21/study-pd12k-sininit-s2 sinusoidal 1 12000
EXTRA="--n-beyond 64=3" step "ggd s3 128x" ppl 3 runs/s16/study-pd8k-s3 ggd 1,2,4,8,16,32,64,128 8000
step "alibi s0 64x" bash docs/results/runs/s14/study_pd.sh 0 runs/s16/study-pd8k-s0 alibi 1,2,4,8,16,32,64 8000
