#!/usr/bin/env bash
# Cost of the BAM attention paths (docs/results/bam-cost): training throughput of each positional scheme relative
# to rope, and the chunked exact attention's peak memory against length; on a CUDA machine also the FlexAttention
# check (random weights, nothing downloaded).
source "$(dirname "$0")/../common.sh"
OUT=runs/bam-cost
mkdir -p "$OUT"

script benchmarks/train_throughput.py --context 256 --batch-size 4 --setups ggd+ssmax,ggd,rope,nope,alibi \
  --threads 1 --json "$OUT/throughput_256.json"
script benchmarks/train_throughput.py --context 512 --batch-size 2 --setups ggd+ssmax,ggd,rope \
  --threads 1 --json "$OUT/throughput_512.json"
script benchmarks/chunked_memory.py --lengths 8192,16384,32768,65536 --layers 4 --hidden 128 --heads 4 \
  --normaliser softmax --chunk 512 --json "$OUT/chunked_memory_tiny.json"                 # ~5 min
if "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  script benchmarks/gpu_check_bam.py --out "$OUT/gpu_check_bam.json"
fi
