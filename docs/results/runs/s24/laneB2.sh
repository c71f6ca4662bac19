#!/usr/bin/env bash
# session 24, #16: ggd+ssmax's 1000x run stopped before its first instance (it was at 11-19% from 32x); instead, the
# same 128-token protocol for more seeds of ggd (1..64x three fillers, 256x grass/sky), then alibi and rope seed 0
# (the comparators), 1..64x three fillers then 256x if alive.
cd /work/main
for seed in 1 2; do
  bash runs/s24/study_c128.sh $seed runs/s24/study-c128-s$seed-ggd ggd 1,2,4,8,16,32,64 --passkey-essay --passkey-heldout --ppl-multipliers 1,4,16,64
  bash runs/s24/study_c128.sh $seed runs/s24/study-c128-s$seed-ggd ggd 256 --ppl-multipliers ''
done
for scheme in alibi rope; do
  bash runs/s24/study_c128.sh 0 runs/s24/study-c128-s0-$scheme $scheme 1,2,4,8,16,32,64 --passkey-essay --passkey-heldout --ppl-multipliers 1,4,16,64
  bash runs/s24/study_c128.sh 0 runs/s24/study-c128-s0-$scheme $scheme 256 --ppl-multipliers ''
done
