#!/bin/bash
# Session 29, lane B (#16): the second seed of session 25's 6,500-step passkey-only run (256-token context,
# probe target off, cut at step 6,500 = 13.3M tokens), passkey in the noise and in held-out text, 1x-64x.
cd /work/main
PROBE_TARGET=0 bash docs/results/runs/s25/study_mix.sh 1 runs/s29/study-c256pk-s1-ggd-at6500 pk 1,2,4,8,16,32,64 \
  --train-opt final_step=6500
