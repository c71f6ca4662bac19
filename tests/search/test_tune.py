"""posbias tune: each baseline's settings chosen on the search split, then used by compare."""
from __future__ import annotations

import json

import pytest


@pytest.fixture
def tiny_folder(tmp_path):
    from conftest import save_tiny_folder

    return save_tiny_folder(tmp_path / "tiny", "qwen2", layers=3)


def _app():
    import typer

    from posbias.cli import eval_cmd, methods_cmd

    app = typer.Typer()
    methods_cmd.register(app)
    eval_cmd.register(app)
    return app


def test_tune_writes_every_setting_and_the_best_then_compare_uses_them(tiny_folder, tmp_path):
    from typer.testing import CliRunner

    from posbias.search.tune import DEFAULT_GRIDS

    runner = CliRunner()
    out = tmp_path / "tune"
    args = ["tune", "--model", str(tiny_folder), "--task", "kv", "--num-keys", "5", "--n-per-depth", "2",
            "--methods", "pi,ms-poe", "--out", str(out)]
    r = runner.invoke(_app(), args)
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == len(DEFAULT_GRIDS["pi"]) + len(DEFAULT_GRIDS["ms-poe"])
    best = json.loads((out / "best_settings.json").read_text())
    for m in ("pi", "ms-poe"):
        mine = [x for x in rows if x["method"] == m]
        top = max(mine, key=lambda x: (x["accuracy"], x["mean_logprob"]))
        assert best[m] == top["setting"] and set(top["per_depth"]) == {"0", "0.5", "1"}
    assert (out / "tune.md").read_text().count("chosen") == 2
    assert json.loads((out / "config.json").read_text())["kind"] == "tune"
    r = runner.invoke(_app(), args)  # a rerun resumes: nothing rescored
    assert r.exit_code == 0 and len((out / "results.jsonl").read_text().splitlines()) == len(rows)

    cmp_out = tmp_path / "cmp"
    r = runner.invoke(_app(), ["compare", "--model", str(tiny_folder), "--task", "kv", "--num-keys", "5", "--n", "1",
                               "--methods", "none,pi,ms-poe", "--settings", str(out / "best_settings.json"),
                               "--out", str(cmp_out)])
    assert r.exit_code == 0, r.output
    cfg = json.loads((cmp_out / "config.json").read_text())["config"]
    assert cfg["method_options"]["pi"] == best["pi"] and cfg["method_options"]["ms-poe"] == best["ms-poe"]


def test_a_resumed_tune_says_how_far_it_was(tiny_folder, tmp_path):
    from typer.testing import CliRunner

    out = tmp_path / "tune"
    args = ["tune", "--model", str(tiny_folder), "--task", "kv", "--num-keys", "5", "--n-per-depth", "1",
            "--methods", "pi", "--out", str(out)]
    r = CliRunner().invoke(_app(), args)
    assert r.exit_code == 0 and "resuming" not in r.output, r.output
    rows = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("".join(x + "\n" for x in rows[:3]))  # killed after 3 settings
    r = CliRunner().invoke(_app(), args)
    assert r.exit_code == 0, r.output
    assert f"resuming 3 of {len(rows)} settings already in {out}" in r.output
    assert len((out / "results.jsonl").read_text().splitlines()) == len(rows)


def test_tune_refuses_what_it_cannot_tune_before_loading(tiny_folder, tmp_path):
    from typer.testing import CliRunner

    runner = CliRunner()
    base = ["tune", "--model", str(tiny_folder), "--out", str(tmp_path / "t")]
    r = runner.invoke(_app(), base + ["--methods", "lpes"])
    assert r.exit_code == 2 and "no settings grid for method 'lpes'" in r.output
    r = runner.invoke(_app(), base + ["--methods", "moice"])
    assert r.exit_code == 2 and "moice needs trained routers" in r.output
    assert not (tmp_path / "t").exists()
    r = runner.invoke(_app(), ["compare", "--model", str(tiny_folder), "--methods", "none,pi", "--settings",
                               str(tmp_path / "missing.json"), "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "settings file not found" in r.output


def test_the_objective_chooses_the_setting_like_the_search_would():
    """Two settings where accuracy and log-prob disagree: each objective picks its own winner."""
    from posbias.search.fitness import FitnessResult
    from posbias.search.tune import _best, setting_key

    def row(setting, correct, lp):
        res = FitnessResult({"0": [correct, 2, 2]}, {"0": 1.0}, logprob_sum=lp, n_scored=2, n_total=2,
                            logprob_by_depth={"0": lp})
        return {"key": setting_key("pi", setting), "setting": setting, "fitness": res.to_dict()}

    a, b = {"factor": 1.1}, {"factor": 1.5}
    done = {r["key"]: r for r in (row(a, 2, -3.0), row(b, 1, -0.5))}
    assert _best(done, "pi", [a, b], "accuracy")["setting"] == a
    assert _best(done, "pi", [a, b], "logprob")["setting"] == b


def test_tune_positional_hidden_and_temperature(tiny_folder, tmp_path):
    """positional-hidden's grid is dimension x band x factor from a positional-dims JSON; temperature's
    the global values; the chosen settings re-apply."""
    from typer.testing import CliRunner

    from posbias.methods.positional_hidden import TUNE_BANDS, TUNE_FACTORS
    from posbias.search.tune import DEFAULT_GRIDS

    dims = tmp_path / "dims.json"
    dims.write_text(json.dumps({"dims": [{"dim": 5}, {"dim": 17}]}))
    out = tmp_path / "tune"
    args = ["tune", "--model", str(tiny_folder), "--task", "kv", "--num-keys", "4", "--n-per-depth", "1",
            "--methods", "positional-hidden,temperature", "--dims-file", str(dims), "--out", str(out)]
    r = CliRunner().invoke(_app(), args)
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    ph = [x["setting"] for x in rows if x["method"] == "positional-hidden"]
    assert len(ph) == 2 * len(TUNE_BANDS) * len(TUNE_FACTORS) + 1 and {s["dims"][0] for s in ph} == {5, 17}
    assert ph[0] == {"dims": [5], "dims_file": None, "band": [10 / 32, 26 / 32], "factor": 0.0}
    assert ph[-1] == {**ph[0], "factor": 1.0}  # the unchanged model, for reference
    plain = [x for x in rows if x["setting"] == ph[-1]][0]
    t1 = [x for x in rows if x["method"] == "temperature" and x["setting"] == {"t": 1.0}][0]
    assert plain["weighted_logprob"] == pytest.approx(t1["weighted_logprob"], abs=1e-5)
    assert len([x for x in rows if x["method"] == "temperature"]) == len(DEFAULT_GRIDS["temperature"])
    best = json.loads((out / "best_settings.json").read_text())
    from conftest import make_tiny_model

    from posbias.methods import apply_method

    for m in ("positional-hidden", "temperature"):
        apply_method(make_tiny_model("qwen2", layers=3), m, **best[m]).remove()
    r = CliRunner().invoke(_app(), ["tune", "--model", str(tiny_folder), "--methods", "positional-hidden",
                                    "--out", str(tmp_path / "t2")])
    assert r.exit_code == 2 and "--dims-file" in r.output


def test_the_positional_hidden_sweep_records_equal_each_setting_scored_alone(tiny_tokenizer):
    """tune scores positional-hidden's grid in one sweep; each record equals score_setting's."""
    from conftest import make_variant_model

    from posbias.search.tune import score_hidden_grid, score_setting
    from posbias.tasks.registry import make_instances

    model = make_variant_model("qwen2-gqa7")
    instances = make_instances("kv", tokenizer=tiny_tokenizer, n=2, depths=[0.0, 1.0], seed=0, split="search",
                               num_keys=3, shared_context=True)
    grid = [{"dims": [d], "factor": f, "layers": [0, 1, 2]} for d in (3, 50) for f in (0.0, -4.0)]
    swept = score_hidden_grid(model, tiny_tokenizer, grid, instances)
    for setting, got in zip(grid, swept):
        want = score_setting(model, tiny_tokenizer, "positional-hidden", setting, instances, batch_size=2)
        assert got["per_depth"] == want["per_depth"]
        assert got["weighted_logprob"] == pytest.approx(want["weighted_logprob"], abs=1e-5)
    assert len({round(r["weighted_logprob"], 4) for r in swept}) > 1  # the settings differ
