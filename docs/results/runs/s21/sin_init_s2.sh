#!/usr/bin/env bash
cd /work/main
while pgrep -f "study-pd8k-s0" > /dev/null; do sleep 30; done
start=$(date +%s)
bash docs/results/runs/s14/study_pd.sh 2 runs/s21/study-pd12k-sininit-s2 sinusoidal 1,2,4,8,16 12000
echo "[lane] sinusoidal (embeddings at std d^-0.5) seed 2 done rc=$? in $(( $(date +%s) - start )) s"
