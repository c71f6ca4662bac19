"""``posbias positional-dims`` on a tiny model folder: the JSON, the table, and bad input."""
import json

from conftest import save_tiny_folder
from typer.testing import CliRunner

from posbias.cli.main import app

runner = CliRunner()


def test_positional_dims_writes_json_usable_as_dims_file(tmp_path):
    folder = save_tiny_folder(tmp_path / "tiny", layers=6)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The grass is green. The sky is blue. The pass key is 12345. " * 200)
    out = tmp_path / "dims"
    res = runner.invoke(app, ["positional-dims", "--model", folder, "--corpus", str(corpus), "--samples", "3",
                              "--length", "40", "--top-k", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "positional_dims.json").read_text())
    assert doc["num_layers"] == 6 and doc["hidden_size"] == 32 and len(doc["dims"]) <= 4
    assert "smoothness" in res.output and json.loads((out / "config.json").read_text())["kind"] == "positional-dims"
    assert doc["samples"] == 3 and doc["length"] == 40 and doc["seconds"] >= 0
    # a random tiny model has no positional dimension; the statistic on one that has is tested in
    # tests/methods/test_positional_dims.py
    assert doc["dims"] == [] and "no dimension is monotone" in res.output


def test_too_small_corpus_is_one_line_and_writes_nothing(tmp_path):
    folder = save_tiny_folder(tmp_path / "tiny", layers=2)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("short text")
    out = tmp_path / "dims"
    res = runner.invoke(app, ["positional-dims", "--model", folder, "--corpus", str(corpus), "--samples", "2",
                              "--length", "40", "--out", str(out)])
    assert res.exit_code == 2 and "samples of 40 tokens" in res.output and "Traceback" not in res.output
    assert not out.exists()
