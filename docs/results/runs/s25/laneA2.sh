#!/usr/bin/env bash
# (Its bash was stopped after the first study had started; only that first study ran. The rest became laneA3.sh.)
# session 25, after laneA.sh's seed 1 (its seed 3 part is skipped: 90 min would not fit): mix or tokens, seed 0.
#  (1) passkey+NIAH cut at 2,300 steps (4.7M tokens: where passkey-only met its target) on the same 8,000-step schedule;
#  (2) passkey-only trained on to 6,500 steps (13.3M tokens: where passkey+NIAH met its target), probe target off.
cd /work/main
while pgrep -f "study-c128-s1-ggd" > /dev/null; do sleep 20; done
bash runs/s25/study_mix.sh 0 runs/s25/study-c256pkniah-s0-ggd-at2300 pkniah 1,2,4,8,16,32,64 --train-opt final_step=2300
PROBE_TARGET=0 bash runs/s25/study_mix.sh 0 runs/s25/study-c256pk-s0-ggd-at6500 pk 1,2,4,8,16,32,64 --train-opt final_step=6500
