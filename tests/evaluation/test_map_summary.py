"""The map's summary on records with a known answer: bias statistics, paired differences, noise floor."""
import json
import math

import pytest

from posbias.evaluation.bias_map import Length, MapConfig
from posbias.evaluation.map_summary import write_summary
from posbias.utils.io import append_jsonl

DEPTHS = [0.0, 0.5, 1.0]
LENGTHS = [Length("100", 100), Length("200", 200)]


def _none(depth, index, repeat):
    """Right at depth 0, never in the middle, at depth 1 for even contexts in repeat 0 and all in repeat 1."""
    return {0.0: 1.0, 0.5: 0.0, 1.0: float(index % 2 == 0 or repeat == 1)}[depth]


def _write(tmp_path, repeats=2, n=10):
    for method, rule in (("none", _none), ("fix", lambda d, i, r: 1.0)):
        for r in range(repeats):
            for L in LENGTHS:
                for i in range(n):
                    for d in DEPTHS:
                        append_jsonl(tmp_path / "results.jsonl", {
                            "method": method, "repeat": r, "length": L.tokens, "id": f"d{d}_i{i}", "depth": d,
                            "index": i, "correct": rule(d, i, r), "tf_logprob": -1.0, "n_tokens": 2,
                            "prompt_tokens": L.tokens - 5, "distance_tokens": int((1 - d) * L.tokens) + 5})
    return MapConfig(model="m", out=str(tmp_path), depths=DEPTHS, methods=["none", "fix"], n=n, repeats=repeats,
                     bootstrap=200)


def test_bias_statistics_differences_and_noise(tmp_path):
    s = write_summary(_write(tmp_path), tmp_path, LENGTHS)
    b = s["bias"]["none"]
    assert b["primacy"]["value"] == pytest.approx(1.0) and b["recency"]["value"] == pytest.approx(0.75)
    assert b["middle_dip"]["value"] == pytest.approx(0.75) and b["effective_length"]["value"] == 100
    lo, hi = b["recency"]["ci95"]
    assert lo < 0.75 < hi  # the contexts differ at depth 1: a real interval
    assert s["bias"]["fix"]["effective_length"]["value"] == math.inf and s["bias"]["fix"]["primacy"]["value"] == 0
    # recency moves by 50 points between the two repeats; primacy does not move at all
    assert s["noise"]["none"]["recency"] == pytest.approx(0.5) and s["noise"]["none"]["primacy"] == 0
    d = s["differences"]["fix"]
    assert d["primacy"]["value"] == pytest.approx(-1.0) and d["primacy"]["within_noise"] is False
    assert d["recency"]["value"] == pytest.approx(-0.75) and d["recency"]["within_noise"] is False
    cells = {(c["length"], c["depth"]): c for c in s["cell_differences"]["fix"]}
    assert cells[(100, 0.5)]["diff"] == 1.0 and cells[(100, 0.5)]["significant"]
    assert cells[(100, 0.0)]["diff"] == 0.0 and not cells[(100, 0.0)]["significant"]
    assert cells[(100, 1.0)]["noise"] == pytest.approx(0.5) and cells[(100, 1.0)]["within_noise"]
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["bias"]["fix"]["effective_length"]["value"] == "inf"  # JSON without Infinity
    text = (tmp_path / "map.md").read_text()
    assert "| none | 58 [" in text and "> 200 [> 200, > 200]" in text and "(> noise 50)" in text


def test_intervals_are_seeded(tmp_path):
    cfg = _write(tmp_path, repeats=1)
    first = write_summary(cfg, tmp_path, LENGTHS)["bias"]
    assert write_summary(cfg, tmp_path, LENGTHS)["bias"] == first
    assert "run `--repeats 2`" in (tmp_path / "map.md").read_text()


def test_distance_plot_takes_an_interval_rounded_below_its_accuracy(tmp_path):
    from posbias.evaluation.map_plots import plot_distance

    row = {"low": 10, "high": 20, "center": 14.1, "n": 7, "accuracy": 1.0, "ci_low": 0.6, "ci_high": 1.0 - 1e-16}
    assert plot_distance({"model": "m", "task": "kv", "by_distance": {"none": [row]}}, tmp_path / "d.png").exists()
