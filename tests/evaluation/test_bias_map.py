"""The position-bias map on a tiny random model: grid, shared prefills, resume, lengths."""
import json
import math

import numpy as np
import pytest
from conftest import make_tiny_model, make_tiny_tokenizer

from posbias.evaluation.bias_map import (
    DEFAULT_LENGTHS,
    Length,
    MapConfig,
    fit_items,
    grid_instances,
    map_lengths,
    parse_length,
    record_key,
    run_map,
    score_group,
)
from posbias.evaluation.teacher_forced import question_groups
from posbias.utils.io import read_jsonl

LENGTHS = ["96", "160"]
DEPTHS = [0.0, 0.5, 1.0]


@pytest.fixture(scope="module")
def loaded():
    return make_tiny_model("llama", max_positions=1024), make_tiny_tokenizer()


def _cfg(out, **kw):
    base = dict(model="tiny", out=str(out), lengths=LENGTHS, depths=DEPTHS, methods=["none", "pi@factor=1.0"], n=2,
                bootstrap=50)
    return MapConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def full_run(loaded, tmp_path_factory):
    out = tmp_path_factory.mktemp("map") / "run"
    summary = run_map(_cfg(out, repeats=2), loaded, log=lambda _: None)
    return out, summary


def test_lengths_in_tokens_or_fractions_of_the_window():
    assert parse_length("2048") == (2048.0, False) and parse_length("0.25w") == (0.25, True)
    cfg = MapConfig(model="m", out="o", lengths=["0.1w", "0.5w"])
    assert [x.tokens for x in map_lengths(cfg, 8192)] == [819, 4096]
    # the default fractions count a long window as 8,192 tokens: 512 .. 4,096 whatever the model
    assert [x.tokens for x in map_lengths(MapConfig(model="m", out="o"), 32768)] == [512, 1024, 2048, 4096]
    assert list(DEFAULT_LENGTHS) == MapConfig(model="m", out="o").lengths
    with pytest.raises(ValueError, match="longer than the model's window"):
        map_lengths(MapConfig(model="m", out="o", lengths=["4096"]), 2048)
    for bad in ("1.5w", "abc", "8"):
        with pytest.raises(ValueError, match="--lengths"):
            parse_length(bad)


def test_kv_contexts_are_fitted_to_the_length(loaded):
    _, tok = loaded
    from posbias.evaluation.batching import encode
    from posbias.tasks import make_instances

    def make(k):
        return make_instances("kv", n=3, depths=[1.0], num_keys=k, shared_context=True)

    def longest(k):
        return max(len(e.prompt_ids) + len(e.answer_ids) for e in (encode(tok, i, False) for i in make(k)))

    keys = fit_items(make, tok, 200, 400)
    assert longest(keys) <= 200 < longest(keys + 1)


def test_one_prefill_per_context_asks_every_depth(full_run):
    out, summary = full_run
    recs = read_jsonl(out / "results.jsonl")
    assert len(recs) == 2 * 2 * 2 * 3 * 2  # methods x repeats x lengths x depths x n
    assert len({record_key(r) for r in recs}) == len(recs)
    for m in read_jsonl(out / "metrics.jsonl"):
        assert m["prefills"] == 2 and m["questions"] == 2 * 3  # n contexts, each asked at 3 depths
    assert summary["cost"]["total"]["prefills"] == 2 * 2 * 2 * 2
    # pi at factor 1 is the identity: the same scores as none, bit for bit
    by = {(r["method"], r["repeat"], r["length"], r["id"]): r["tf_logprob"] for r in recs}
    assert all(by[("pi@factor=1.0", *k[1:])] == v for k, v in by.items() if k[0] == "none")
    # prompts fill their length; the gold item is farther from the question the shallower it sits
    for r in recs:
        assert r["prompt_tokens"] <= r["length"]
    near = {(r["repeat"], r["length"], r["index"], r["depth"]): r["distance_tokens"]
            for r in recs if r["method"] == "none"}
    for (rep, L, i, d), dist in near.items():
        if d == 0.0:
            assert dist > near[(rep, L, i, 0.5)] > near[(rep, L, i, 1.0)] > 0


def test_summary_files_and_cells(full_run):
    out, summary = full_run
    assert {"config.json", "results.jsonl", "metrics.jsonl", "summary.json", "map.md", "heatmap_none.png",
            "diff_pi@factor=1.0.png", "accuracy_by_depth.png", "accuracy_by_distance.png"} <= {
                p.name for p in out.iterdir()}
    saved = json.loads((out / "summary.json").read_text())
    assert saved["n_per_cell"] == 4 and len(saved["cells"]) == 2 * 2 * 3
    cell = saved["cells"][0]
    assert cell["n"] == 4 and cell["ci_low"] <= cell["accuracy"] <= cell["ci_high"] and cell["logprob_per_token"] < 0
    diff = saved["differences"]["pi@factor=1.0"]
    assert diff["overall"]["value"] == 0 and diff["overall"]["ci95"] == [0, 0]
    assert diff["overall"]["within_noise"] is True  # repeats = 2: every difference says where it stands
    text = (out / "map.md").read_text()
    assert "| none |" in text and "*within noise*" in text and "Run-to-run noise" in text


def test_killed_run_resumes_to_the_same_result(loaded, full_run, tmp_path):
    out_full, _ = full_run
    out = tmp_path / "run"
    cfg = _cfg(out, repeats=2)
    whole = read_jsonl(out_full / "results.jsonl")
    # a run killed after 17 questions (mid-way through a context's records) ...
    from posbias.utils.run_folder import open_run

    open_run(out, "map", cfg.settings()).commit()
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in whole[:17]) + '{"method": "no')
    run_map(cfg, loaded, log=lambda _: None)
    again = read_jsonl(out / "results.jsonl")
    assert len(again) == len(whole)  # nothing scored twice
    strip = ("prompt_tokens", "tf_logprob", "correct", "distance_tokens")
    assert ({record_key(r): tuple(r[k] for k in strip) for r in again}
            == {record_key(r): tuple(r[k] for k in strip) for r in whole})
    a, b = (json.loads((o / "summary.json").read_text()) for o in (out, out_full))
    assert a["cells"] == b["cells"] and a["bias"] == b["bias"]


def test_other_settings_are_refused_on_resume(full_run):
    out, _ = full_run
    with pytest.raises(ValueError, match="other settings"):
        run_map(_cfg(out, lengths=["96"]), loaded=None)


def test_shared_prefill_scores_equal_one_prompt_per_question(loaded):
    lm, tok = loaded
    cfg = _cfg("unused")
    insts = grid_instances(cfg, tok, Length("160", 160), 0)
    shared = [r for g in question_groups(insts, 8, shared=True) for r in score_group(lm, tok, g, cfg, shared=True)]
    single = {r["id"]: r for g in question_groups(insts, 8, shared=False)
              for r in score_group(lm, tok, g, cfg, shared=False)}
    assert len(question_groups(insts, 8, shared=True)) == 2  # one group per context
    for r in shared:
        assert r["correct"] == single[r["id"]]["correct"]
        assert math.isclose(r["tf_logprob"], single[r["id"]]["tf_logprob"], rel_tol=1e-4, abs_tol=1e-4)


def test_bias_statistics_of_a_known_u():
    from posbias.evaluation.map_summary import bias_stats

    depths = [0.0, 0.25, 0.5, 0.75, 1.0]
    u = np.array([[1, 1, 0, 1, 1], [1, 0, 0, 0, 0]], dtype=float)  # depth 0: 1, middle third (0.5): 0, depth 1: 0.5
    flat = np.ones((2, 5))
    s = bias_stats({100: flat, 200: u}, depths, threshold=0.5)
    assert s["primacy"] == pytest.approx(1 - 0.5) and s["recency"] == pytest.approx(0.75 - 0.5)
    assert s["middle_dip"] == pytest.approx(0.25) and s["effective_length"] == 200
    assert bias_stats({100: flat}, depths, 0.5)["effective_length"] == math.inf


@pytest.mark.parametrize("task, prefills", [("niah", 2), ("passkey", 2 * 3), ("kv-uuid", 2 * 3)])
def test_niah_shares_its_haystack_passkey_and_kv_uuid_ask_one_prompt_per_question(loaded, tmp_path, task, prefills):
    cfg = _cfg(tmp_path / task, task=task, lengths=["400"], methods=["none"], mode="both")
    summary = run_map(cfg, loaded, log=lambda _: None)
    recs = read_jsonl(tmp_path / task / "results.jsonl")
    assert len(recs) == 2 * 3 and all(r["prompt_tokens"] <= 400 and "failure" in r for r in recs)
    assert [m["prefills"] for m in read_jsonl(tmp_path / task / "metrics.jsonl")] == [prefills]
    assert sum(summary["failures"]["none"]["counts"].values()) == 6


def test_figures_name_model_task_and_n(full_run, saved_figures):
    from posbias.evaluation.bias_map import MapConfig as Cfg
    from posbias.evaluation.map_plots import plot_map

    out, summary = full_run
    plot_map(Cfg(model="tiny", out=str(out)), out, summary)
    heat = saved_figures["heatmap_none.png"]
    assert "tiny / kv, n = 4 per cell" in heat._suptitle.get_text()
    assert heat.axes[0].get_ylabel() == "prompt length (tokens)" and "depth" in heat.axes[0].get_xlabel()
    diff = saved_figures["diff_pi@factor=1.0.png"]
    assert "n = 4 per cell" in diff.axes[0].get_title()
    # the identity: no cell outlined as a difference, every cell greyed as within its questions' noise
    patches = diff.axes[0].patches
    assert patches and all(p.get_fill() and p.get_hatch() == "//" for p in patches)
    assert len(patches) == sum(len(rows) for rows in summary["cell_differences"].values())
    curves = saved_figures["accuracy_by_depth.png"].axes[0]
    assert len(curves.lines) == 2  # one line per length
    xlabel = saved_figures["accuracy_by_distance.png"].axes[0].get_xlabel()
    assert "tokens between the gold item and the question" in xlabel


def test_a_larger_n_scores_only_the_new_contexts(loaded, tmp_path):
    out = tmp_path / "grow"
    run_map(_cfg(out, methods=["none"], lengths=["160"]), loaded, log=lambda _: None)
    first = {r["id"]: r for r in read_jsonl(out / "results.jsonl")}
    run_map(_cfg(out, methods=["none"], lengths=["160"], n=3), loaded, log=lambda _: None)
    after = read_jsonl(out / "results.jsonl")
    assert len(after) == 3 * 3 and [m["questions"] for m in read_jsonl(out / "metrics.jsonl")] == [6, 3]
    # the contexts scored first are the same contexts under the larger n (their keys were fitted alike)
    cfg3 = _cfg(out, lengths=["160"], n=3)
    prompts = {i.id: i for i in grid_instances(cfg3, loaded[1], Length("160", 160), 0)}
    cfg2 = _cfg(out, lengths=["160"], n=2)
    for inst in grid_instances(cfg2, loaded[1], Length("160", 160), 0):
        assert prompts[inst.id].prompt == inst.prompt and inst.id in first


def test_a_resumed_map_says_how_far_it_was(loaded, tmp_path, capsys):
    out = tmp_path / "resume"
    run_map(_cfg(out, methods=["none"], lengths=["160"]), loaded, log=lambda _: None)
    capsys.readouterr()
    run_map(_cfg(out, methods=["none"], lengths=["160"], n=3), loaded, log=lambda _: None)
    assert f"resuming 6 of 9 questions already in {out}" in capsys.readouterr().err
