#!/usr/bin/env bash
# The 256-token extrapolation study (docs/results/extrapolation-256): every scheme and seed of the summary
# table, the far lengths, the longer caps, the constant schedule, and the per-view tables. Every scheme of a seed
# is trained and scored in its seed's folder, so all are asked the same needles. Each step resumes.
# EARLIER=1 also reruns the first protocol (passkey probe, 4,000 steps) and the SSMax hold diagnostic.
source "$(dirname "$0")/../common.sh"
F=runs/extrapolation-256
study() { bash experiments/extrapolation-256/study.sh "$@"; }
L=1,2,4,8,16

# 8,000-step cap (~30-40 min of training per scheme and seed, one core)
for s in 0 1 2 3; do study "$s" "$F/study-pd8k-s$s" ggd "$L"; done
for s in 1 2; do study "$s" "$F/study-pd8k-s$s" ggd+ssmax "$L"; study "$s" "$F/study-pd8k-s$s" ggd+ssmax-content "$L"; done
for s in 0 2; do study "$s" "$F/study-pd8k-s$s" alibi "$L"; study "$s" "$F/study-pd8k-s$s" rope "$L"; done
study 2 "$F/study-pd8k-s2" rope+ssmax "$L"
STUDY_EXTRA="--model-opt embed_init_std=0.02" study 2 "$F/study-pd8k-s2" sinusoidal "$L"   # the std-0.02 start

# far lengths (64x = 16K tokens: 15-27 s per instance; 128x / 256x with 3 needles per depth)
for s in 0 1 2 3; do PPL=1,4,16,64 study "$s" "$F/study-pd8k-s$s" ggd "$L,32,64"; done
for s in 1 2; do PPL=1,4,16,64 study "$s" "$F/study-pd8k-s$s" ggd+ssmax "$L,32,64"; done
PPL=1,4,16,64 study 0 "$F/study-pd8k-s0" alibi "$L,32,64"
for s in 1 3; do STUDY_EXTRA="--n-beyond 64=3" PPL=1,4,16,64 study "$s" "$F/study-pd8k-s$s" ggd "$L,32,64,128"; done
for s in 1 2; do STUDY_EXTRA="--n-beyond 64=3" PPL=1,4,16,64 study "$s" "$F/study-pd8k-s$s" ggd+ssmax "$L,32,64,128"; done
STUDY_EXTRA="--n-beyond 64=3" PPL=1,4,16,64 study 3 "$F/study-pd8k-s3" ggd "$L,32,64,128,256"

# longer caps (12,000 / 16,000 steps) and the RoPE base / sinusoidal initialisation
for s in 0 2; do study "$s" "$F/study-pd12k-s$s" nope "$L" 12000; done
study 0 "$F/study-pd12k-s0" rope "$L" 12000
STUDY_EXTRA="--model-opt embed_init_std=0.02" study 2 "$F/study-pd12k-s2" sinusoidal "$L" 12000
for s in 0 2; do STUDY_EXTRA="--model-opt rope_theta=10000" study "$s" "$F/study-pd12k-rope1e4-s$s" rope "$L" 12000; done
study 2 "$F/study-pd12k-sininit-s2" sinusoidal "$L" 12000
PPL=1,4,16,64 study 0 "$F/study-pd16k-sininit-s0" sinusoidal "$L" 16000

# constant learning rate instead of the cosine (ggd, seeds 0 and 2)
for s in 0 2; do study "$s" "$F/study-pd8k-const-s$s" ggd 1,2,4,8 8000 constant; done

# the per-view tables of the page (every cell with its interval, paired differences, plots)
posbias study-seeds "$F"/study-pd8k-s{0,1,2,3} --out "$F/study_seeds_pd8k.md"
posbias study-seeds "$F/study-pd12k-s0" "$F/study-pd12k-rope1e4-s0" "$F/study-pd12k-s2" "$F/study-pd12k-rope1e4-s2" \
  "$F/study-pd12k-sininit-s2" "$F/study-pd16k-sininit-s0" --out "$F/study_seeds_pd12k.md"
posbias study-seeds "$F/study-pd8k-s0" "$F/study-pd8k-const-s0" "$F/study-pd8k-s2" "$F/study-pd8k-const-s2" --schemes ggd \
  --out "$F/study_schedule_ggd.md"

if [[ "${EARLIER:-0}" == 1 ]]; then
  # the first protocol (passkey probe, grass/sky filler, 4,000-step cap) and the SSMax hold diagnostic
  for s in 0 1; do
    posbias study --preset tiny --out "$F/early-s$s" \
      --schemes ggd+ssmax,ggd,alibi,rope,ggd+ssmax-content,rope+ssmax,sinusoidal,nope \
      --tokenizer bpe:1024 --train-steps 4000 --train-context 256 --train-opt batch_size=8 --train-opt lr=3e-3 \
      --train-opt warmup_steps=50 --train-opt probe_every=100 --train-opt probe_n=20 --train-opt probe_target=0.95 \
      --passkey-rate 0.35 --niah-rate 0.15 --model-opt embed_init_std=0.02 --multipliers 1,2,4,8,16,32,64 \
      --depths 0,0.5,1 --n 7 --modes teacher-forced --passkey-essay --niah --dead-after 2 \
      --ppl-multipliers 1,4,16,64 --ppl-tokens 32768 --seed "$s"
    script experiments/extrapolation-256/ssmax_hold.py --study "$F/early-s$s" --scheme ggd+ssmax \
      --multipliers 2,4,8,16,32,64 --niah --out "$F/ssmax-hold-s$s"
  done
  script experiments/extrapolation-256/ssmax_hold.py --study "$F/early-s0" --scheme ggd+ssmax-content \
    --multipliers 2,4,8,16,32,64 --out "$F/ssmax-hold-content-s0"
fi
