"""``posbias map`` from the command line: output, the heatmap path, and bad input as one line."""
import pytest
from conftest import save_tiny_folder
from typer.testing import CliRunner

from posbias.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_folder(tmp_path_factory.mktemp("tiny-map"), max_positions=1024)


def _map(folder, out, *extra):
    return runner.invoke(app, ["map", "--model", folder, "--out", str(out), "--lengths", "96,0.125w", "--depths",
                               "0,0.5,1", "--n", "2", "--bootstrap", "20", *extra])


def test_map_prints_the_summary_and_the_heatmap_path(tiny_folder, tmp_path):
    res = _map(tiny_folder, tmp_path / "m", "--methods", "none,pi@factor=0.9")
    assert res.exit_code == 0, res.output
    assert "| pi@factor=0.9 |" in res.output and "128 (0.125w)" in res.output
    last = res.output.strip().splitlines()[-2:]  # the heatmap, then where the outputs are
    assert last == [f"heatmap: {tmp_path / 'm' / 'heatmap_none.png'}", f"outputs: {(tmp_path / 'm').resolve()}"]
    assert (tmp_path / "m" / "heatmap_none.png").stat().st_size > 0


@pytest.mark.parametrize("extra, message", [
    (("--task", "summaries"), "the map runs kv, kv-uuid, mdqa, niah, passkey"),
    (("--task", "passkey", "--attention"), "is not made of records"),
    (("--lengths", "0.1x"), "--lengths: '0.1x'"),
    (("--lengths", "4096"), "longer than the model's window (1024)"),
    (("--methods", "pi@factr=2"), "has no option(s) factr"),
    (("--data", "missing.jsonl.gz", "--task", "kv"), "--data is the data file of task kv-uuid or mdqa"),
    (("--opt", "num_keys=5"), "give --lengths, not a length, num_keys or num_docs option"),
    (("--threshold", "1.5"), "--threshold must be between 0 and 1"),
])
def test_bad_input_is_one_line_and_writes_nothing(tiny_folder, tmp_path, extra, message):
    out = tmp_path / "bad"
    res = _map(tiny_folder, out, *extra)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert not out.exists()


def test_demo_is_a_small_map_ending_with_the_heatmap_path(tiny_folder, tmp_path):
    out = tmp_path / "demo"
    res = runner.invoke(app, ["demo", "--model", tiny_folder, "--out", str(out), "--n", "1"])
    assert res.exit_code == 0, res.output
    assert "| pi@factor=1.1 |" in res.output and "posbias demo --search" in res.output
    assert res.output.strip().splitlines()[-2:] == [f"heatmap: {out / 'heatmap_none.png'}", f"outputs: {out.resolve()}"]
    assert (out / "heatmap_none.png").exists() and (out / "diff_pi@factor=1.1.png").exists()


def test_data_maps_the_lost_in_the_middle_kv_file(tiny_folder, tmp_path):
    import gzip
    import json

    from posbias.utils.io import read_jsonl

    line = json.dumps({"ordered_kv_records": [[f"k{i}", f"v{i}"] for i in range(40)], "key": "k3", "value": "v3"})
    data = tmp_path / "kv-retrieval-40_keys.jsonl.gz"
    data.write_bytes(gzip.compress(("\n".join([line] * 8) + "\n").encode()))
    out = tmp_path / "m"
    res = _map(tiny_folder, out, "--data", str(data), "--lengths", "200")
    assert res.exit_code == 0, res.output
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["task"] == "kv-uuid" and cfg["task_options"] == {"path": str(data)}
    recs = read_jsonl(out / "results.jsonl")
    assert len(recs) == 2 * 3 and all(r["prompt_tokens"] <= 200 and 2 <= r["num_items"] <= 40 for r in recs)
    missing = _map(tiny_folder, tmp_path / "none", "--data", str(tmp_path / "missing.jsonl.gz"))
    assert missing.exit_code == 2 and "data file not found" in missing.output and not (tmp_path / "none").exists()


def test_mdqa_map_with_the_attention_diagnostic(tiny_folder, tmp_path, saved_figures):
    """A multi-document QA map: the number of documents is fitted to each length, and with --attention every
    question says where the last prompt position's attention went."""
    import gzip
    import json

    from posbias.utils.io import read_jsonl

    recs = [{"question": f"q{i}?", "answers": [f"Answer{i}"],
             "ctxs": [{"title": f"T{i}", "text": f"Passage {i} says Answer{i}.", "isgold": True}]} for i in range(40)]
    data = tmp_path / "nq-open-oracle.jsonl.gz"
    data.write_bytes(gzip.compress(("\n".join(json.dumps(r) for r in recs) + "\n").encode()))
    out = tmp_path / "mdqa"
    res = runner.invoke(app, ["map", "--model", tiny_folder, "--out", str(out), "--task", "mdqa", "--data", str(data),
                              "--lengths", "200,320", "--depths", "0,1", "--n", "2", "--bootstrap", "20",
                              "--attention"])
    assert res.exit_code == 0, res.output
    records = read_jsonl(out / "results.jsonl")
    assert len(records) == 8 and all("attn_gold_rank" in r for r in records)
    docs = {r["length"]: r["num_items"] for r in records}
    assert docs[200] < docs[320] and docs[200] >= 2
    assert all(r["prompt_tokens"] + r["n_tokens"] <= r["length"] for r in records)
    text = (out / "map.md").read_text()
    assert "## Where the last prompt position's attention went" in text
    assert "attention_none.png" in saved_figures
