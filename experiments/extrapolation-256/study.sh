#!/usr/bin/env bash
# One scheme of the 256-token extrapolation protocol: trained until its passkey and NIAH probes hold >= 95%
# three probes in a row (cap CAP steps, cosine schedule), then scored on passkey (noise, essays, held-out text)
# and RULER NIAH (noise, essays), 7 fresh needles per depth at depths 0 / 0.5 / 1 (n = 21 per length).
# usage: study.sh SEED OUT SCHEME MULTIPLIERS [CAP (default 8000)] [SCHEDULE (cosine | constant | wsd)]
# PPL=1,4,16,64 sets the perplexity multipliers (default 1,4,16); STUDY_EXTRA adds options (e.g.
# "--model-opt rope_theta=10000", "--n-beyond 64=3"). Rerunning resumes; more multipliers add cells.
source "$(dirname "$0")/../common.sh"
seed=$1; out=$2; scheme=$3; mult=$4; cap=${5:-8000}; schedule=${6:-}
# shellcheck disable=SC2086  # STUDY_EXTRA is a list of options
posbias study --preset tiny --schemes "$scheme" --tokenizer bpe:1024 --train-steps "$cap" --train-context 256 \
  --train-opt batch_size=8 --train-opt lr=3e-3 --train-opt warmup_steps=50 --train-opt probe_every=100 \
  --train-opt probe_n=20 --train-opt probe_target=0.95 --train-opt probe_tasks=passkey,niah \
  --train-opt passkey_haystack=mixed --train-opt niah_haystack=mixed --passkey-rate 0.35 --niah-rate 0.15 \
  --depths 0,0.5,1 --n 7 --needle-draw per-depth --modes teacher-forced --passkey-essay --passkey-heldout \
  --niah --niah-essay --dead-after 2 --ppl-multipliers "${PPL:-1,4,16}" --ppl-tokens 32768 --multipliers "$mult" \
  --seed "$seed" --out "$out" ${schedule:+--train-opt schedule=$schedule} ${STUDY_EXTRA:-}
