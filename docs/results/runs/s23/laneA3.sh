#!/usr/bin/env bash
# session 23, after laneA2.sh: ggd+ssmax seed 1 (alive at 64x) at 128x = 32K tokens, all five views,
# 3 needles per depth (n = 9), as session 22 did for ggd seed 3.
cd /work/main
while pgrep -f "bash laneA2.sh" > /dev/null; do sleep 20; done
STUDY_EXTRA="--ppl-multipliers 1,4,16,64 --n-beyond 64=3" bash docs/results/runs/s14/study_pd.sh 1 runs/s16/study-pd8k-s1 ggd+ssmax 1,2,4,8,16,32,64,128 8000
