"""benchmarks/gpu_check.py: its CPU dry run (tiny config, few tokens) goes through every step and writes
the JSON and the markdown table; a failing step is recorded while the others run; unmet requirements
and, without CUDA, the full run stop with one line."""
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
    steps = {"weights", "identity", "search", "save", "latency", "bam", "load_and_eval", "shard"}
    assert set(doc["peak_gib"]) == set(doc["step_seconds"]) == steps and doc["errors"] == {}
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| moice | yes | 0 |" in table and "| attention-buckets |" in table and report["seconds"] > 0
    assert (tmp_path / "latency.json").exists() and (tmp_path / "gpu_check_bam.json").exists()
    load, ev = doc["load_and_eval"]["load"], doc["load_and_eval"]["eval"]  # the saved folder, in a fresh process
    assert load["parameters"] == doc["weights"]["parameters"] and (load["dtype"], load["device"]) == (
        "torch.float32", "cpu")
    assert ev["instances"] == 2 and ev["command"].startswith("posbias eval --model ") and ev["seconds"] > 0
    assert json.loads((tmp_path / "load_and_eval.json").read_text()) == doc["load_and_eval"]
    assert "`posbias eval --model <folder> --device cpu --dtype float32 --task kv --num-keys 4" in table
    shard = doc["shard"]  # device_map="auto" (no GPU here: all on the CPU) against one device, every method
    assert shard["devices"] == ["cpu"] and set(shard["methods"]) == METHODS
    assert all(r["equal"] for r in shard["methods"].values()), shard["methods"]
    assert "`--device shard` over cpu against one device" in table


def test_a_failing_step_is_recorded_and_the_next_steps_still_run(tmp_path, monkeypatch):
    script = load_benchmark("gpu_check")

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(script, "search_check", out_of_memory)
    with pytest.raises(SystemExit, match=r"1 step\(s\) failed: search"):
        script.main(["--dry-run", "--skip-bam", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert "search" not in doc and set(doc["latency"]["summary"]) == METHODS and len(doc["identity"]) == 7
    assert doc["errors"]["search"]["message"].startswith("OutOfMemoryError: CUDA out of memory")
    assert "out_of_memory" in doc["errors"]["search"]["traceback"] and "search" in doc["step_seconds"]
    table = (tmp_path / "gpu_check.md").read_text()
    assert "FAILED search: OutOfMemoryError" in table and "Quick-preset search" not in table
    assert "| lpes | yes | 0 |" in table and "Wall time" in table


def test_an_unmet_requirement_stops_the_run_before_anything_is_written(tmp_path, monkeypatch):
    from importlib.metadata import PackageNotFoundError, version

    script = load_benchmark("gpu_check")
    assert script.unmet_requirements() == []  # this environment was installed from pyproject.toml

    def image_of_a_gpu_node(name: str) -> str:
        if name == "gguf":
            raise PackageNotFoundError(name)
        return "5.17.0" if name == "transformers" else version(name)

    assert script.unmet_requirements(installed=image_of_a_gpu_node) == [
        "transformers 5.17.0 (needs <6,>=5.24)", "gguf: not installed"]
    monkeypatch.setattr(script, "version", image_of_a_gpu_node)
    with pytest.raises(SystemExit, match=r"does not meet pyproject.toml: transformers 5.17.0 \(needs <6,>=5.24\); "
                                         r"gguf: not installed \(a GPU node without network: see docs/guide/gpu.md"):
        script.main(["--dry-run", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_the_full_run_needs_cuda(tmp_path):
    with pytest.raises(SystemExit, match="no CUDA device here; run with --dry-run"):
        load_benchmark("gpu_check").main(["--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())
