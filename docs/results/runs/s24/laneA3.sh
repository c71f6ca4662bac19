#!/usr/bin/env bash
# session 24, after lane_ggd.sh: a fourth ggd seed under the 128-token protocol, 1x-64x in three fillers, then 256x.
cd /work/main
while pgrep -f "bash lane_ggd.sh" > /dev/null; do sleep 20; done
bash runs/s24/study_c128.sh 3 runs/s24/study-c128-s3-ggd ggd 1,2,4,8,16,32,64 --passkey-essay --passkey-heldout --ppl-multipliers 1,4,16,64
bash runs/s24/study_c128.sh 3 runs/s24/study-c128-s3-ggd ggd 256 --ppl-multipliers ''
