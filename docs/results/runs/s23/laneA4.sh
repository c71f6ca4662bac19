#!/usr/bin/env bash
# session 23, after laneA3.sh: ggd seed 1 (alive at 64x) at 128x = 32K tokens, all five views, n = 9.
cd /work/main
while pgrep -f "bash laneA3.sh" > /dev/null; do sleep 20; done
STUDY_EXTRA="--ppl-multipliers 1,4,16,64 --n-beyond 64=3" bash docs/results/runs/s14/study_pd.sh 1 runs/s16/study-pd8k-s1 ggd 1,2,4,8,16,32,64,128 8000
