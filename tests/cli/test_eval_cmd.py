"""``posbias eval`` end to end on a tiny model folder: outputs, resume, and clear errors."""
import json

import pytest
from conftest import save_tiny_folder
from typer.testing import CliRunner

from posbias.cli.main import app
from posbias.utils.io import read_jsonl

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_folder(tmp_path_factory.mktemp("tiny-llama"), max_positions=4096)


def _eval(folder, out, *extra):
    return runner.invoke(app, ["eval", "--model", folder, "--task", "kv", "--num-keys", "6", "--n", "2",
                               "--depths", "0,0.5,1", "--out", str(out), *extra])


def test_eval_writes_outputs_and_resumes(tiny_folder, tmp_path, saved_figures):
    res = _eval(tiny_folder, tmp_path / "run", "--mode", "both", "--max-new-tokens", "4")
    assert res.exit_code == 0, res.output
    files = {p.name for p in (tmp_path / "run").iterdir()}
    assert {"config.json", "results.jsonl", "summary.json", "summary.md", "accuracy_by_depth.png"} <= files
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert "torch" in cfg["versions"] and cfg["config"]["task"] == "kv"
    recs = read_jsonl(tmp_path / "run" / "results.jsonl")
    assert len(recs) == 6 and all("tf_em" in r and "prediction" in r for r in recs)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [r["depth"] for r in summary["by_depth"]] == [0.0, 0.5, 1.0]
    assert all(r["ci_low"] <= r["accuracy"] <= r["ci_high"] for r in summary["by_depth"])
    line = saved_figures["accuracy_by_depth.png"].axes[0].lines[0]  # the plotted series is the summary's
    assert list(line.get_xdata()) == [0.0, 0.5, 1.0]
    assert list(line.get_ydata()) == pytest.approx([100 * r["accuracy"] for r in summary["by_depth"]])
    # resume: nothing is scored twice, the results file is unchanged
    before = (tmp_path / "run" / "results.jsonl").read_text()
    assert _eval(tiny_folder, tmp_path / "run", "--mode", "both", "--max-new-tokens", "4").exit_code == 0
    assert (tmp_path / "run" / "results.jsonl").read_text() == before


def test_resume_after_kill_skips_finished_instances(tiny_folder, tmp_path):
    out = tmp_path / "run"
    assert _eval(tiny_folder, out).exit_code == 0
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])  # killed mid-write
    assert _eval(tiny_folder, out).exit_code == 0
    recs = read_jsonl(out / "results.jsonl")
    assert sorted(r["id"] for r in recs) == sorted(json.loads(line)["id"] for line in lines)


def test_resume_with_other_settings_is_refused(tiny_folder, tmp_path):
    assert _eval(tiny_folder, tmp_path / "run").exit_code == 0
    res = _eval(tiny_folder, tmp_path / "run", "--seed", "7")
    assert res.exit_code == 2 and "other settings" in res.output


def test_a_teacher_forced_folder_of_an_older_posbias_resumes(tiny_folder, tmp_path):
    """Older versions recorded generation's limit (16) for teacher-forced runs too; such a folder
    resumes, and a generating run keeps its recorded limit as a resume setting."""
    out = tmp_path / "run"
    assert _eval(tiny_folder, out).exit_code == 0
    record = json.loads((out / "config.json").read_text())
    assert record["config"]["max_new_tokens"] is None
    record["config"]["max_new_tokens"] = 16
    (out / "config.json").write_text(json.dumps(record))
    res = _eval(tiny_folder, out)
    assert res.exit_code == 0 and "resum" in res.output.lower(), res.output
    gen = tmp_path / "gen"
    assert _eval(tiny_folder, gen, "--mode", "generate", "--max-new-tokens", "3").exit_code == 0
    res = _eval(tiny_folder, gen, "--mode", "generate")
    assert res.exit_code == 2 and "max_new_tokens" in res.output


@pytest.mark.parametrize("args, message", [
    (["--task", "bogus"], "unknown task"),
    (["--depths", "0,1.5"], "outside [0, 1]"),
    (["--depths", "0,x"], "comma-separated numbers"),
    (["--num-keys", "100000"], "num_keys"),
])
def test_bad_input_is_one_clear_line(tiny_folder, tmp_path, args, message):
    base = ["eval", "--model", tiny_folder, "--n", "1", "--out", str(tmp_path / "bad")]
    res = runner.invoke(app, base + args)
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output


def test_malformed_data_file_names_file_and_line(tiny_folder, tmp_path):
    bad = tmp_path / "kv.jsonl"
    bad.write_text('{"ordered_kv_records": [["a", "b"]], "key": "a", "value": "b"}\n{not json\n')
    res = runner.invoke(app, ["eval", "--model", tiny_folder, "--task", "kv-uuid", "--path", str(bad), "--n", "1",
                              "--out", str(tmp_path / "bad")])
    assert res.exit_code == 2 and f"{bad}:2" in res.output


def test_prompt_longer_than_model_is_refused_before_writing_results(tmp_path):
    folder = save_tiny_folder(tmp_path / "short", max_positions=64)
    res = _eval(folder, tmp_path / "run")
    assert res.exit_code == 2 and "maximum of 64 positions" in res.output
    assert not (tmp_path / "run" / "results.jsonl").exists()


def test_passkey_in_the_bam_protocol_with_the_first_digit_given(tiny_folder, tmp_path):
    """``--opt protocol=bam --opt given_digits=1``: the BAM reference's long-range passkey from the command line."""
    out = tmp_path / "bam"
    res = runner.invoke(app, ["eval", "--model", tiny_folder, "--task", "passkey", "--length", "200", "--n", "2",
                              "--depths", "0", "--mode", "both", "--max-new-tokens", "4", "--out", str(out),
                              "--opt", "protocol=bam", "--opt", "given_digits=1"])
    assert res.exit_code == 0, res.output
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["task_options"]["protocol"] == "bam" and cfg["task_options"]["given_digits"] == 1
    recs = read_jsonl(out / "results.jsonl")
    assert len(recs) == 2 and all("tf_em" in r and "prediction" in r for r in recs)
    res = runner.invoke(app, ["eval", "--model", tiny_folder, "--task", "passkey", "--length", "200", "--n", "1",
                              "--out", str(tmp_path / "bad"), "--opt", "protocol=landmark"])
    assert res.exit_code == 2 and "unknown passkey protocol" in res.output


def test_attention_diagnostic_end_to_end(tiny_folder, tmp_path, saved_figures):
    out = tmp_path / "att"
    res = _eval(tiny_folder, out, "--attention", "--mode", "both", "--max-new-tokens", "4")
    assert res.exit_code == 0, res.output
    recs = read_jsonl(out / "results.jsonl")
    assert all(1 <= r["attn_gold_rank"] <= 6 and len(r["attn_layers"]["hit"]) == 3 for r in recs)
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["attention_by_depth"]
    assert [r["depth"] for r in rows] == [0.0, 0.5, 1.0] and all(r["n"] == 2 for r in rows)
    for row in rows:
        ranks = [r["attn_gold_rank"] for r in recs if r["depth"] == row["depth"]]
        assert row["top1"] == sum(k == 1 for k in ranks) / 2
    assert len(summary["attention_top1_by_layer"]["top1"]) == 3
    assert "where the last prompt position's attention went" in (out / "summary.md").read_text()
    heat = saved_figures["attention.png"].axes[2].images[0].get_array()
    assert heat.shape == (3, 3)
    # the folder resumes with the same setting and refuses another
    assert _eval(tiny_folder, out, "--attention", "--mode", "both", "--max-new-tokens", "4").exit_code == 0
    other = _eval(tiny_folder, out, "--mode", "both", "--max-new-tokens", "4")
    assert other.exit_code == 2 and "attention" in other.output
    bad = _eval(tiny_folder, tmp_path / "gen", "--attention", "--mode", "generate")
    assert bad.exit_code == 2 and "teacher-forced" in bad.output and not (tmp_path / "gen").exists()
    passkey = runner.invoke(app, ["eval", "--model", tiny_folder, "--task", "passkey", "--length", "64", "--n", "1",
                                  "--depths", "0", "--attention", "--out", str(tmp_path / "pk")])
    assert passkey.exit_code == 2 and "not made of records" in passkey.output and not (tmp_path / "pk").exists()


def test_no_console_noise_from_transformers(tiny_folder, tmp_path):
    """posbias's own progress only: no "Loading weights" bar per command, no deprecation line from reading a
    model output's cache under its old name (Attention Buckets' parallel passes did)."""
    res = runner.invoke(app, ["compare", "--model", tiny_folder, "--task", "kv", "--num-keys", "4", "--n", "1",
                              "--depths", "0,1", "--methods", "none,attention-buckets", "--mode", "both",
                              "--out", str(tmp_path / "cmp")])
    assert res.exit_code == 0, res.output
    assert "Loading weights" not in res.output and "deprecated" not in res.output
    assert "attention-buckets / kv: 100%" in res.output


def test_reading_a_cache_never_touches_the_deprecated_name():
    """transformers prints a deprecation line when ``past_key_values`` is read where ``cache`` exists."""
    from posbias.architecture.layers import cache_of

    class Output:
        cache = None

        @property
        def past_key_values(self):
            raise AssertionError("read the deprecated name")

    class Old:  # an output class of an older transformers: only past_key_values
        past_key_values = "old cache"

    assert cache_of(Output()) is None and cache_of(Old()) == "old cache"


def test_factors_messages_say_what_to_do(tiny_folder, tmp_path, factors):
    res = _eval(tiny_folder, tmp_path / "a", "--factors", factors)
    assert res.exit_code == 2 and "add --method lpes" in res.output
    folder = tmp_path / "search"
    folder.mkdir()
    (folder / "best_factors.json").write_text(open(factors).read())
    res = _eval(tiny_folder, tmp_path / "b", "--method", "lpes", "--factors", str(folder))
    assert res.exit_code == 2 and f"give {folder / 'best_factors.json'}" in res.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
