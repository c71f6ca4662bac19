#!/usr/bin/env bash
# session 25, replaces laneB2.sh (stopped while it waited): mix or tokens, seed 1. Passkey-only to its target, then the
# passkey+NIAH run of seed 1 cut where its passkey probe first held the target (step 2,900 in runs/s16/study-pd8k-s1).
cd /work/main
while pgrep -f "bash runs/s25/laneB.sh" > /dev/null; do sleep 20; done
bash runs/s25/study_mix.sh 1 runs/s25/study-c256pk-s1-ggd pk 1,2,4,8,16,32,64
bash runs/s25/study_mix.sh 1 runs/s25/study-c256pkniah-s1-ggd-at2900 pkniah 1,2,4,8,16,32,64 --train-opt final_step=2900
