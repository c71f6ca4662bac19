#!/usr/bin/env bash
cd /work/main
while pgrep -f "rope1e4_s0.sh" > /dev/null; do sleep 30; done
start=$(date +%s)
STUDY_EXTRA="--model-opt rope_theta=10000" bash docs/results/runs/s14/study_pd.sh 2 runs/s21/study-pd12k-rope1e4-s2 rope 1,2,4,8,16 12000
echo "[lane] rope theta 1e4 seed 2 done rc=$? in $(( $(date +%s) - start )) s"
