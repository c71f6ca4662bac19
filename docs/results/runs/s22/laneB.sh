#!/usr/bin/env bash
# session 22 lane B: sinusoidal (embeddings at std d^-0.5), seed 0, cap 16,000 (seed 2 was still learning at 12,000)
cd /work/main
start=$(date +%s)
bash docs/results/runs/s14/study_pd.sh 0 runs/s22/study-pd16k-sininit-s0 sinusoidal 1,2,4,8,16 16000
echo "[lane] sinusoidal std d^-0.5 seed 0 cap 16000 rc=$? in $(( $(date +%s) - start )) s"
