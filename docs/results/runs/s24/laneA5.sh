#!/usr/bin/env bash
# session 24, end: 1000x for ggd seed 1 with one needle per depth (n = 3; the session had ~35 min left), an indication
# of a second seed at 128,000 tokens, not the n >= 8.
cd /work/main
NBEYOND='--n-beyond 64=1' bash runs/s24/study_c128.sh 1 runs/s24/study-c128-s1-ggd ggd 1000 --ppl-multipliers ''
