"""Bad input as a new user would type it (issue 15), through the CLI on a tiny model: one line naming
the problem, exit code 2, nothing written that was not there, nothing lost."""
import gzip
import importlib
import json
import re
import sys

import pytest
from conftest import held_by_another_process
from typer.testing import CliRunner

from posbias.cli.main import app
from posbias.utils.io import read_jsonl

runner = CliRunner()
KV = ["--task", "kv", "--num-keys", "4", "--n", "1", "--depths", "0,1"]
SEARCH = ["--task", "kv", "--num-keys", "4", "--population", "3", "--n-per-depth", "1", "--batch-size", "3",
          "--curve", "linear", "--heldout-n", "0"]


def _factors(path, values):
    path.write_text(json.dumps({"format": "posbias-lpes-factors", "version": 1, "num_layers": len(values),
                                "factors": values}))
    return str(path)


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def text(res) -> str:
    """The output with rich's box drawing and line wrapping removed."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", res.output).split())


def refused(res, *needles):
    """Exit code 2 with one clear message containing ``needles`` and no traceback."""
    out = text(res)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    for needle in needles:
        assert needle in out, (needle, res.output)


def snapshot(folder):
    """Every file below ``folder`` with its bytes (to show nothing was written or lost)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _eval(tiny, out, *extra):
    return cli("eval", "--model", tiny, *KV, "--out", out, *extra)


# -- 1. data loss ---------------------------------------------------------------------------------

def test_eval_into_a_model_written_by_apply_is_refused(tiny, factors, tmp_path):
    model = tmp_path / "patched"
    assert cli("apply", "--model", tiny, "--factors", factors, "--out", model).exit_code == 0
    before = snapshot(model)
    refused(_eval(tiny, model), str(model), "model written by posbias apply")
    assert snapshot(model) == before
    from posbias.models import load_model

    load_model(str(model))  # still loads


def test_apply_into_an_eval_run_is_refused(tiny, factors, tmp_path):
    run = tmp_path / "run"
    assert _eval(tiny, run).exit_code == 0
    before = snapshot(run)
    refused(cli("apply", "--model", tiny, "--factors", factors, "--out", run), "holds an eval run")
    assert snapshot(run) == before


def test_apply_into_its_own_output_is_allowed(tiny, factors, tmp_path):
    model = tmp_path / "patched"
    assert cli("apply", "--model", tiny, "--factors", factors, "--out", model).exit_code == 0
    assert cli("apply", "--model", tiny, "--factors", factors, "--out", model).exit_code == 0


@pytest.mark.parametrize("command", ["eval", "compare", "search", "analyze", "apply"])
def test_a_hugging_face_model_folder_is_never_an_out_folder(tiny, factors, tmp_path, command):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny, model)
    before = snapshot(model)
    args = {"eval": KV, "compare": KV + ["--methods", "none"], "search": SEARCH + ["--generations", "1"],
            "analyze": ["--factors", factors], "apply": ["--factors", factors]}[command]
    refused(cli(command, "--model", model, *args, "--out", model), "holds a Hugging Face model", "model_type")
    assert snapshot(model) == before


@pytest.mark.parametrize("command", ["eval", "compare", "search", "analyze", "apply", "train", "study"])
def test_a_foreign_non_empty_folder_is_refused(tiny, factors, tmp_path, command):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    args = {"eval": ["--model", tiny, *KV], "compare": ["--model", tiny, *KV, "--methods", "none"],
            "search": ["--model", tiny, *SEARCH, "--generations", "1"],
            "analyze": ["--model", tiny, "--factors", factors],
            "apply": ["--model", tiny, "--factors", factors], "train": ["--steps", "2"], "study": ["--n", "1"]}[command]
    refused(cli(command, *args, "--out", out), "is not empty", "notes.txt", "holds no posbias run")
    assert snapshot(out) == {"notes.txt": b"my notes"}


@pytest.mark.parametrize("command", ["search", "compare", "train", "study"])
def test_another_kind_of_run_is_refused(tiny, tmp_path, command):
    run = tmp_path / "run"
    assert _eval(tiny, run).exit_code == 0
    before = snapshot(run)
    args = {"compare": ["--model", tiny, *KV, "--methods", "none"],
            "search": ["--model", tiny, *SEARCH, "--generations", "1"], "train": [], "study": []}[command]
    refused(cli(command, *args, "--out", run), "holds an eval run", f"not a {command} run")
    assert snapshot(run) == before


@pytest.mark.parametrize("command", ["eval", "compare", "search", "train", "study"])
def test_a_folder_another_running_command_writes_into_is_refused(tiny, tmp_path, command):
    out = tmp_path / "busy"
    args = {"eval": ["--model", tiny, *KV], "compare": ["--model", tiny, *KV, "--methods", "none"],
            "search": ["--model", tiny, *SEARCH, "--generations", "1"], "train": ["--steps", "2"],
            "study": ["--n", "1"]}[command]
    with held_by_another_process(out):
        refused(cli(command, *args, "--out", out), f"{out} is in use by another running posbias command")
        assert snapshot(out) == {}


def test_a_file_is_not_an_out_folder(tiny, tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    refused(_eval(tiny, f), "is a file, not a folder")
    assert f.read_text() == "x"


# -- 2. / 3. count options are checked while parsing -------------------------------------------------

@pytest.mark.parametrize("command, option, value", [
    ("eval", "--batch-size", "-2"), ("eval", "--batch-size", "0"), ("eval", "--n", "0"),
    ("eval", "--max-new-tokens", "0"), ("eval", "--num-keys", "0"), ("eval", "--length", "0"),
    ("eval", "--num-docs", "0"), ("eval", "--num-needles", "0"), ("eval", "--seed", "-1"),
    ("compare", "--batch-size", "0"), ("compare", "--batch-size", "-1"), ("compare", "--n", "0"),
    ("search", "--workers", "0"), ("search", "--population", "0"), ("search", "--generations", "0"),
    ("search", "--n-per-depth", "0"), ("search", "--batch-size", "0"), ("search", "--heldout-n", "-1"),
    ("search", "--control-points", "1"),
    ("analyze", "--n", "0"), ("analyze", "--controls", "0"),
    ("train", "--steps", "0"), ("train", "--batch-size", "0"), ("train", "--context", "-1"),
    ("train", "--grad-accum", "0"), ("train", "--checkpoint-every", "0"), ("train", "--log-every", "0"),
    ("train", "--probe-every", "-1"), ("train", "--warmup", "-1"),
    ("study", "--n", "0"), ("study", "--train-steps", "0"), ("study", "--train-context", "0"),
    ("study", "--batch-size", "0"), ("study", "--train-workers", "0"), ("study", "--token-budget", "0"),
    ("study", "--ppl-tokens", "0"),
    ("train-moice", "--steps", "0"), ("train-moice", "--top-k", "0"),
])
def test_count_options_are_refused_at_parse_time(tiny, factors, tmp_path, monkeypatch, command, option, value):
    forbid_model_loading(monkeypatch)
    out = tmp_path / "out"
    extra = {"compare": ["--methods", "none"], "analyze": ["--factors", factors]}.get(command, [])
    model = ["--model", tiny] if command not in ("train", "study") else []
    refused(cli(command, *model, *extra, option, value, "--out", out), f"'{option}'", "Invalid value")
    assert not out.exists()


def _no_model(*a, **k):
    raise AssertionError("the model was loaded before the input was checked")


# modules that bind ``load_model`` by name when first imported: imported before the patch, so that none
# first imported while it is on keeps ``_no_model`` for later tests
LOADING_MODULES = ("posbias.models", "posbias.evaluation.bias_map", "posbias.evaluation.compare",
                   "posbias.evaluation.lm_eval_adapter", "posbias.evaluation.session", "posbias.search.tune",
                   "posbias.search.runner", "posbias.study.training")


def forbid_model_loading(monkeypatch):
    """Make every ``load_model`` the commands reach fail the test (each module's own binding patched)."""
    for name in LOADING_MODULES:
        importlib.import_module(name)
    real = sys.modules["posbias.models.loader"].load_model
    for name, module in list(sys.modules.items()):
        if name.startswith("posbias") and getattr(module, "load_model", None) is real:
            monkeypatch.setattr(module, "load_model", _no_model)


def test_compare_table_of_empty_summaries():
    from posbias.evaluation.compare import comparison_table

    table = comparison_table({"none": {"by_depth": [], "overall": 0.0}})
    assert "| none |" in table and "n = 0 per depth" in table


def test_evaluate_refuses_a_batch_size_below_one(tmp_path):
    from posbias.evaluation.runner import evaluate

    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        evaluate(None, None, [object()], tmp_path / "run", batch_size=-2)
    assert not (tmp_path / "run").exists()


# -- 4. broken data files and configs name the file and the cause ----------------------------------

def _kv_file(path):
    line = json.dumps({"ordered_kv_records": [[f"k{i}", f"v{i}"] for i in range(4)], "key": "k1", "value": "v1"})
    data = ("\n".join([line] * 200) + "\n").encode()
    if path.suffix == ".gz":
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("command", ["eval", "search"])
@pytest.mark.parametrize("damage, message", [
    ("truncated", "truncated gzip file"), ("plain", "not a valid gzip file"), ("latin1", "not UTF-8"),
])
def test_broken_data_file_names_file_and_cause(tiny, tmp_path, monkeypatch, command, damage, message):
    forbid_model_loading(monkeypatch)  # checked before the model loads
    path = tmp_path / ("data.jsonl" if damage == "latin1" else "data.jsonl.gz")
    if damage == "truncated":
        data = _kv_file(path).read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif damage == "plain":
        _kv_file(tmp_path / "plain.jsonl").rename(path)
    else:
        path.write_bytes(_kv_file(tmp_path / "ok.jsonl").read_bytes() + b'{"key": "caf\xe9"}\n')
    args = ["--task", "kv-uuid", "--path", path, "--n", "1"] if command == "eval" else \
        ["--task", "kv-uuid", "--path", path, "--n-per-depth", "1", "--population", "3", "--generations", "1"]
    out = tmp_path / "out"
    refused(cli(command, "--model", tiny, *args, "--out", out), str(path), message)
    assert not out.exists()


@pytest.mark.parametrize("command", ["eval", "compare", "search", "analyze", "train", "study"])
def test_corrupt_config_in_out_is_named(tiny, factors, tmp_path, command):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{'kind': 'eval'}")
    args = {"eval": ["--model", tiny, *KV], "compare": ["--model", tiny, *KV, "--methods", "none"],
            "search": ["--model", tiny, *SEARCH, "--generations", "1"],
            "analyze": ["--model", tiny, "--factors", factors], "train": [], "study": []}[command]
    refused(cli(command, *args, "--out", out), str(out / "config.json"), "not valid JSON",
            "Expecting property name")
    assert snapshot(out) == {"config.json": b"{'kind': 'eval'}"}


# -- 5. a rejected run does not lock its folder ----------------------------------------------------

@pytest.mark.parametrize("bad, good, message", [
    (["--num-keys", "4", "--method", "foo"], ["--num-keys", "4"], "unknown method"),
    (["--task", "passkey", "--length", "9000"], ["--task", "passkey", "--length", "200"], "longer than the model"),
    (["--num-keys", "4", "--method", "lpes", "--factors", "NEG"], ["--num-keys", "4", "--method", "lpes",
                                                                   "--factors", "POS"], "factor -1.0"),
])
def test_a_rejected_run_leaves_the_folder_free(tiny, tmp_path, bad, good, message):
    neg = _factors(tmp_path / "neg.json", [1.0, -1.0, 1.0])
    pos = _factors(tmp_path / "pos.json", [1.0, 1.2, 1.0])
    sub = {"NEG": neg, "POS": pos}
    base = ["eval", "--model", tiny, "--n", "1", "--depths", "0", "--out", tmp_path / "run"]
    res = cli(*base, *[sub.get(a, a) for a in bad])
    refused(res, message)
    assert not (tmp_path / "run").exists()
    res = cli(*base, *[sub.get(a, a) for a in good])
    assert res.exit_code == 0, res.output


def test_search_rejected_then_corrected_and_a_short_settings_diff(tiny, tmp_path):
    out = tmp_path / "search"
    refused(cli("search", "--model", tiny, *SEARCH, "--generations", "0", "--out", out), "'--generations'")
    assert not out.exists()
    assert cli("search", "--model", tiny, *SEARCH, "--generations", "1", "--out", out).exit_code == 0
    res = cli("search", "--model", tiny, *[("4" if a == "3" and i == SEARCH.index("--population") + 1 else a)
                                            for i, a in enumerate(SEARCH)], "--generations", "1", "--out", out)
    refused(res, "other settings", "ga.population: 3 -> 4")
    assert "crossover_rate" not in res.output  # only what differs


# -- 6. compare: a refused run writes nothing; the recorded settings stay true ----------------------

def test_refused_compare_leaves_its_config_alone(tiny, tmp_path):
    out = tmp_path / "cmp"
    assert cli("compare", "--model", tiny, *KV, "--methods", "none", "--out", out).exit_code == 0
    before = snapshot(out)
    refused(cli("compare", "--model", tiny, *KV, "--methods", "none", "--seed", "1", "--out", out),
            "other settings", "seed: 0 -> 1")
    assert snapshot(out) == before


def test_compare_with_a_subset_of_depths_is_not_a_resume(tiny, tmp_path):
    out = tmp_path / "cmp"
    args = ["compare", "--model", tiny, "--task", "kv", "--num-keys", "4", "--n", "1", "--methods", "none"]
    assert cli(*args, "--depths", "0,0.5,1", "--out", out).exit_code == 0
    before = snapshot(out)
    refused(cli(*args, "--depths", "0,1", "--out", out), "other settings", "depths: [0.0, 0.5, 1.0] -> [0.0, 1.0]")
    assert snapshot(out) == before


def test_compare_resume_records_the_settings_its_table_shows(tiny, tmp_path):
    out = tmp_path / "cmp"
    args = ["compare", "--model", tiny, *KV, "--out", out]
    assert cli(*args, "--methods", "none").exit_code == 0
    assert cli(*args, "--methods", "none,pi").exit_code == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["kind"] == "compare" and cfg["config"]["methods"] == ["none", "pi"]
    assert "| pi |" in (out / "comparison.md").read_text()
    assert len(read_jsonl(out / "none" / "results.jsonl")) == 2  # none was not scored twice


# -- 7. an empty --out ------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["eval", "compare", "search", "analyze", "apply", "train", "study", "demo"])
def test_empty_out_is_refused(tiny, factors, tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    forbid_model_loading(monkeypatch)
    args = {"eval": ["--model", tiny, *KV], "compare": ["--model", tiny, *KV, "--methods", "none"],
            "search": ["--model", tiny, *SEARCH], "analyze": ["--model", tiny, "--factors", factors],
            "apply": ["--model", tiny, "--factors", factors]}.get(command, [])
    refused(cli(command, *args, "--out", ""), "--out is empty")
    assert list(tmp_path.iterdir()) == []


# -- 8. / 9. search resumes on re-run; a killed search's factors file says it is interim --------------

def test_killed_search_is_interim_and_resumes_on_rerun(tiny, tmp_path, monkeypatch):
    from posbias.cli import lpes_cmd

    out = tmp_path / "search"
    args = ["search", "--model", tiny, *SEARCH, "--generations", "2", "--out", out]
    real = lpes_cmd.generation_line

    def kill_after_first(m):
        if m["generation"] == 1:
            raise KeyboardInterrupt
        return real(m)

    monkeypatch.setattr(lpes_cmd, "generation_line", kill_after_first)
    assert cli(*args).exit_code != 0
    doc = json.loads((out / "best_factors.json").read_text())
    assert doc["interim"] is True and doc["generations"] == 1 and doc["generations_planned"] == 2
    monkeypatch.setattr(lpes_cmd, "generation_line", real)
    res = cli(*args)  # no --resume: re-running resumes
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "best_factors.json").read_text())
    assert doc["interim"] is False and doc["generations"] == 2
    assert [m["generation"] for m in read_jsonl(out / "metrics.jsonl")] == [0, 1]


# -- 10. factors must be numbers ------------------------------------------------------------------------

def _strict_factors() -> bool:
    from posbias.patching.rope_scaling import validate_factors

    try:
        validate_factors(["1.0", True], 2)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("values", [["1.0", "1.1", "1.2"], [True, 1.0, 1.0]])
@pytest.mark.parametrize("command", ["eval", "apply"])
def test_factors_that_are_not_numbers_are_refused(tiny, tmp_path, command, values):
    if not _strict_factors():
        pytest.skip("needs posbias.patching.rope_scaling.validate_factors to reject strings and booleans "
                    "(owned by the models/patching work, not the CLI)")
    f = _factors(tmp_path / "f.json", values)
    args = ["--method", "lpes", "--factors", f, *KV] if command == "eval" else ["--factors", f]
    out = tmp_path / "out"
    refused(cli(command, "--model", tiny, *args, "--out", out), str(f))
    assert not out.exists()


# -- 11. cheap checks come before the model loads ----------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["eval", *KV, "--method", "foo"], "unknown method 'foo'"),
    (["eval", *KV, "--method", "pi", "--method-opt", "nope=1"], "has no option(s) nope"),
    (["eval", *KV, "--method", "lpes"], "needs its factors file"),
    (["eval", *KV, "--method", "lpes", "--factors", "MISSING"], "does not exist"),
    (["eval", *KV, "--method", "lpes", "--factors", "NEG"], "every factor must be a number from 0.001 to 1000"),
    (["eval", *KV, "--mode", "sample"], "unknown mode 'sample'"),
    (["eval", "--task", "bogus", "--n", "1"], "unknown task"),
    (["compare", *KV, "--methods", "none,foo"], "unknown method 'foo'"),
    (["compare", *KV, "--methods", "none,lpes", "--factors", "NEG"],
     "every factor must be a number from 0.001 to 1000"),
    (["compare", *KV, "--methods", "none,none"], "more than once"),
    (["compare", *KV, "--methods", "none,pi", "--pi-factor", "0"], "--pi-factor must be > 0"),
    (["analyze", "--factors", "NEG"], "every factor must be a number from 0.001 to 1000"),
    (["apply", "--factors", "NEG"], "every factor must be a number from 0.001 to 1000"),
    (["search", *SEARCH, "--preset", "huge"], "unknown preset"),
    (["search", *SEARCH, "--weights", "1,2"], "fitness weights"),
    (["search", *SEARCH, "--backend", "mpi"], "unknown backend"),
    (["eval", *KV, "--opt", "shared_context=yes"], "shared_context must be true or false, got 'yes'"),
    (["eval", *KV, "--opt", "shared_context=true", "--chat"], "scored without a chat template"),
    (["eval", *KV, "--opt", "key_words=0"], "key_words must be >= 1"),
])
def test_input_is_checked_before_the_model_loads(tiny, tmp_path, monkeypatch, args, message):
    forbid_model_loading(monkeypatch)
    sub = {"NEG": _factors(tmp_path / "neg.json", [1.0, -1.0, 1.0]), "MISSING": str(tmp_path / "missing.json")}
    out = tmp_path / "out"
    refused(cli(*[sub.get(a, a) for a in args], "--model", tiny, "--out", out), message)
    assert not out.exists()


def test_passkey_length_beyond_the_model_is_refused_before_fitting(tiny, tmp_path, monkeypatch):
    import posbias.tasks.passkey

    def no_fit(*a, **k):
        raise AssertionError("fitted a haystack for a length the model cannot hold")

    monkeypatch.setattr(posbias.tasks.passkey, "fit_units", no_fit)
    for command, extra in (("eval", ["--n", "1"]), ("search", ["--population", "3", "--generations", "1"])):
        res = cli(command, "--model", tiny, "--task", "passkey", "--length", "1000000", *extra,
                  "--out", tmp_path / command)
        refused(res, "length 1000000 is longer than the model holds (4096 positions)")
        assert not (tmp_path / command).exists()


def test_study_with_a_missing_corpus_writes_nothing(tmp_path):
    out = tmp_path / "study"
    refused(cli("study", "--corpus", tmp_path / "nope.txt", "--out", out), "--corpus", "no such file or folder")
    assert not out.exists()


def test_train_with_a_missing_corpus_writes_nothing(tmp_path):
    out = tmp_path / "train"
    refused(cli("train", "--corpus", tmp_path / "nope.txt", "--out", out), "--corpus", "no such file or folder")
    assert not out.exists()


def test_a_final_step_past_the_schedule_is_refused_before_anything_is_written(tmp_path):
    refused(cli("train", "--steps", "6", "--final-step", "7", "--out", tmp_path / "train"),
            "final_step must lie in [1, steps = 6], got 7")
    refused(cli("study", "--train-steps", "6", "--train-opt", "final_step=0", "--out", tmp_path / "study"),
            "final_step must lie in [1, steps = 6], got 0")
    assert not (tmp_path / "train").exists() and not (tmp_path / "study").exists()


def test_an_unknown_passkey_filler_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "train"
    refused(cli("train", "--passkey-haystack", "essay", "--out", out), "passkey_haystack must be one of",
            "noise, corpus, mixed")
    refused(cli("study", "--train-opt", "passkey_haystack=essay", "--out", tmp_path / "study"),
            "passkey_haystack must be one of")
    refused(cli("train", "--niah-haystack", "grass", "--out", out), "niah_haystack must be one of")
    refused(cli("study", "--train-opt", "niah_haystack=essay", "--out", tmp_path / "study"),
            "niah_haystack must be one of")
    assert not out.exists() and not (tmp_path / "study").exists()


def test_a_misspelt_model_option_is_refused_before_anything_is_written(tmp_path):
    refused(cli("train", "--model-opt", "rope_thet=10000", "--out", tmp_path / "train"),
            "unknown model option(s) rope_thet (did you mean: rope_thet -> rope_theta?)", "known: ")
    refused(cli("study", "--model-opt", "rope_thet=10000", "--out", tmp_path / "study"),
            "unknown model option(s) rope_thet (did you mean: rope_thet -> rope_theta?)")
    assert not (tmp_path / "train").exists() and not (tmp_path / "study").exists()


def test_study_with_a_too_small_tokenizer_writes_nothing(tmp_path):
    out = tmp_path / "study"
    refused(cli("study", "--tokenizer", "bpe:10", "--out", out), "needs at least 300 tokens")
    assert not out.exists()


def test_a_run_folder_written_before_kinds_were_recorded_still_resumes(tiny, tmp_path):
    run = tmp_path / "run"
    assert _eval(tiny, run).exit_code == 0
    doc = json.loads((run / "config.json").read_text())
    del doc["kind"]
    (run / "config.json").write_text(json.dumps(doc))
    results = (run / "results.jsonl").read_text()
    assert _eval(tiny, run).exit_code == 0
    assert (run / "results.jsonl").read_text() == results
    assert json.loads((run / "config.json").read_text())["kind"] == "eval"
    refused(cli("search", "--model", tiny, *SEARCH, "--generations", "1", "--out", run), "holds an eval run")


def test_a_rejected_train_run_leaves_the_folder_free(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The grass is green. The sky is blue. Here we go, there and back again. " * 200)
    out = tmp_path / "run"
    args = ["train", "--out", out, "--pe", "rope", "--steps", "1", "--context", "64", "--batch-size", "1",
            "--warmup", "0", "--corpus", corpus, "--tokenizer", "bpe:320", "--model-opt", "num_hidden_layers=1",
            "--model-opt", "hidden_size=32", "--model-opt", "intermediate_size=64", "--model-opt",
            "num_attention_heads=2"]
    # the tokenizer is trained into the folder, then the model's vocabulary is found too small
    refused(cli(*args, "--model-opt", "vocab_size=64"), "vocabulary is 64")
    res = cli(*args)  # the corrected command may use the folder
    assert res.exit_code == 0, res.output
    assert (out / "final").exists() and json.loads((out / "config.json").read_text())["kind"] == "train"
    refused(cli(*args[:-8], "--tokenizer", "bpe:400", *args[-8:]), "other settings",
            "tokenizer: 'bpe:320' -> 'bpe:400'")


def test_a_study_rejected_before_any_result_does_not_lock_its_folder(tmp_path):
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("one short document.\n")
    out = tmp_path / "study"
    res = cli("study", "--corpus", corpus, "--out", out)
    assert res.exit_code != 0 and "corpus too small" in res.output
    assert not (out / "models.json").exists()
    # the corrected command (a training context the corpus can fill) into the same --out is not refused
    res = cli("study", "--corpus", corpus, "--out", out, "--train-context", "4", "--train-steps", "1",
              "--schemes", "rope", "--multipliers", "1", "--n", "1", "--ppl-multipliers", "")
    assert "other settings" not in res.output
    assert json.loads((out / "config.json").read_text())["config"]["train_context"] == 4


def test_train_moice_refuses_a_foreign_folder_before_loading(tiny, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    res = cli("train-moice", "--model", tiny, "--steps", "1", "--out", foreign)
    refused(res, "not empty (notes.txt)")
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_passkey_in_heldout_text_without_heldout_text_is_refused(tmp_path):
    out = tmp_path / "study"
    refused(cli("study", "--passkey-heldout", "--ppl-multipliers", "", "--out", out), "passkey_heldout",
            "--heldout or keep --ppl-multipliers")
    assert not out.exists()


# -- issue 52: resumes that must be refused, files named ------------------------------------------

def test_a_relative_model_rerun_from_another_folder_is_refused(tiny, tmp_path, monkeypatch):
    """The resolved model path is part of a run's identity: ``--model m`` names another model in
    another working folder."""
    import shutil

    for where in ("a", "b"):
        shutil.copytree(tiny, tmp_path / where / "m")
    out = tmp_path / "run"
    monkeypatch.chdir(tmp_path / "a")
    assert _eval("m", out).exit_code == 0
    before = snapshot(out)
    monkeypatch.chdir(tmp_path / "b")
    refused(_eval("m", out), "other settings", "model_path")
    assert snapshot(out) == before


def test_a_duplicated_result_line_counts_once(tiny, tmp_path):
    out = tmp_path / "run"
    assert _eval(tiny, out).exit_code == 0
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("\n".join(lines + lines[:1]) + "\n")
    assert _eval(tiny, out).exit_code == 0
    assert json.loads((out / "summary.json").read_text())["n_instances"] == len(lines)


@pytest.mark.parametrize("line, message", [
    ("[1, 2]", ":2: expected a JSON object, got list"),
    ('{"depth": 0.5}', ":2: record without its 'id' field"),
    ("[" * 100_000 + "]" * 100_000, ":2: JSON nested too deeply"),
])
def test_a_damaged_results_line_is_named(tiny, tmp_path, line, message):
    out = tmp_path / "run"
    assert _eval(tiny, out).exit_code == 0
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("\n".join(lines[:1] + [line] + lines[1:]) + "\n")
    refused(_eval(tiny, out), str(out / "results.jsonl") + message)


def test_a_bad_byte_is_reported_on_its_line(tmp_path):
    from posbias.utils.io import iter_jsonl_gz, read_text

    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": 3}\n{"a": "\xff"}\n')
    with pytest.raises(ValueError, match="d.jsonl:4: not UTF-8"):
        list(iter_jsonl_gz(path))
    with pytest.raises(ValueError, match="d.jsonl:4: not UTF-8"):
        read_text(path)


def test_tilde_in_out_is_expanded_once_for_the_whole_run(tiny, tmp_path, monkeypatch):
    """``--out=~/runs/x`` (the shell leaves ``~`` after ``=``): the run and its summary in the home
    folder, no literal ``~`` folder."""
    from posbias.cli.common import expand_user_paths

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    res = cli("eval", "--model", tiny, *KV, "--out=~/runs/x")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "home" / "runs" / "x" / "summary.md").exists() and not (tmp_path / "~").exists()
    assert expand_user_paths({"corpus": ["~/a", "b"], "n": "~"}) == {"corpus": [str(tmp_path / "home" / "a"), "b"],
                                                                      "n": "~"}


def test_a_folder_of_dotfiles_is_not_empty_but_one_of_killed_temporaries_is(tiny, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("x")
    refused(_eval(tiny, home), "is not empty (.bashrc)")
    assert sorted(p.name for p in home.iterdir()) == [".bashrc"]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / ".config.json.k2j3.tmp").write_text("{")  # a run killed inside its first write
    assert _eval(tiny, fresh).exit_code == 0
    (fresh / ".results.jsonl.a1b2.tmp").write_text("[")
    assert _eval(tiny, fresh).exit_code == 0
    assert not list(fresh.rglob("*.tmp"))  # the next run removes what killed atomic writes left


def test_ctrl_c_says_how_to_resume(tiny, tmp_path, monkeypatch):
    import posbias.evaluation.session

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(posbias.evaluation.session, "load_model", interrupted)
    res = cli("eval", "--model", tiny, *KV, "--out", tmp_path / "run")
    assert res.exit_code == 130 and "interrupted: re-run the same command to resume" in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("value, shown", [(1e-300, "1e-300"), (5e-324, "5e-324"), (1e300, "1e+300"),
                                          (10 ** 400, "100000000000... (401 digits)"), (2000, "2000")],
                         ids=["1e-300", "5e-324", "1e300", "400-digits", "2000"])
def test_factors_out_of_range_or_too_large_for_a_float_are_refused(tiny, tmp_path, value, shown):
    """Factors are bounded to 1e-3 .. 1e3 (the help says so); 400 digits is one line, no OverflowError."""
    path = tmp_path / "f.json"
    path.write_text('{"format": "posbias-lpes-factors", "version": 1, "num_layers": 3, "factors": [1.0, %s, 1.0]}'
                    % (str(value) if isinstance(value, int) else repr(value)))
    refused(cli("eval", "--model", tiny, *KV, "--method", "lpes", "--factors", path, "--out", tmp_path / "run"),
            f"factor {shown} for layer 1 is invalid", "a number from 0.001 to 1000")
    assert not (tmp_path / "run").exists()
    assert "1e-3 to 1e3" in text(cli("eval", "--help"))


def test_an_oversized_or_deep_data_line_is_refused_before_tokenising(tmp_path, monkeypatch):
    from posbias.utils import io

    monkeypatch.setattr(io, "MAX_LINE_CHARS", 1000)
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"text": "short"}) + "\n" + json.dumps({"text": "x" * 2000}) + "\n")
    with pytest.raises(ValueError, match="corpus.jsonl:2: line of 2,01[0-9] characters, more than the 1,000"):
        list(io.iter_jsonl_gz(path))
    path.write_text('{"text": "a"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    monkeypatch.setattr(io, "MAX_LINE_CHARS", 16 * 2 ** 20)
    with pytest.raises(ValueError, match="corpus.jsonl:2: JSON nested too deeply"):
        list(io.iter_jsonl_gz(path))


@pytest.mark.parametrize("name", ["corpus.txt", "notes.md", "corpus.txt.gz"])
def test_an_oversized_text_document_is_refused_naming_its_file(tmp_path, monkeypatch, name):
    import gzip

    from posbias.utils import io
    from posbias.utils.corpus import load_texts

    monkeypatch.setattr(io, "MAX_LINE_CHARS", 1000)
    path = tmp_path / name
    write = (lambda t: path.write_bytes(gzip.compress(t.encode()))) if name.endswith(".gz") else path.write_text
    write("short\f" + "y" * 1000 + "\f" + "x" * 2000)
    with pytest.raises(ValueError, match=f"{name}: document 3 holds more than the 1,000 characters"):
        load_texts(path)
    write("short\f" + "y" * 1000 + "\f\f" + "z" * 10)  # at the limit: read as before
    assert load_texts(path) == ["short", "y" * 1000, "z" * 10]
    write("short\f" + "x" * 2000)
    res = cli("train", "--corpus", path, "--steps", "2", "--out", tmp_path / "train")
    refused(res, name, "document 2 holds more than the 1,000 characters")
    assert res.output.strip().count("\n") == 0 and not (tmp_path / "train").exists()


def _damaged_copy(tiny, where, damage):
    import shutil

    shutil.copytree(tiny, where)
    damage(where)
    return where


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _pickled_only(folder):
    import torch

    torch.save({}, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


@pytest.mark.parametrize("damage, message", [
    (lambda f: _truncate(f / "model.safetensors"), "model.safetensors truncated or damaged?"),
    (lambda f: (f / "tokenizer.json").write_text('{"model": '), "tokenizer.json: not valid JSON"),
    (lambda f: (f / "config.json").write_text("[" * 100_000), "config.json: JSON nested too deeply"),
    (_pickled_only, "only as pytorch_model.bin, a Python pickle that can run code when loaded"),
], ids=["truncated-safetensors", "tokenizer-json", "deep-config", "pickled-only"])
def test_a_damaged_model_folder_is_one_line_naming_the_file(tiny, tmp_path, damage, message):
    model = _damaged_copy(tiny, tmp_path / "m", damage)
    refused(_eval(model, tmp_path / "run"), message)
    assert not (tmp_path / "run").exists()


def test_a_damaged_models_json_of_a_study_is_named(tmp_path):
    from posbias.study.config import read_models_file

    (tmp_path / "models.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="models.json: expected an object mapping each scheme"):
        read_models_file(tmp_path)
    (tmp_path / "models.json").write_text("{")
    with pytest.raises(ValueError, match="models.json: not valid JSON"):
        read_models_file(tmp_path)


def test_a_tune_row_with_an_unknown_fitness_field_is_named(tmp_path):
    from posbias.search.fitness import FitnessResult

    with pytest.raises(ValueError, match="unknown field\\(s\\) 'bogus'"):
        FitnessResult.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="must be an object"):
        FitnessResult.from_dict([1, 2])


def test_a_damaged_search_checkpoint_names_its_file(tmp_path):
    from posbias.search.ga import GAConfig
    from posbias.search.loop import _start

    (tmp_path / "checkpoint.json").write_text(json.dumps({"memo": []}))
    with pytest.raises(ValueError, match="checkpoint.json: not a search checkpoint \\(no 'ga'\\)"):
        _start(GAConfig(), 0, tmp_path, True)


def test_a_curve_that_gives_no_factors_names_its_file(tmp_path):
    from posbias.patching.rope_scaling import load_factors_file

    path = tmp_path / "f.json"
    path.write_text(json.dumps({"factors": [1.0, 1.0], "curve": {"type": "linear", "control_points": [[0, 1], [1, 1]],
                                                                 "round_to_grid": ["x"]}}))
    with pytest.raises(ValueError, match="f.json: bad curve round_to_grid: could not convert"):
        load_factors_file(path, num_layers=3)
    path.write_text(json.dumps({"factors": [1.0, 1.0],
                                "curve": {"type": "step", "control_points": [[0, 1], [1, 2000]]}}))
    with pytest.raises(ValueError, match="f.json: its curve gives no factors for 3 layers .*from 0.001 to 1000"):
        load_factors_file(path, num_layers=3)


def test_include_path_help_says_it_runs_python_from_the_folder():
    assert "run Python from that folder" in text(cli("ability", "--help"))


def test_compare_skips_moice_without_routers_and_a_resume_says_so(tiny, factors, tmp_path):
    """The default method list holds moice: without trained routers it is skipped in one line saying how
    to train them (never scored with untrained ones); a re-run says how much it resumes."""
    out = tmp_path / "cmp"
    res = cli("compare", "--model", tiny, *KV, "--methods", "none,moice", "--out", out)
    assert res.exit_code == 0, res.output
    assert "moice skipped: MoICE needs routers trained for this model (posbias train-moice" in text(res)
    assert not (out / "moice").exists() and (out / "none" / "summary.json").exists()
    res = cli("compare", "--model", tiny, *KV, "--methods", "none", "--out", out)
    assert res.exit_code == 0 and "resuming 2 of 2 instances already in" in text(res)
