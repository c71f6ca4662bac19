#!/usr/bin/env bash
# session 23, #16: SSMax on content only under the current protocol (8,000 cap, both probes, mixed filler,
# per-depth needles), seed 1, then rope+ssmax seed 0 beside session 16's rope seed 0.
cd /work/main
bash docs/results/runs/s14/study_pd.sh 1 runs/s16/study-pd8k-s1 ggd+ssmax-content 1,2,4,8,16,32,64 8000
bash docs/results/runs/s14/study_pd.sh 0 runs/s16/study-pd8k-s0 rope+ssmax 1,2,4,8,16,32,64 8000
