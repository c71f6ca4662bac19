"""benchmarks/load_and_eval.py: a model folder's load and one ``posbias eval``, timed, with the memory
figures of the process (GPU figures are None on the CPU); an unusable device is one line, nothing written."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import load_benchmark


def test_load_and_one_eval_are_measured(tiny, tmp_path):
    report = load_benchmark("load_and_eval").main(
        ["--model", tiny, "--device", "cpu", "--dtype", "float32", "--out", str(tmp_path), "--",
         "--task", "kv", "--num-keys", "4", "--n", "2", "--depths", "0,1"])
    load, ev = report["load"], report["eval"]
    assert (load["dtype"], load["device"], load["gpu_gib"]) == ("torch.float32", "cpu", None)
    assert load["parameters"] > 0 and load["max_rss_gib"] > 0 and ev["peak_gpu_gib"] is None
    assert ev["instances"] == 4 and ev["prompt_tokens_median"] > 0 and "--num-keys 4" in ev["command"]
    assert (tmp_path / "eval" / "results.jsonl").exists()  # the eval's own run folder, default <out>/eval
    assert json.loads((tmp_path / "load_and_eval.json").read_text()) == report


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_an_unusable_device_is_one_line_and_nothing_is_written(tiny, tmp_path):
    with pytest.raises(SystemExit, match=r"^error: --device cuda: this torch is built without CUDA|no CUDA GPU"):
        load_benchmark("load_and_eval").main(["--model", tiny, "--device", "cuda", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
