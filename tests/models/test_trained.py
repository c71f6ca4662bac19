"""A model written by ``posbias train`` is evaluated from the command line like any other model."""
import json

import pytest
from conftest import make_tiny_tokenizer
from typer.testing import CliRunner

from posbias.cli.main import app

runner = CliRunner()
SENTENCES = "The grass is green. The sky is blue. The pass key is 12345. Remember it. Here we go. "


@pytest.fixture(scope="module")
def trained_folder(tmp_path_factory):
    """``<out>/final`` of a two-step ``posbias train`` run of a one-layer GGD + SSMax BAM model."""
    root = tmp_path_factory.mktemp("bam")
    (root / "corpus").mkdir()
    for d in range(4):
        (root / "corpus" / f"doc{d}.txt").write_text(SENTENCES * 12)
    make_tiny_tokenizer().save_pretrained(root / "tok")
    res = runner.invoke(app, ["train", "--out", str(root / "run"), "--pe", "ggd", "--ssmax", "--steps", "2",
                              "--context", "64", "--batch-size", "2", "--tokenizer", str(root / "tok"),
                              "--corpus", str(root / "corpus"), "--warmup", "1", "--model-opt",
                              "num_hidden_layers=1", "--model-opt", "hidden_size=32", "--model-opt",
                              "intermediate_size=64", "--model-opt", "num_attention_heads=4"])
    assert res.exit_code == 0, res.output
    return root / "run" / "final"


def test_eval_of_a_trained_model_through_the_cli(trained_folder, tmp_path):
    out = tmp_path / "eval"
    res = runner.invoke(app, ["eval", "--model", str(trained_folder), "--task", "passkey", "--length", "256",
                              "--n", "1", "--depths", "0,1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert [r["depth"] for r in summary["by_depth"]] == [0.0, 1.0] and summary["n_instances"] == 2


def test_a_rope_method_on_a_trained_model_is_one_line(trained_folder, tmp_path):
    res = runner.invoke(app, ["eval", "--model", str(trained_folder), "--task", "passkey", "--length", "256",
                              "--n", "1", "--depths", "0", "--method", "pi", "--method-opt", "factor=2",
                              "--out", str(tmp_path / "pi")])
    assert res.exit_code == 2
    lines = [x for x in res.output.splitlines() if x.startswith("error:")]  # beside transformers' progress bar
    assert "Traceback" not in res.output and len(lines) == 1
    assert "method 'pi' rescales" in lines[0] and "method none" in lines[0]
    assert not (tmp_path / "pi" / "results.jsonl").exists()


def test_load_model_and_the_study_loader_agree(trained_folder):
    import torch

    from posbias.models import load_model
    from posbias.study.training import load_trained

    a, tok = load_model(str(trained_folder))
    b, _ = load_trained(trained_folder, device="cpu")
    ids = torch.tensor([tok("The pass key is 12345.")["input_ids"]])
    assert a.config.model_type == "posbias-bam"
    assert torch.equal(a(input_ids=ids).logits, b(input_ids=ids).logits)


def test_compare_and_ability_of_a_trained_model(trained_folder, tmp_path, monkeypatch):
    res = runner.invoke(app, ["compare", "--model", str(trained_folder), "--methods", "none", "--task", "passkey",
                              "--length", "256", "--n", "1", "--depths", "0,1", "--out", str(tmp_path / "cmp")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "cmp" / "none" / "summary.json").exists()
    pytest.importorskip("lm_eval")
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(key, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    docs = [{"q": "The sky is", "c": ["blue", "green"], "a": 0}, {"q": "The grass is", "c": ["blue", "green"], "a": 1}]
    (tasks / "t.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    (tasks / "t.yaml").write_text(
        f"task: posbias_bam_tiny\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tasks / 't.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{q}}\"\ndoc_to_choice: \"{{c}}\"\n"
        "doc_to_target: a\nmetric_list:\n  - metric: acc\n")
    res = runner.invoke(app, ["ability", "--model", str(trained_folder), "--methods", "none", "--tasks",
                              "posbias_bam_tiny", "--include-path", str(tasks), "--out", str(tmp_path / "ab")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "ab" / "ability.md").exists()


def test_a_train_or_study_run_folder_stands_for_its_model(trained_folder, tmp_path):
    import shutil

    import torch

    from posbias.models import load_model

    ids = torch.tensor([[5, 6, 7, 8]])
    want = load_model(str(trained_folder))[0](input_ids=ids).logits
    study = tmp_path / "study"
    (study / "models" / "ggd").mkdir(parents=True)
    (study / "config.json").write_text(json.dumps({"kind": "study", "config": {}}))
    shutil.copytree(trained_folder, study / "models" / "ggd" / "final")
    shutil.copy(trained_folder.parent / "config.json", study / "models" / "ggd")  # a study's models are train runs
    for folder in (trained_folder.parent, study, study / "models" / "ggd"):
        model, _ = load_model(str(folder))
        assert torch.equal(model(input_ids=ids).logits, want), folder

    shutil.copytree(trained_folder, study / "models" / "alibi" / "final")
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copy(trained_folder.parent / "config.json", unfinished / "config.json")
    for folder, message in ((study, "study of 2 trained models; give one of them"),
                            (unfinished, "train run without a final model yet")):
        res = runner.invoke(app, ["eval", "--model", str(folder), "--task", "passkey", "--length", "256", "--n", "1",
                                  "--depths", "0", "--out", str(tmp_path / "never")])
        lines = [x for x in res.output.splitlines() if x.startswith("error:")]
        assert res.exit_code == 2 and len(lines) == 1 and message in lines[0], res.output
        assert not (tmp_path / "never").exists()
