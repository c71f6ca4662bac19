#!/usr/bin/env bash
# session 23, after laneA4.sh: ggd+ssmax seed 2 (alive at 64x) at 128x = 32K tokens, all five views, n = 9.
cd /work/main
while pgrep -f "bash laneA4.sh" > /dev/null; do sleep 20; done
STUDY_EXTRA="--ppl-multipliers 1,4,16,64 --n-beyond 64=3" bash docs/results/runs/s14/study_pd.sh 2 runs/s16/study-pd8k-s2 ggd+ssmax 1,2,4,8,16,32,64,128 8000
