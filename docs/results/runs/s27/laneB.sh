#!/usr/bin/env bash
# session 27, #16: complete 1000x (128,000 tokens, grass/sky noise) to n = 9 (3 needles per depth) for ggd+ssmax
# seed 0 and alibi seed 0 of the 128-token protocol; session 26 scored the first needle per depth (nested draw),
# so this adds needles i1, i2 per depth. One thread, one scheme after the other.
set -x
cd /work/main
bash runs/s24/study_c128.sh 0 runs/s24/study-c128-s0-ggd-ssmax ggd+ssmax 1000 --ppl-multipliers '' > runs/s27/laneB-ggd-ssmax.log 2>&1
bash runs/s24/study_c128.sh 0 runs/s24/study-c128-s0-alibi alibi 1000 --ppl-multipliers '' > runs/s27/laneB-alibi.log 2>&1
