#!/bin/bash
# Session 29, lane C (#16): the 128x point (16,384 tokens, grass/sky noise, 3 needles per depth, n = 9) for every
# model of the 128-token protocol still alive at 64x, beside its 256x and 1000x columns; runs after lane B.
cd /work/main
while pgrep -f "runs/s29/laneB.sh" > /dev/null; do sleep 30; done
for run in s0-ggd:ggd s1-ggd:ggd s2-ggd:ggd s3-ggd:ggd s0-ggd-ssmax:ggd+ssmax s1-ggd-ssmax:ggd+ssmax s0-alibi:alibi; do
  folder=${run%%:*}; scheme=${run##*:}; seed=${folder:1:1}
  bash docs/results/runs/s24/study_c128.sh $seed runs/s24/study-c128-$folder $scheme 128 --ppl-multipliers ''
done
