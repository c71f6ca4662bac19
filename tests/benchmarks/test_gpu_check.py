"""benchmarks/gpu_check.py: its CPU dry run (tiny config, few tokens) goes through every step and writes
the JSON and the markdown table; without CUDA the full run stops with one line."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import load_benchmark

METHODS = {"none", "pi", "lpes", "ms-poe", "attention-buckets", "moice", "temperature", "positional-hidden"}


def test_dry_run_checks_every_method_and_writes_its_tables(tmp_path):
    report = load_benchmark("gpu_check").main(["--dry-run", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(doc["identity"]) == METHODS - {"none"}
    assert all(r["equal"] and r["max_abs_diff"] == 0.0 for r in doc["identity"].values()), doc["identity"]
    assert set(doc["latency"]["summary"]) == METHODS and list(doc["latency"]["summary"]["none"]) == ["32", "64"]
    assert doc["search"]["generations"] == 1 and len(doc["search"]["factors"]) == 2  # the tiny config's layers
    assert set(doc["bam"]["equivalence"]) == {"ggd+ssmax", "ggd+ssmax-content", "ggd", "alibi", "kerple-log",
                                              "kerple-power", "fire"}
    worst = {s: max(v["rel"] for v in d["chunked"].values()) for s, d in doc["bam"]["equivalence"].items()}
    assert max(worst.values()) < 1e-4, worst  # eager = chunked for every prior, gradients included
    assert set(doc["peak_gib"]) == {"weights", "identity", "search", "latency", "bam"}
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| moice | yes | 0 |" in table and "| attention-buckets |" in table and report["seconds"] > 0
    assert (tmp_path / "latency.json").exists() and (tmp_path / "gpu_check_bam.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_the_full_run_needs_cuda(tmp_path):
    with pytest.raises(SystemExit, match="no CUDA device here; run with --dry-run"):
        load_benchmark("gpu_check").main(["--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())
