#!/usr/bin/env bash
# session 25, last: the passkey-only runs cut at exactly the steps of the passkey+NIAH cuts (tokens equal), probe
# target off (the first steps are those of the runs above: same seed and config). One seed per process.
cd /work/main
seed=$1; step=$2
PROBE_TARGET=0 bash runs/s25/study_mix.sh $seed runs/s25/study-c256pk-s$seed-ggd-at$step pk 1,2,4,8,16,32,64 --train-opt final_step=$step
