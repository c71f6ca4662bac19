#!/usr/bin/env bash
# session 26, #16: 1000x (128,000 tokens, grass/sky filler, n = 9) for ggd seed 3 of the 128-token protocol
# (seeds 0-2 were measured in sessions 24-25).
cd /work/main
bash runs/s24/study_c128.sh 3 runs/s24/study-c128-s3-ggd ggd 1000 --ppl-multipliers ''
