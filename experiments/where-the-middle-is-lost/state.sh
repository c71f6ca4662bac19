#!/usr/bin/env bash
# The resumable records of this claim's runs, kept in git while the protocol is unfinished
# (records and configs only: no weights, no plots), as one compressed archive:
#   experiments/where-the-middle-is-lost/state.sh save      runs/ -> state/runs.tar.gz
#   experiments/where-the-middle-is-lost/state.sh restore   state/runs.tar.gz -> runs/ (existing files are kept;
#                                                            then run.sh resumes where each run stopped)
# Covers runs/where-the-middle-is-lost and runs/fixes-where-the-middle-is-lost.
set -euo pipefail
cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE=experiments/where-the-middle-is-lost/state
ARCHIVE=$STATE/runs.tar.gz
case ${1:-} in
  save)
    claims=()
    for claim in where-the-middle-is-lost fixes-where-the-middle-is-lost; do
      [[ -d runs/$claim ]] && claims+=("$claim")
    done
    (( ${#claims[@]} )) || { echo "nothing under runs/ to save" >&2; exit 2; }
    mkdir -p "$STATE"
    (cd runs && find "${claims[@]}" -type f \( -name '*.jsonl' -o -name config.json -o -name attention_bias.json \
      -o -name checkpoint.json -o -name best_factors.json \) \
      -print0 | LC_ALL=C sort -z \
      | tar --null -T - --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - | gzip -9n) > "$ARCHIVE.tmp"
    mv "$ARCHIVE.tmp" "$ARCHIVE"
    du -h "$ARCHIVE" ;;
  restore)
    [[ -f $ARCHIVE ]] || { echo "no saved state at $ARCHIVE" >&2; exit 2; }
    mkdir -p runs && tar -xzf "$ARCHIVE" -C runs --skip-old-files ;;
  *)
    echo "usage: $0 save|restore" >&2; exit 2 ;;
esac
