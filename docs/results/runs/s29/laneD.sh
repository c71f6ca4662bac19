#!/bin/bash
# Session 29, lane D (#16): 1000x (128,000 tokens, grass/sky noise, 3 needles per depth = 9) for ggd+ssmax seed 1 of
# the 128-token protocol, which sessions 27-28 wrongly called dead (it finds 1-2 needles at every length to 256x);
# starts when lane A ends; ~9-10 min per instance, so it resumes in the next session (instance-level resume).
cd /work/main
while pgrep -f "runs/s29/laneA.sh" > /dev/null; do sleep 30; done
bash docs/results/runs/s24/study_c128.sh 1 runs/s24/study-c128-s1-ggd-ssmax ggd+ssmax 1000 --ppl-multipliers ''
