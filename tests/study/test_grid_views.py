"""The study grid stops a collapsed scheme early (``dead_after``) and reports cost per instance."""
from __future__ import annotations

import pytest


def _fake_grid(right_at: set[int], calls: list):
    """A run_grid stand-in: one record per requested length, right exactly at ``right_at``."""
    store: list[dict] = []

    def run_grid(model, tokenizer, spec, *, out_jsonl, model_name, **kw):
        task, lengths = spec.task, spec.lengths
        calls.append((task, tuple(lengths), dict(spec.task_kwargs)))
        store.extend({"model": model_name, "task": task, "length": L, "tf_em": L in right_at, "gen_score": None}
                     for L in lengths)
        return [r for r in store if r["task"] == task]

    return run_grid


def _grid(out, lengths, **settings):
    """A study whose grid lengths are ``lengths`` (a training context of 1 token)."""
    from posbias.study.config import StudyConfig

    return StudyConfig(out=str(out), train_context=1, multipliers=lengths, ppl_multipliers=[], **settings)


@pytest.mark.parametrize("dead_after,scored",
                         [(0, [1, 2, 4, 8, 16]), (1, [1, 2]), (2, [1, 2, 4]), (9, [1, 2, 4, 8, 16])])
def test_a_view_stops_after_dead_lengths_in_a_row(monkeypatch, tmp_path, dead_after, scored):
    import posbias.evaluation.long_context as lc
    from posbias.study.grid import evaluate_model

    calls, logs = [], []
    monkeypatch.setattr(lc, "run_grid", _fake_grid({1}, calls))
    res = evaluate_model(None, None, _grid(tmp_path, [16, 1, 4, 2, 8], dead_after=dead_after), name="rope",
                         log=logs.append, progress=False)
    assert sorted({r["length"] for r in res["passkey"]}) == scored
    if 0 < dead_after < 5:
        assert len(logs) == 1 and f"lengths {[L for L in (1, 2, 4, 8, 16) if L not in scored]} not scored" in logs[0]
    else:
        assert not logs


def test_a_right_answer_resets_the_dead_count_and_each_view_counts_alone(monkeypatch, tmp_path):
    import posbias.evaluation.long_context as lc
    from posbias.study.grid import evaluate_model

    calls = []
    monkeypatch.setattr(lc, "run_grid", _fake_grid({1, 4}, calls))
    res = evaluate_model(None, None, _grid(tmp_path, [1, 2, 4, 8, 16, 32], dead_after=2, niah=True), name="ggd",
                         log=lambda m: None, progress=False)
    assert sorted({r["length"] for r in res["passkey"]}) == [1, 2, 4, 8, 16]  # 2 dead, 4 right, 8 + 16 dead
    assert sorted({r["length"] for r in res["niah"]}) == [1, 2, 4, 8, 16]
    assert {c[0] for c in calls} == {"passkey", "niah"}


def test_is_right_reads_either_mode():
    from posbias.study.grid import is_right

    assert is_right({"tf_em": True}) and is_right({"tf_em": False, "gen_score": 0.5})
    assert not is_right({"tf_em": False, "gen_score": 0.0}) and not is_right({"tf_em": None, "gen_score": None})


def test_cost_table_medians_seconds_and_largest_peak_memory():
    from posbias.study.report import _cost_table

    recs = [{"model": "ggd", "length": 256, "seconds": s, "peak_rss_mb": m}
            for s, m in ((0.1, 700), (0.3, 720), (0.2, 710))]
    recs += [{"model": "ggd", "length": 512, "seconds": 1.5, "peak_rss_mb": 900}]
    table = _cost_table("cost", recs, ["ggd", "rope"], [256, 512, 1024], 256)
    assert "| ggd | 0.2 / 720 | 1.5 / 900 |  |" in table and "| rope" not in table
    assert _cost_table("cost", [{"model": "ggd", "length": 256}], ["ggd"], [256], 256) == ""


def test_negative_dead_after_is_refused():
    from posbias.study.config import StudyConfig

    with pytest.raises(ValueError, match="dead_after"):
        StudyConfig(out="x", dead_after=-1)


def test_niah_essay_is_ruler_single_2_in_its_own_file(monkeypatch, tmp_path):
    """--niah is RULER single_1 (noise haystack), --niah-essay single_2 (essays), each in its own file."""
    import posbias.evaluation.long_context as lc
    from posbias.study.grid import NIAH_ESSAY_FILE, NIAH_FILE, evaluate_model, grid_views

    views = {v: (task, opts, f) for v, task, opts, f in grid_views(niah=True, niah_essay=True,
                                                                    niah_options={"num_needles": 1})}
    assert views["niah"] == ("niah", {"num_needles": 1}, NIAH_FILE)
    assert views["niah-essay"] == ("niah", {"num_needles": 1, "haystack": "essay"}, NIAH_ESSAY_FILE)
    calls = []
    monkeypatch.setattr(lc, "run_grid", _fake_grid({1}, calls))
    res = evaluate_model(None, None, _grid(tmp_path, [1], niah_essay=True), name="ggd", progress=False)
    assert set(res) == {"passkey", "niah-essay"} and calls[-1] == ("niah", (1,), {"haystack": "essay"})


@pytest.mark.parametrize("right_at,scored", [({1}, []), ({1, 4}, [8, 16])])
def test_far_lengths_asked_later_skip_a_scheme_dead_below_them(monkeypatch, tmp_path, right_at, scored):
    import json

    import posbias.evaluation.long_context as lc
    from posbias.study.grid import evaluate_model

    earlier = [{"model": "fire", "task": "passkey", "length": L, "tf_em": L in right_at} for L in (1, 2, 4)]
    earlier += [{"model": "ggd", "task": "passkey", "length": 4, "tf_em": True}]  # another scheme's: not counted
    (tmp_path / "passkey.jsonl").write_text("".join(json.dumps(r) + "\n" for r in earlier))
    calls, logs = [], []
    monkeypatch.setattr(lc, "run_grid", _fake_grid(set(), calls))
    res = evaluate_model(None, None, _grid(tmp_path, [8, 16], dead_after=2), name="fire", log=logs.append,
                         progress=False)
    assert [c[1] for c in calls] == [(L,) for L in scored]
    if not scored:
        assert logs == ["[study] fire passkey: 0 right at 2 lengths in a row below 8 (earlier invocations); "
                        "lengths [8, 16] not scored"]
        assert sorted(r["length"] for r in res["passkey"]) == [1, 2, 4]
