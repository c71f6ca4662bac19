#!/usr/bin/env bash
# session 25, #16: 1000x (128,000 tokens, grass/sky filler) for more ggd seeds of the 128-token protocol.
# Seed 1 had one needle per depth (n = 3); the default --n-beyond 64=3 adds needles i1 and i2 at every depth
# (the per-depth draw is nested: i0 is the one already scored), giving n = 9. (Its seed-3 line was dropped before it
# started, for laneA2.sh: 90 min would not have fitted the session.)
cd /work/main
bash runs/s24/study_c128.sh 1 runs/s24/study-c128-s1-ggd ggd 1000 --ppl-multipliers ''
