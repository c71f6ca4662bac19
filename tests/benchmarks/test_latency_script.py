"""benchmarks/latency.py runs end to end on a random tiny config (the GPU script's CPU dry run)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import load_benchmark


def _load():
    return load_benchmark("latency")


def test_latency_on_a_random_config_with_every_method(tmp_path):
    latency = _load()
    out = tmp_path / "lat.json"
    res = latency.main(["--random-config", "tiny", "--lengths", "32", "--reps", "1", "--decode", "2", "--warmup", "0",
                        "--methods", "none,pi,lpes,ms-poe,ms-poe@rotated_cache=false,attention-buckets,moice",
                        "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["random_weights"] and doc["model"] == "tiny"
    assert set(doc["summary"]) == {"none", "pi", "lpes", "ms-poe", "ms-poe@rotated_cache=false",
                                   "attention-buckets", "moice"}
    assert res["summary"]["none"]["32"]["decode_ratio"] == pytest.approx(1.0)
    assert Path(doc["options"]["lpes"]["factors"]).exists()  # a factors file of the model's layer count
