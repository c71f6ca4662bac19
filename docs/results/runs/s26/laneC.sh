#!/usr/bin/env bash
# session 26, #16: first needle per depth (n = 3) at 1000x (128,000 tokens, grass/sky noise) for ggd+ssmax seed 0 and
# alibi seed 0 of the 128-token protocol, one core each, in the ~35 min left of the session. The per-depth draw is
# nested, so a later run with the default --n-beyond 64=3 on the same folder adds needles i1, i2 (n = 9).
cd /work/main
NBEYOND="--n-beyond 64=1" bash runs/s24/study_c128.sh 0 runs/s24/study-c128-s0-ggd-ssmax ggd+ssmax 1000 --ppl-multipliers '' > runs/s26/laneC-ggd-ssmax.log 2>&1 &
NBEYOND="--n-beyond 64=1" bash runs/s24/study_c128.sh 0 runs/s24/study-c128-s0-alibi alibi 1000 --ppl-multipliers '' > runs/s26/laneC-alibi.log 2>&1 &
wait
