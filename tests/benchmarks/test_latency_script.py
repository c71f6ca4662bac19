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


def test_a_stopped_run_keeps_its_finished_repetitions(tmp_path, monkeypatch):
    """The json is written after every repetition: a run stopped in its second repetition leaves the
    first one's measurements and medians on disk (a 4K run here takes ~15 min per repetition)."""
    latency = _load()
    out = tmp_path / "lat.json"
    calls, real = [], latency.time_method

    def stop_in_the_second_repetition(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:  # 2 methods per repetition
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(latency, "time_method", stop_in_the_second_repetition)
    with pytest.raises(KeyboardInterrupt):
        latency.main(["--random-config", "tiny", "--lengths", "32", "--reps", "3", "--decode", "1", "--warmup", "0",
                      "--methods", "none,pi", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["reps_done"] == 1 and doc["reps"] == 3
    assert [len(doc["raw"][m]["32"]["prefill"]) for m in ("none", "pi")] == [1, 1]
    assert doc["summary"]["pi"]["32"]["prefill_s"] == doc["raw"]["pi"]["32"]["prefill"][0]
    with pytest.raises(SystemExit, match="--reps must be >= 1"):
        latency.main(["--random-config", "tiny", "--reps", "0", "--out", str(out)])


def test_the_same_command_resumes_at_the_next_repetition(tmp_path, monkeypatch):
    latency = _load()
    out = tmp_path / "lat.json"
    args = ["--random-config", "tiny", "--lengths", "32", "--decode", "1", "--warmup", "0", "--methods", "none,pi",
            "--out", str(out)]
    latency.main([*args, "--reps", "1"])
    first = json.loads(out.read_text())["raw"]
    calls, real = [], latency.time_method
    monkeypatch.setattr(latency, "time_method", lambda *a, **k: calls.append(1) or real(*a, **k))
    res = latency.main([*args, "--reps", "3"])
    assert len(calls) == 4  # 2 more repetitions of 2 methods; the first one is kept, not rerun
    doc = json.loads(out.read_text())
    assert doc["reps_done"] == 3 and doc["reps"] == 3
    assert ([doc["raw"][m]["32"]["prefill"][0] for m in ("none", "pi")]
            == [first[m]["32"]["prefill"][0] for m in ("none", "pi")])
    ratios = res["summary"]["pi"]["32"]["prefill_ratios"]
    assert len(ratios) == 3 and ratios[0] == first["pi"]["32"]["prefill"][0] / first["none"]["32"]["prefill"][0]
    latency.main([*args, "--reps", "3"])  # nothing left: no run
    assert len(calls) == 4
    with pytest.raises(SystemExit, match=r"holds a run with other settings \(decode_steps: 1 there, 2 now\)"):
        latency.main([*args[:5], "2", *args[6:], "--reps", "4"])
    out.write_text("{}")
    with pytest.raises(SystemExit, match="is not a latency result"):
        latency.main([*args, "--reps", "1"])


def test_the_method_order_rotates_by_one_place_per_repetition(tmp_path, capsys):
    """Each method runs once in every slot over three repetitions of three methods, so a slowdown late
    in a repetition is not always charged to the last method; ``--order fixed`` keeps the listed order."""
    latency = _load()
    args = ["--random-config", "tiny", "--lengths", "16", "--decode", "1", "--warmup", "0", "--reps", "3",
            "--methods", "none,pi,ms-poe"]

    def orders(extra: list[str], out: str) -> list[list[str]]:
        latency.main([*args, *extra, "--out", str(tmp_path / out)])
        names = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "tokens: prefill" in line]
        return [names[i:i + 3] for i in range(0, len(names), 3)]

    assert orders([], "rot.json") == [["none", "pi", "ms-poe"], ["pi", "ms-poe", "none"], ["ms-poe", "none", "pi"]]
    assert orders(["--order", "fixed"], "fix.json") == [["none", "pi", "ms-poe"]] * 3


def test_a_file_from_before_the_order_option_resumes_as_fixed_order(tmp_path, monkeypatch):
    latency = _load()
    out = tmp_path / "old.json"
    args = ["--random-config", "tiny", "--lengths", "16", "--decode", "1", "--warmup", "0", "--reps", "1",
            "--methods", "none,pi", "--out", str(out)]
    latency.main([*args, "--order", "fixed"])
    doc = json.loads(out.read_text())
    del doc["order"]  # as the 4K study's file, written before --order existed
    out.write_text(json.dumps(doc))
    calls, real = [], latency.time_method
    monkeypatch.setattr(latency, "time_method", lambda *a, **k: calls.append(1) or real(*a, **k))
    latency.main([*args, "--order", "fixed"])
    assert calls == []  # resumed: its one repetition is done
    with pytest.raises(SystemExit, match=r"other settings \(order: fixed there, rotate now\)"):
        latency.main(args)


def test_the_paired_ratio_is_the_median_of_the_per_repetition_ratios():
    """A ratio of medians can divide timings of different repetitions (none's median from one, the
    method's from another); the summary also gives the median of each repetition's own ratio."""
    latency = _load()
    raw = {"none": {16: {"prefill": [1.0, 4.0, 5.0], "decode": [1.0, 1.0, 1.0]}},
           "lpes": {16: {"prefill": [3.0, 3.0, 6.0], "decode": [1.0, 2.0, 3.0]}}}
    s = latency.summarise(raw)["lpes"][16]
    assert s["prefill_ratio"] == 0.75 and s["prefill_ratios"] == [3.0, 0.75, 1.2]
    assert s["prefill_ratio_rep_median"] == 1.2
    assert s["decode_ratio"] == s["decode_ratio_rep_median"] == 2.0
