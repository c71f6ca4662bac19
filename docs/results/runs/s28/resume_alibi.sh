#!/usr/bin/env bash
# session 28, #16: resume alibi seed 0 at 1000x (last of 9 instances; session 27 ended at 8/9)
set -x
cd /work/main
bash runs/s24/study_c128.sh 0 runs/s24/study-c128-s0-alibi alibi 1000 --ppl-multipliers '' > runs/s28/laneB-alibi-resume.log 2>&1
