#!/usr/bin/env bash
# session 25, #16: 1000x (128,000 tokens, grass/sky filler, n = 9) for ggd seed 2 of the 128-token protocol
# (the seed at 56% at 256x), beside laneA.sh.
cd /work/main
bash runs/s24/study_c128.sh 2 runs/s24/study-c128-s2-ggd ggd 1000 --ppl-multipliers ''
