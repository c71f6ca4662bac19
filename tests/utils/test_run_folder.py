"""Run folders record every invocation that wrote into them (config.json holds only the last)."""
import json

import pytest
from conftest import held_by_another_process

from posbias.utils.run_folder import CONFIG, INVOCATIONS, open_run


def _lines(folder):
    return [json.loads(line) for line in (folder / INVOCATIONS).read_text().splitlines()]


def test_each_committed_invocation_is_appended_and_config_holds_the_last(tmp_path):
    out = tmp_path / "run"
    open_run(out, "study", {"schemes": ["ggd"], "seed": 1}, check_keys=["seed"]).commit()
    second = open_run(out, "study", {"schemes": ["alibi"], "seed": 1}, check_keys=["seed"])
    second.commit()
    second.commit()  # one line per invocation, however often a run commits
    lines = _lines(out)
    assert [r["config"]["schemes"] for r in lines] == [["ggd"], ["alibi"]]
    assert [r["resumed"] for r in lines] == [False, True]
    assert all(r["kind"] == "study" and r["time"] and r["argv"] for r in lines)
    assert json.loads((out / CONFIG).read_text())["config"]["schemes"] == ["alibi"]


def test_a_rejected_invocation_appends_nothing(tmp_path):
    out = tmp_path / "run"
    open_run(out, "study", {"seed": 1}, check_keys=["seed"]).commit()
    with pytest.raises(ValueError, match="other settings"):
        open_run(out, "study", {"seed": 2}, check_keys=["seed"])
    open_run(tmp_path / "never", "study", {"seed": 1})  # checked, never committed
    assert len(_lines(out)) == 1 and not (tmp_path / "never").exists()


def test_a_study_folder_discarded_before_any_result_leaves_no_invocation_record(tmp_path):
    from posbias.study.runner import discard_unfinished

    out = tmp_path / "study"
    open_run(out, "study", {"seed": 0, "train_context": 256}, check_keys=["seed"]).commit()
    discard_unfinished(out, {"seed": 0, "train_context": 4})  # nothing trained or scored yet
    assert not any(out.iterdir())
    open_run(out, "study", {"seed": 0, "train_context": 4}, check_keys=["seed"]).commit()
    assert len(_lines(out)) == 1


def test_settings_diff_names_nested_changes_with_short_floats():
    from posbias.utils.run_folder import settings_diff

    old = {"lr": 0.003, "ga": {"population": 6}, "std": None, "same": 1}
    new = {"lr": 0.003, "ga": {"population": 3}, "std": 128 ** -0.5, "same": 1}
    assert settings_diff(old, new, ["lr", "ga", "std", "same", "absent"]) == \
        ["ga.population: 6 -> 3", "std: None -> 0.0883883"]


def test_a_folder_another_running_process_writes_into_is_refused_until_that_process_ends(tmp_path):
    out = tmp_path / "run"
    with held_by_another_process(out, run_kind="eval"):
        with pytest.raises(ValueError, match=f"{out} is in use by another running posbias command"):
            open_run(out, "eval", {"n": 1})  # the resume a second command would make
        assert len(_lines(out)) == 1  # nothing of the refused command was written
    folder = open_run(out, "eval", {"n": 1})  # a killed holder leaves no stale lock
    folder.commit()
    assert [r["resumed"] for r in _lines(out)] == [False, True]
    assert sorted(p.name for p in out.iterdir()) == [CONFIG, INVOCATIONS]  # no lock file left in the folder


def test_one_process_may_open_and_commit_its_own_folder_again(tmp_path):
    out = tmp_path / "run"
    open_run(out, "eval", {"n": 1}).commit()
    open_run(out, "eval", {"n": 1}).commit()  # a resume inside the same process (a study, a test)
    open_run(tmp_path / "top", "compare", {}).commit()
    open_run(tmp_path / "top" / "none", "eval", {"n": 1}, parent=open_run(tmp_path / "top", "compare", {})).commit()
    assert len(_lines(out)) == 2 and len(_lines(tmp_path / "top")) == 2


def test_the_other_ranks_of_a_torchrun_job_use_the_folder_rank_0_holds(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with held_by_another_process(out, run_kind="eval"):  # rank 0, which committed the run
        monkeypatch.setenv("RANK", "1")
        assert open_run(out, "eval", {"n": 1}).resuming  # rank 1's check of the same folder
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(ValueError, match="in use"):
            open_run(out, "eval", {"n": 1})


def test_two_runs_opened_on_one_new_folder_are_checked_again_when_committed(tmp_path):
    """Both found the folder new; the first committed. The second, committing later, is refused
    for other settings or another kind of run, and resumes a run of its own settings."""
    out = tmp_path / "new"
    first = open_run(out, "eval", {"n": 1}, check_keys=["n"])
    other = open_run(out, "eval", {"n": 2}, check_keys=["n"])
    search = open_run(out, "search", {"n": 1}, check_keys=["n"])
    same = open_run(out, "eval", {"n": 1}, check_keys=["n"])
    first.commit()
    with pytest.raises(ValueError, match="other settings \\(n: 1 -> 2\\)"):
        other.commit()
    with pytest.raises(ValueError, match="holds an eval run"):
        search.commit()
    assert json.loads((out / CONFIG).read_text())["config"] == {"n": 1} and len(_lines(out)) == 1
    assert not same.resuming
    same.commit()
    assert same.resuming and [r["resumed"] for r in _lines(out)] == [False, True]


def test_a_config_without_its_settings_is_refused(tmp_path):
    out = tmp_path / "run"
    for bad in ({}, [1], None):
        out.mkdir(exist_ok=True)
        (out / CONFIG).write_text(json.dumps({"kind": "eval", "config": bad}))
        with pytest.raises(ValueError, match=f"{CONFIG} records no settings of its run"):
            open_run(out, "eval", {"n": 1}, check_keys=["n"])


def test_the_run_records_the_git_commit_outside_the_resume_check(tmp_path, monkeypatch):
    import subprocess
    from pathlib import Path

    from posbias.utils import run_folder

    package = Path(run_folder.__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True)
    run_folder.git_commit.cache_clear()
    commit = run_folder.git_commit()
    if head.returncode == 0:
        assert commit.split("+")[0] == head.stdout.strip() and commit[40:] in ("", "+dirty")
    else:
        assert commit == "not a git checkout"
    open_run(tmp_path / "r", "eval", {"n": 1}, check_keys=["n"]).commit()
    doc = json.loads((tmp_path / "r" / CONFIG).read_text())
    assert doc["git"] == commit
    doc["git"] = "0" * 40  # a run made at another commit still resumes
    (tmp_path / "r" / CONFIG).write_text(json.dumps(doc))
    assert open_run(tmp_path / "r", "eval", {"n": 1}, check_keys=["n"]).resuming
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    run_folder.git_commit.cache_clear()
    try:
        assert run_folder.git_commit() == "not a git checkout"
    finally:
        run_folder.git_commit.cache_clear()
