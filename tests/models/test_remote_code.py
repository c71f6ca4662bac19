"""posbias never runs code from a model or tokenizer folder, whatever stdin answers to transformers' question
"Do you wish to run the custom code?" (it passes ``trust_remote_code=False`` wherever it loads)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_tiny_tokenizer, save_tiny_folder

PLANT = 'import pathlib, os; pathlib.Path(os.environ["POSBIAS_TEST_MARKER"]).write_text("ran")\n'


def posbias(args, marker: Path, tmp_path) -> subprocess.CompletedProcess:
    """``posbias ARGS`` in a fresh process with "y" on stdin; the planted code would write ``marker``."""
    env = {**os.environ, "POSBIAS_TEST_MARKER": str(marker), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-c", "from posbias.cli.main import app; app()", *map(str, args)]
    return subprocess.run(cmd, input="y\ny\n", capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def plant(path: Path) -> None:
    """Insert :data:`PLANT` after the file's ``from __future__`` line (or at its top)."""
    lines = path.read_text().splitlines(keepends=True)
    at = next((i + 1 for i, line in enumerate(lines) if line.startswith("from __future__")), 0)
    path.write_text("".join(lines[:at] + [PLANT] + lines[at:]))


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    """An ``apply --merge`` folder (its config.json has ``auto_map``) whose modeling file is planted."""
    from posbias.patching.rope_scaling import save_factors_file

    root = tmp_path_factory.mktemp("remote")
    tiny = save_tiny_folder(root / "tiny", max_positions=4096)
    save_factors_file(root / "f.json", factors=[1.0, 1.7, 3.0], model="tiny", task="kv")
    from typer.testing import CliRunner

    from posbias.cli.main import app

    res = CliRunner().invoke(app, ["apply", "--model", tiny, "--factors", str(root / "f.json"), "--out",
                                   str(root / "merged"), "--merge"])
    assert res.exit_code == 0, res.output
    assert "auto_map" in json.loads((root / "merged" / "config.json").read_text())
    plant(root / "merged" / "modeling_posbias.py")
    return root / "merged"


def test_eval_of_a_merged_folder_never_runs_its_modeling_file(merged, tmp_path):
    marker = tmp_path / "RAN"
    res = posbias(["eval", "--model", merged, "--task", "kv", "--num-keys", "4", "--n", "1", "--depths", "0",
                   "--out", tmp_path / "ev"], marker, tmp_path)
    assert res.returncode == 0, res.stderr
    assert not marker.exists()
    config = json.loads((tmp_path / "ev" / "config.json").read_text())["config"]
    assert config["adapter"]["method"] == "lpes"  # loaded through posbias's own code, the scaling active


def test_train_with_a_merged_folder_as_tokenizer_never_runs_its_modeling_file(merged, tmp_path):
    """``posbias train --tokenizer FOLDER`` where the folder's config.json has ``auto_map``."""
    marker = tmp_path / "RAN"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The grass is green. The sky is blue. " * 200)
    res = posbias(["train", "--tokenizer", merged, "--corpus", corpus, "--out", tmp_path / "run", "--steps", "1",
                   "--context", "32", "--batch-size", "2", "--preset", "tiny"], marker, tmp_path)
    assert res.returncode == 0, res.stderr
    assert not marker.exists()


def test_a_tokenizer_folder_with_its_own_class_is_loaded_without_its_code(tmp_path):
    """The folder's tokenizer config names its own class: posbias loads the tokenizer files without it."""
    folder = tmp_path / "tok"
    make_tiny_tokenizer().save_pretrained(folder)
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", "tokenization_evil.EvilTokenizer"]}
    cfg_path.write_text(json.dumps(cfg))
    (folder / "tokenization_evil.py").write_text(PLANT + "from transformers import PreTrainedTokenizerFast\n"
                                                 "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    marker = tmp_path / "RAN"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The grass is green. The sky is blue. " * 200)
    res = posbias(["train", "--tokenizer", folder, "--corpus", corpus, "--out", tmp_path / "run", "--steps", "1",
                   "--context", "32", "--batch-size", "2", "--preset", "tiny"], marker, tmp_path)
    assert not marker.exists()
    assert "Traceback" not in res.stderr


def test_a_model_that_needs_its_own_code_is_one_line_naming_why(tmp_path):
    folder = Path(save_tiny_folder(tmp_path / "custom"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type="evilmodel", architectures=["EvilModel"],
               auto_map={"AutoConfig": "modeling_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel"})
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "modeling_evil.py").write_text(PLANT)
    marker = tmp_path / "RAN"
    res = posbias(["eval", "--model", folder, "--task", "kv", "--num-keys", "4", "--n", "1", "--depths", "0",
                   "--out", tmp_path / "ev"], marker, tmp_path)
    assert res.returncode == 2 and not marker.exists() and not (tmp_path / "ev").exists()
    assert "needs its own code" in res.stderr and "truncated" not in res.stderr
