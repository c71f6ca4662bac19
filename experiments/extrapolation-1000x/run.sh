#!/usr/bin/env bash
# Trained at 128 tokens on passkey only, scored from 1x to 1000x (docs/results/extrapolation-1000x). One folder
# per scheme and seed; the far lengths (noise filler only) run on the same folder afterwards. Each 1000x cell
# (9 instances) takes ~85 min of one core. MIX=1 adds the 256-token mix / training-length ablation, PRIORS=1 the
# KERPLE and FIRE priors, BAM=1 the BAM reference's passkey protocol on the GGD models.
source "$(dirname "$0")/../common.sh"
F=runs/extrapolation-1000x
study() { bash experiments/extrapolation-1000x/study.sh "$@"; }
NEAR=(1,2,4,8,16,32,64 --passkey-essay --passkey-heldout --ppl-multipliers 1,4,16,64)

for run in "0 ggd" "1 ggd" "2 ggd" "3 ggd" "0 ggd+ssmax" "1 ggd+ssmax" "0 alibi"; do
  read -r s scheme <<< "$run"
  out="$F/c128-s$s-${scheme/+/-}"
  study "$s" "$out" "$scheme" "${NEAR[@]}"
  study "$s" "$out" "$scheme" 128,256,1000 --ppl-multipliers ''
done
study 0 "$F/c128-s0-rope" rope "${NEAR[@]}"
study 0 "$F/c128-s0-rope" rope 256 --ppl-multipliers ''

# PRIORS=1: the closest prior art on the same budget (issue #53), two seeds each; the far lengths stop for a
# scheme after two lengths in a row at 0 (--dead-after 2 in study.sh).
if [[ "${PRIORS:-0}" == 1 ]]; then
  for run in "0 kerple-log" "1 kerple-log" "0 kerple-power" "1 kerple-power" "0 fire" "1 fire"; do
    read -r s scheme <<< "$run"
    out="$F/c128-s$s-$scheme"
    study "$s" "$out" "$scheme" "${NEAR[@]}"
    study "$s" "$out" "$scheme" 128,256 --ppl-multipliers ''
    NBEYOND="--n-beyond 64=1" study "$s" "$out" "$scheme" 1000 --ppl-multipliers ''  # one needle per depth
  done
fi

# BAM=1: the kept GGD models under the BAM reference's long-range passkey protocol (docs/methods/bam.md): 1x, 64x
# and 256x for the four seeds in the reference's template and 1x / 64x in posbias's, 1000x for seeds 0 and 3 (the
# two that hold at 256x). One teacher-forced pass per instance scores both settings (GIVEN=0; 10 instances of
# ~10 min of one core at 1000x); bam_table.py makes the page's table
if [[ "${BAM:-0}" == 1 ]]; then
  for run in "0 1,64,256,1000" "1 1,64,256" "2 1,64,256" "3 1,64,256,1000"; do
    read -r s mult <<< "$run"
    model="experiments/extrapolation-1000x/models/c128-s$s-ggd"
    GIVEN=0 bash experiments/extrapolation-1000x/bam_protocol.sh "$model" "$F/bam-protocol/c128-s$s-ggd" "$mult"
    GIVEN=0 TEMPLATE=posbias bash experiments/extrapolation-1000x/bam_protocol.sh "$model" \
      "$F/bam-protocol/c128-s$s-ggd" 1,64
  done
  script experiments/extrapolation-1000x/bam_table.py "$F/bam-protocol" docs/results/extrapolation-1000x/bam_protocol.md
fi

if [[ "${MIX:-0}" == 1 ]]; then
  mix() { bash experiments/extrapolation-1000x/mix.sh "$@"; }
  M=1,2,4,8,16,32,64
  for s in 0 1; do mix "$s" "$F/c256pk-s$s" pk "$M"; done
  mix 0 "$F/c256pk-s0-at2800" pk "$M" --train-opt final_step=2800
  mix 1 "$F/c256pk-s1-at2900" pk "$M" --train-opt final_step=2900
  mix 0 "$F/c256pkniah-s0-at2800" pkniah "$M" --train-opt final_step=2800
  mix 1 "$F/c256pkniah-s1-at2900" pkniah "$M" --train-opt final_step=2900
  for s in 0 1; do PROBE_TARGET=0 mix "$s" "$F/c256pk-s$s-at6500" pk "$M" --train-opt final_step=6500; done
fi
