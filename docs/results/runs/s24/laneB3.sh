#!/usr/bin/env bash
# session 24, after laneB2.sh: ggd+ssmax seed 1 under the 128-token protocol (seed 0 was at 19-33% from 4x), 1x-64x then 256x.
cd /work/main
while pgrep -f "bash laneB2.sh" > /dev/null; do sleep 20; done
bash runs/s24/study_c128.sh 1 runs/s24/study-c128-s1-ggd-ssmax ggd+ssmax 1,2,4,8,16,32,64 --passkey-essay --passkey-heldout --ppl-multipliers 1,4,16,64
bash runs/s24/study_c128.sh 1 runs/s24/study-c128-s1-ggd-ssmax ggd+ssmax 256 --ppl-multipliers ''
