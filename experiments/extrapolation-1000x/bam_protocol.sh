#!/usr/bin/env bash
# The BAM reference's long-range passkey protocol (docs/methods/bam.md) on one 128-token model: the needle at
# depth 0, n = 10 per length, teacher-forced, without and with the key's first digit given, at 1x (the
# reference point: does the model read this template at all?), 64x, 256x and 1000x of the training context.
# TEMPLATE=bam (default): the reference's prompt (protocol=bam: single spaces for newlines, "memorize them",
# the digits scored, not the space); TEMPLATE=posbias: posbias's prompt, the rest of the protocol as above
# (folders prefixed "posbias-"). As the reference's patience=2, a setting stops after two lengths in a row
# with no key right. Keys keep the 5 digits the models trained on: with the first given, 4 are scored (the
# reference's prefix keys have 6 digits, a key length these models never saw: 3 of 10 right at 128 tokens for
# c128-s0-ggd, against 10 of 10 with 5 digits).
# Teacher forcing puts the key's first digit in context whether or not the prompt gives it, so the given0
# pass also scores "first digit given" (its tf_hits, digits 2-5: the same tokens at the same positions);
# GIVEN=0 runs that pass alone and bam_table.py reads the given1 score from it (half the time at 1000x).
# usage: [TEMPLATE=bam|posbias] [GIVEN="0 1"|0] bam_protocol.sh MODEL OUT [MULTIPLIERS (default 1,64,256,1000)]
source "$(dirname "$0")/../common.sh"
model=$1; out=$2; mult=${3:-1,64,256,1000}
template=${TEMPLATE:-bam}
case "$template" in
  bam) protocol=(--opt protocol=bam); prefix="" ;;
  posbias) protocol=(); prefix="posbias-" ;;
  *) echo "TEMPLATE must be bam or posbias, not $template" >&2; exit 2 ;;
esac
for given in ${GIVEN:-0 1}; do
  digits=$((5 - given))
  zeros=0
  for m in ${mult//,/ }; do
    run="$out/${prefix}given$given-${m}x"
    posbias eval --model "$model" --task passkey --length $((128 * m)) --depths 0 --n 10 --mode teacher-forced \
      --batch-size 1 "${protocol[@]}" --opt digits="$digits" --opt given_digits="$given" --out "$run"
    accuracy=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["overall"])' "$run/summary.json")
    if [[ "$accuracy" == 0.0 ]]; then zeros=$((zeros + 1)); else zeros=0; fi
    if [[ "$zeros" == 2 ]]; then break; fi
  done
done
