#!/usr/bin/env bash
# session 25, replaces the rest of laneA2.sh (its bash was stopped while its first study evaluated): the passkey+NIAH
# run of seed 0 at 2,300 steps had not learned passkeys at all (probe 0%), so it is cut again where its passkey probe
# first held the target three probes in a row (step 2,800 in runs/s16/study-pd8k-s0: the passkey-only stopping rule on
# the passkey+NIAH mix), then passkey-only trained on to 6,500 steps (probe target off).
cd /work/main
while pgrep -f "study-c256pkniah-s0-ggd-at2300" > /dev/null; do sleep 20; done
bash runs/s25/study_mix.sh 0 runs/s25/study-c256pkniah-s0-ggd-at2800 pkniah 1,2,4,8,16,32,64 --train-opt final_step=2800
PROBE_TARGET=0 bash runs/s25/study_mix.sh 0 runs/s25/study-c256pk-s0-ggd-at6500 pk 1,2,4,8,16,32,64 --train-opt final_step=6500
