#!/usr/bin/env bash
# session 24, #16: ggd+ssmax seed 0 trained at 128 tokens; 1x-64x in three passkey fillers with perplexity, then 256x and
# 1000x (= 128,000 tokens) in the grass/sky filler only, 3 needles per depth (n = 9).
cd /work/main
bash runs/s24/study_c128.sh 0 runs/s24/study-c128-s0-ggd-ssmax ggd+ssmax 1,2,4,8,16,32,64 --passkey-essay --passkey-heldout --ppl-multipliers 1,4,16,64
bash runs/s24/study_c128.sh 0 runs/s24/study-c128-s0-ggd-ssmax ggd+ssmax 256,1000 --ppl-multipliers ''
