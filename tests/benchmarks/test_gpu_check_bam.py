"""benchmarks/gpu_check_bam.py: its CPU dry run (eager vs chunked vs sdpa) and the clear refusal of flex on CPU."""
from __future__ import annotations

import json

import pytest
from conftest import load_benchmark


def _load():
    return load_benchmark("gpu_check_bam")


def test_backends_agree_on_cpu_forward_and_backward(tmp_path):
    mod = _load()
    out = tmp_path / "r.json"
    report = mod.main(["--device", "cpu", "--backends", "eager,chunked,sdpa", "--throughput-backends", "",
                       "--out", str(out)])
    assert set(report["equivalence"]) == {"ggd+ssmax", "ggd+ssmax-content", "ggd", "alibi", "kerple-log",
                                          "kerple-power", "fire"}
    for setup, by_backend in report["equivalence"].items():
        assert set(by_backend) == {"chunked", "sdpa"}
        grads = by_backend["chunked"]
        assert len(grads) == {"ggd+ssmax": 7, "ggd+ssmax-content": 7, "ggd": 6, "alibi": 4, "kerple-log": 6,
                              "kerple-power": 6, "fire": 10}[setup]
        # FIRE's output bias b2 adds a constant per head, which the softmax cancels: its gradient is 0 up to rounding
        assert all(v["rel"] < 1e-4 or (name == "db2" and v["abs"] < 1e-3)
                   for b in by_backend.values() for name, v in b.items()), (setup, by_backend)
    assert json.loads(out.read_text())["device"] == "cpu"


def test_flex_on_cpu_is_refused_with_one_line():
    with pytest.raises(SystemExit, match="flex needs a CUDA device"):
        _load().main(["--device", "cpu", "--backends", "chunked,flex", "--throughput-backends", ""])
