#!/usr/bin/env bash
# #16: both-probes protocol, seed 1, per-depth needles: schemes beside ggd in runs/s12/study-niahprobe-s1.
# usage: study_s1.sh SCHEME MULTIPLIERS  (the command is docs/results/runs/s14/study_pd.sh's, seed 1)
exec bash "$(dirname "$0")/../s14/study_pd.sh" 1 runs/s12/study-niahprobe-s1 "$1" "$2"
