"""benchmarks/map_speed.py on a tiny random model (the CPU dry run of the map's speed measurement)."""
from __future__ import annotations

import json

import pytest
from conftest import load_benchmark, save_tiny_folder


def test_map_speed_counts_prefills_and_compares_one_prompt_per_question(tmp_path):
    folder = save_tiny_folder(tmp_path / "tiny", max_positions=1024)
    out = tmp_path / "speed.json"
    res = load_benchmark("map_speed").main(["--model", folder, "--out", str(tmp_path / "map"), "--lengths", "96,160",
                                            "--depths", "3", "--n", "2", "--sub-lengths", "160", "--sub-n", "2",
                                            "--bootstrap", "10", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    assert res["map"]["prefills"] == 2 * 2 and res["map"]["questions"] == 2 * 2 * 3  # lengths x n (x depths)
    sub = res["shared_vs_single"]
    assert sub["lengths"] == [160] and sub["questions"] == 6
    assert sub["prefills"] == {"shared prefill": 2, "one prompt per question": 6}
    assert sub["same_scores"] and sub["speedup"] > 0


def test_a_used_folder_is_refused(tmp_path):
    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "results.jsonl").write_text("")
    with pytest.raises(SystemExit, match="not empty"):
        load_benchmark("map_speed").main(["--model", "unused", "--out", str(tmp_path / "map")])
