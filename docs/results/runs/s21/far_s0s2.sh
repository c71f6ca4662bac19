#!/usr/bin/env bash
# session 21: seed 0 ran; this lane was stopped before seed 2 (its slot went to the base-10,000 RoPE seed 2)
cd /work/main
while pgrep -f "sin12k_s2.sh" > /dev/null; do sleep 30; done
for seed in 0 2; do
  start=$(date +%s)
  bash docs/results/runs/s14/study_pd.sh $seed runs/s16/study-pd8k-s$seed ggd 1,2,4,8,16,32,64 8000
  echo "[lane] ggd seed $seed 64x done rc=$? in $(( $(date +%s) - start )) s"
done
