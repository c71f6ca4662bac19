#!/usr/bin/env bash
# session 23, #16: SSMax on content only, seed 2, then rope+ssmax seed 2 (same folder, one after the other).
cd /work/main
bash docs/results/runs/s14/study_pd.sh 2 runs/s16/study-pd8k-s2 ggd+ssmax-content 1,2,4,8,16,32,64 8000
bash docs/results/runs/s14/study_pd.sh 2 runs/s16/study-pd8k-s2 rope+ssmax 1,2,4,8,16,32,64 8000
