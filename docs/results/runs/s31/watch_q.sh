#!/usr/bin/env bash
# Stop lane Q once `none` is complete (57 subjects), so it does not start lpes in its own folder.
cd /work/main
while [ "$(grep -c task_done runs/s30/ability-qwen-mmlu1026/none/samples.jsonl)" -lt 57 ]; do sleep 20; done
date; pkill -f "ability-qwen-mmlu1026 *$" ; pkill -f -- "--out runs/s30/ability-qwen-mmlu1026$"; echo stopped Q
