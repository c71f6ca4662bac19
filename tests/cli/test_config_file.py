"""``--config FILE``: settings from JSON / TOML / YAML, flags override, a run folder's config.json fed back."""
import json

import pytest
from typer.testing import CliRunner

from posbias.cli.config_file import read_settings_file, settings_with_file
from posbias.cli.main import app

runner = CliRunner()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(res, *needles):
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.output, res.output
    for needle in needles:
        assert needle in lines[0], (needle, res.output)


def test_json_toml_and_yaml_files_and_a_run_config_read_alike(tmp_path):
    settings = {"steps": 5, "lr": 0.002, "probe_tasks": ["passkey", "niah"], "model_overrides": {"hidden_size": 32}}
    (tmp_path / "a.json").write_text(json.dumps(settings))
    (tmp_path / "a.toml").write_text('steps = 5\nlr = 0.002\nprobe_tasks = ["passkey", "niah"]\n'
                                     '[model_overrides]\nhidden_size = 32\n')
    (tmp_path / "a.yaml").write_text("steps: 5\nlr: 0.002\nprobe_tasks: [passkey, niah]\n"
                                     "model_overrides:\n  hidden_size: 32\n")
    (tmp_path / "config.json").write_text(json.dumps({"kind": "train", "config": settings, "versions": {}}))
    for name in ("a.json", "a.toml", "a.yaml", "config.json"):
        assert read_settings_file(tmp_path / name, "train") == settings, name
    with pytest.raises(ValueError, match="config of a train run; posbias study needs the settings of a study run"):
        read_settings_file(tmp_path / "config.json", "study")
    (tmp_path / "bad.toml").write_text("steps = \n")
    with pytest.raises(ValueError, match="bad.toml: not valid TOML"):
        read_settings_file(tmp_path / "bad.toml", "train")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected settings as key: value pairs, got list"):
        read_settings_file(tmp_path / "list.json", "train")


def test_yaml_without_pyyaml_is_one_line(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml -> ImportError
    (tmp_path / "a.yml").write_text("steps: 5\n")
    with pytest.raises(ValueError, match="reading YAML needs PyYAML"):
        read_settings_file(tmp_path / "a.yml", "train")


def test_outside_a_command_the_given_settings_win_and_dicts_merge(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"steps": 5, "model_overrides": {"hidden_size": 32, "pe": "x"}}))
    got = settings_with_file(None, tmp_path / "a.json", "train", {"steps": 7, "model_overrides": {"pe": "rope"}},
                             ["steps", "model_overrides"])
    assert got == {"steps": 7, "model_overrides": {"hidden_size": 32, "pe": "rope"}}
    (tmp_path / "b.json").write_text(json.dumps({"stepz": 5, "lrr": 1}))
    with pytest.raises(ValueError, match=r"b.json: unknown train setting\(s\) lrr, stepz \(did you mean"):
        settings_with_file(None, tmp_path / "b.json", "train", {}, ["steps", "lr"])


def test_train_config_round_trip_flags_override_and_unknown_keys(tmp_path, tiny_tokenizer):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(["The grass is green.", "The sky is blue.", "The pass key is 12345."] * 60))
    tok = tmp_path / "tok"
    tiny_tokenizer.save_pretrained(tok)
    run = tmp_path / "run"
    res = cli("train", "--out", run, "--pe", "rope", "--steps", "2", "--context", "32", "--batch-size", "2",
              "--tokenizer", tok, "--corpus", corpus, "--warmup", "1", "--seed", "3",
              "--probe-tasks", "passkey,niah", "--model-opt", "num_hidden_layers=1", "--model-opt", "hidden_size=32",
              "--model-opt", "intermediate_size=64")
    assert res.exit_code == 0, res.output
    first = json.loads((run / "config.json").read_text())
    metrics = (run / "metrics.jsonl").read_text()
    assert first["config"]["probe_tasks"] == ["passkey", "niah"] and first["config"]["warmup_steps"] == 1
    # the run's config.json alone repeats it: same folder, same settings, nothing retrained
    res = cli("train", "--config", run / "config.json")
    assert res.exit_code == 0, res.output
    again = json.loads((run / "config.json").read_text())
    assert again["config"] == {**first["config"], "resume": True}  # resume: whether this invocation resumed
    assert (run / "metrics.jsonl").read_text() == metrics
    # a flag overrides the file: another folder, the rest as recorded
    res = cli("train", "--config", run / "config.json", "--out", tmp_path / "run2", "--steps", "1")
    assert res.exit_code == 0, res.output
    second = json.loads((tmp_path / "run2" / "config.json").read_text())["config"]
    assert {**second, "out": str(run), "steps": 2} == first["config"] and second["steps"] == 1
    # a changed setting on the same folder is refused as a resume with other settings
    one_line_error(cli("train", "--config", run / "config.json", "--seed", "4"), "other settings", "seed: 3 -> 4")
    # unknown keys, a config of another command, no --out anywhere
    (tmp_path / "bad.json").write_text(json.dumps({**first["config"], "stepz": 2, "lrr": 1}))
    one_line_error(cli("train", "--config", tmp_path / "bad.json"), "unknown train setting(s) lrr, stepz")
    (tmp_path / "study.json").write_text(json.dumps({"kind": "study", "config": {"n": 1}, "versions": {}}))
    one_line_error(cli("train", "--config", tmp_path / "study.json"), "config of a study run")
    (tmp_path / "no-out.toml").write_text("steps = 2\n")
    one_line_error(cli("train", "--config", tmp_path / "no-out.toml"), "missing --out")


def test_search_config_round_trip_and_flags_override(tmp_path):
    from conftest import save_tiny_folder

    tiny = save_tiny_folder(tmp_path / "tiny", max_positions=4096)
    out = tmp_path / "search"
    res = cli("search", "--model", tiny, "--task", "kv", "--num-keys", "4", "--population", "3", "--n-per-depth", "1",
              "--batch-size", "3", "--curve", "linear", "--heldout-n", "0", "--generations", "1", "--out", out)
    assert res.exit_code == 0, res.output
    first = json.loads((out / "config.json").read_text())["config"]
    assert first["overrides"] == {"population": 3, "n_per_depth": 1, "batch_size": 3, "generations": 1}
    assert first["task_options"] == {"num_keys": 4} and first["out"] == str(out)
    metrics = (out / "metrics.jsonl").read_text()
    res = cli("search", "--config", out / "config.json")
    assert res.exit_code == 0, res.output
    assert json.loads((out / "config.json").read_text())["config"] == first
    assert (out / "metrics.jsonl").read_text() == metrics  # resumed: nothing searched again
    # flags override the file: one more generation in the same folder (a merged GA override)
    res = cli("search", "--config", out / "config.json", "--generations", "2")
    assert res.exit_code == 0, res.output
    again = json.loads((out / "config.json").read_text())["config"]
    assert again["overrides"]["generations"] == 2 and again["overrides"]["population"] == 3
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    (tmp_path / "bad.toml").write_text('populaton = 3\n')
    one_line_error(cli("search", "--config", tmp_path / "bad.toml", "--out", tmp_path / "x"),
                   "unknown search setting(s) populaton")


def _rerun_from_its_config_scores_nothing(command: str, out, results: str = "results.jsonl") -> dict:
    """Re-run ``command`` with only ``--config out/config.json``: the same settings, nothing scored
    again (``out/results`` unchanged), the folder announced last; returns the settings."""
    first = json.loads((out / "config.json").read_text())["config"]
    before = (out / results).read_text()
    res = cli(command, "--config", out / "config.json")
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == f"outputs: {out.resolve()}"  # the file's out, announced
    assert json.loads((out / "config.json").read_text())["config"] == first
    assert (out / results).read_text() == before  # resumed: nothing scored again
    return first


def test_eval_config_round_trip(tmp_path):
    from conftest import save_tiny_folder

    tiny = save_tiny_folder(tmp_path / "tiny", max_positions=4096)
    out = tmp_path / "eval"
    res = cli("eval", "--model", tiny, "--task", "kv", "--num-keys", "4", "--n", "2", "--depths", "0,1",
              "--out", out)
    assert res.exit_code == 0, res.output
    first = _rerun_from_its_config_scores_nothing("eval", out)
    # --n from the command line over the file's: the same folder grows by one instance per depth
    res = cli("eval", "--config", out / "config.json", "--n", "3")
    assert res.exit_code == 0, res.output
    assert json.loads((out / "config.json").read_text())["config"] == {**first, "n": 3}
    one_line_error(cli("eval", "--config", out / "config.json", "--seed", "5"), "other settings")


def test_compare_config_round_trip_keeps_the_method_options(tmp_path):
    from conftest import save_tiny_folder

    tiny = save_tiny_folder(tmp_path / "tiny", max_positions=4096)
    out = tmp_path / "cmp"
    res = cli("compare", "--model", tiny, "--task", "kv", "--num-keys", "4", "--n", "1", "--depths", "0,1",
              "--methods", "none,pi", "--pi-factor", "1.3", "--out", out)
    assert res.exit_code == 0, res.output
    first = _rerun_from_its_config_scores_nothing("compare", out, "pi/results.jsonl")
    assert first["method_options"]["pi"] == {"factor": 1.3} and first["batch_size"] == 8  # not the flag's default
    res = cli("compare", "--config", out / "config.json", "--out", tmp_path / "cmp2", "--pi-factor", "1.2")
    assert res.exit_code == 0, res.output
    second = json.loads((tmp_path / "cmp2" / "config.json").read_text())["config"]
    assert second["method_options"]["pi"] == {"factor": 1.2} and second["methods"] == ["none", "pi"]


def test_tune_config_round_trip(tmp_path):
    from conftest import save_tiny_folder

    tiny = save_tiny_folder(tmp_path / "tiny", max_positions=4096)
    out = tmp_path / "tune"
    res = cli("tune", "--model", tiny, "--task", "kv", "--num-keys", "4", "--n-per-depth", "1", "--methods", "pi",
              "--out", out)
    assert res.exit_code == 0, res.output
    _rerun_from_its_config_scores_nothing("tune", out)
    one_line_error(cli("tune", "--config", out / "config.json", "--seed", "2"), "other settings")


def test_map_config_round_trip_keeps_the_method_options(tmp_path):
    from conftest import save_tiny_folder

    tiny = save_tiny_folder(tmp_path / "tiny", max_positions=1024)
    out = tmp_path / "map"
    res = cli("map", "--model", tiny, "--lengths", "96", "--depths", "0,1", "--n", "1", "--bootstrap", "20",
              "--methods", "none,pi", "--pi-factor", "1.3", "--out", out)
    assert res.exit_code == 0, res.output
    first = _rerun_from_its_config_scores_nothing("map", out)
    assert first["method_options"]["pi"] == {"factor": 1.3} and first["out"] == str(out)
    # --n over the file's: the same folder, one more context per length
    res = cli("map", "--config", out / "config.json", "--n", "2")
    assert res.exit_code == 0, res.output
    assert json.loads((out / "config.json").read_text())["config"] == {**first, "n": 2}
    one_line_error(cli("map", "--config", out / "config.json", "--seed", "3"), "other settings")
    one_line_error(cli("map", "--config", tmp_path / "tiny" / "missing.json"), "missing.json")


def test_analyze_config_round_trip(tmp_path):
    from conftest import save_tiny_folder

    tiny = save_tiny_folder(tmp_path / "tiny", max_positions=4096)
    factors = tmp_path / "f.json"
    factors.write_text(json.dumps({"format": "posbias-lpes-factors", "version": 1, "num_layers": 3,
                                   "factors": [1.0, 1.1, 1.2]}))
    out = tmp_path / "analyze"
    res = cli("analyze", "--model", tiny, "--factors", factors, "--num-keys", "4", "--n", "1", "--controls", "1",
              "--out", out)
    assert res.exit_code == 0, res.output
    first = _rerun_from_its_config_scores_nothing("analyze", out, "analysis.md")  # the same analysis again
    assert first["factors"] == str(factors) and first["task_options"] == {"num_keys": 4}
    res = cli("analyze", "--config", out / "config.json", "--out", tmp_path / "a2", "--sigma", "0.2")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "a2" / "config.json").read_text())["config"] == {
        **first, "sigma": 0.2, "out": str(tmp_path / "a2")}
    one_line_error(cli("analyze", "--model", tiny, "--out", tmp_path / "a3"), "missing --factors")


def test_train_moice_config_round_trip(tmp_path):
    from conftest import save_tiny_folder

    tiny = save_tiny_folder(tmp_path / "tiny", layers=2)
    corpus = tmp_path / "d.txt"
    corpus.write_text("Essay. The sky is blue and the grass is green. " * 40)
    out = tmp_path / "routers"
    res = cli("train-moice", "--model", tiny, "--corpus", corpus, "--top-k", "2", "--seq-len", "16", "--steps", "1",
              "--out", out)
    assert res.exit_code == 0, res.output
    first = _rerun_from_its_config_scores_nothing("train-moice", out, "metrics.jsonl")  # resumed: no step again
    assert first["top_k"] == 2 and first["corpus"] == str(corpus)
    res = cli("train-moice", "--config", out / "config.json", "--steps", "2")  # a larger budget resumes
    assert res.exit_code == 0, res.output
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    one_line_error(cli("train-moice", "--config", out / "config.json", "--seed", "4"), "other settings")


def test_positional_dims_config_round_trip(tmp_path):
    from conftest import save_tiny_folder

    tiny = save_tiny_folder(tmp_path / "tiny", layers=2)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The grass is green. The sky is blue. The pass key is 12345. " * 100)
    out = tmp_path / "dims"
    res = cli("positional-dims", "--model", tiny, "--corpus", corpus, "--samples", "2", "--length", "40",
              "--top-k", "3", "--out", out)
    assert res.exit_code == 0, res.output
    first = json.loads((out / "config.json").read_text())["config"]
    assert first["top_k"] == 3 and first["batch_size"] == 1 and first["out"] == str(out)
    dims = json.loads((out / "positional_dims.json").read_text())
    res = cli("positional-dims", "--config", out / "config.json")
    assert res.exit_code == 0, res.output
    assert json.loads((out / "config.json").read_text())["config"] == first
    again = json.loads((out / "positional_dims.json").read_text())
    assert {**again, "seconds": 0} == {**dims, "seconds": 0}  # the same dimensions from the same settings
    one_line_error(cli("positional-dims", "--config", out / "config.json", "--samples", "3"), "other settings")


def test_a_written_search_file_gives_the_preset_keys_as_the_flags_name_them(tmp_path):
    """``generations = 2`` at the top of a settings file was dropped without a word (a run's config.json
    records it beside its overrides); it is now an override, as --generations is."""
    from conftest import save_tiny_folder

    tiny = save_tiny_folder(tmp_path / "tiny", max_positions=4096)
    (tmp_path / "s.toml").write_text(f'model = "{tiny}"\ntask = "kv"\ntask_options = {{num_keys = 4}}\n'
                                     'curve = "linear"\nheldout_n = 0\npopulation = 3\ngenerations = 2\n'
                                     'n_per_depth = 1\nbatch_size = 3\n[ga]\nmutation_rate = 0.5\n')
    out = tmp_path / "s"
    res = cli("search", "--config", tmp_path / "s.toml", "--generations", "1", "--out", out)
    assert res.exit_code == 0, res.output
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["overrides"] == {"population": 3, "generations": 1, "n_per_depth": 1, "batch_size": 3,
                                "mutation_rate": 0.5}  # the flag wins over the file
    assert cfg["ga"]["population"] == 3 and cfg["ga"]["mutation_rate"] == 0.5


@pytest.mark.parametrize("settings, message", [
    ({"task_options": "x"}, "task_options must be a table of key: value pairs, got 'x'"),
    ({"method_options": 3}, "method_options must be a table of key: value pairs, got 3"),
    ({"chat": "yes"}, "chat must be true or false, got 'yes'"),
    ({"depths": [0, "a"]}, "depths must be a number, got 'a'"),
    ({"n": 2.5}, "n must be an integer, got 2.5"),
])
def test_a_settings_file_value_of_the_wrong_type_is_one_line(tmp_path, settings, message):
    (tmp_path / "c.json").write_text(json.dumps({"model": "smollm2-135m", "out": str(tmp_path / "x"), **settings}))
    one_line_error(cli("eval", "--config", tmp_path / "c.json"), message)
    assert not (tmp_path / "x").exists()


def test_a_partial_config_json_is_not_a_run_that_resumes(tmp_path):
    """A run folder whose config.json says only ``{"seed": 0}`` would match any eval and mix its results."""
    from conftest import save_tiny_folder

    tiny = save_tiny_folder(tmp_path / "tiny", max_positions=4096)
    out = tmp_path / "ev"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"kind": "eval", "config": {"seed": 0}}))
    (out / "results.jsonl").write_text("")
    res = cli("eval", "--model", tiny, "--task", "kv", "--num-keys", "4", "--n", "1", "--depths", "0", "--out", out)
    one_line_error(res, "records too few of the eval run's settings")


@pytest.mark.parametrize("make", ["fifo", "dev_zero", "alias_bomb", "huge"])
def test_settings_files_that_never_end_are_one_line(tmp_path, make):
    """A FIFO blocked, /dev/zero filled memory, a YAML alias bomb expanded without end: each is refused."""
    import os

    if make == "fifo":
        path = tmp_path / "s.json"
        os.mkfifo(path)
    elif make == "dev_zero":
        path = "/dev/zero"
    elif make == "alias_bomb":
        pytest.importorskip("yaml")
        lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
        lines += [f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]" for i in range(8)]
        path = tmp_path / "s.yaml"
        path.write_text("\n".join(lines) + "\n")
    else:  # a file larger than the limit (here 1 KiB instead of 256 MiB)
        from posbias.utils.io import read_text

        path = tmp_path / "s.json"
        path.write_text('{"steps": 1, "pad": "' + "x" * 2048 + '"}')
        with pytest.raises(ValueError, match="larger than the 1,024 bytes"):
            read_text(path, max_bytes=1024)
        return
    res = cli("train", "--config", path, "--out", tmp_path / "x")
    one_line_error(res, "--config" if make == "alias_bomb" else "not a regular file")


# ----------------------------------------------------------------------------- packaged protocols

def test_packaged_protocols_are_found_by_name_and_a_local_file_wins(tmp_path, monkeypatch):
    from posbias.cli.config_file import settings_path
    from posbias.protocols import protocol_names, protocol_path

    assert "quick" in protocol_names("study") and protocol_names("no-such-command") == []
    assert protocol_path("study", "quick").name == "quick.toml"
    assert all(protocol_path("study", bad) is None for bad in ("", "../study/quick", ".quick", "nope"))
    assert settings_path("quick", "study") == protocol_path("study", "quick")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quick").write_text("seed = 3\n")
    assert settings_path("quick", "study").resolve() == tmp_path / "quick"  # a file of that name wins
    with pytest.raises(ValueError, match=r"no such file, and posbias study ships no protocol of that name "
                                         r"\(its protocols: quick"):
        settings_path("quik", "study")


def test_the_quick_study_protocol_builds_a_valid_study(tmp_path):
    from posbias.study.config import StudyConfig
    from posbias.study.training import check_training_options
    from posbias.utils.options import field_types

    flags = settings_with_file(None, "quick", "study", {"out": str(tmp_path / "q")}, field_types(StudyConfig),
                               ignore=("ppl_eval_tokens", "resume"))
    cfg = StudyConfig(**flags)
    assert cfg.schemes == ["ggd", "rope"] and cfg.train_context == 128 and cfg.out == str(tmp_path / "q")
    assert cfg.lengths == [128, 256, 512, 1024] and cfg.train_options["probe_target"] == 0.95
    check_training_options(cfg)  # the trainer accepts every training option of the protocol


def test_study_help_names_the_quick_protocol_and_a_wrong_name_is_one_line(tmp_path):
    import re

    help_text = re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", cli("study", "--help").output))
    assert "a protocol that ships with posbias: quick" in help_text
    one_line_error(cli("study", "--config", "quik", "--out", tmp_path / "s"), "--config quik: no such file",
                   "its protocols: quick")
