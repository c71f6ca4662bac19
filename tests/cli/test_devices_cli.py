"""--device / --dtype on every command that loads a model: an unusable device or dtype is one line,
exit code 2 and nothing written; the run folder records the request and what it resolved to; the
resolved dtype is part of a run's resume identity."""
import json
import re

import pytest
import torch
from typer.testing import CliRunner

from posbias.cli.main import app

runner = CliRunner()
KV = ["--task", "kv", "--num-keys", "4", "--n", "1", "--depths", "0,1"]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


def commands(tiny, factors):
    """Every command that loads a model, with the arguments it needs besides --out / --device / --dtype."""
    return {
        "eval": ["--model", tiny, *KV],
        "compare": ["--model", tiny, *KV, "--methods", "none,pi"],
        "search": ["--model", tiny, "--task", "kv", "--num-keys", "4", "--population", "3", "--n-per-depth", "1"],
        "tune": ["--model", tiny, "--task", "kv", "--num-keys", "4", "--methods", "pi"],
        "ability": ["--model", tiny, "--methods", "none", "--tasks", "arc_easy"],
        "apply": ["--model", tiny, "--factors", factors],
        "analyze": ["--model", tiny, "--factors", factors, "--num-keys", "4"],
        "demo": ["--model", tiny],
        "train-moice": ["--model", tiny, "--steps", "1"],
    }


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_refusal(res, needle):
    out = " ".join(re.sub(r"[│╭╮╰╯─]", " ", res.output).split())
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and needle in out, res.output


@NO_CUDA
@pytest.mark.parametrize("device", ["cuda", "shard"])
@pytest.mark.parametrize("command", ["eval", "compare", "search", "tune", "ability", "apply", "analyze", "demo",
                                     "train-moice"])
def test_a_gpu_device_on_a_machine_without_one_is_refused_before_any_folder(command, device, tiny, factors,
                                                                            tmp_path):
    out = tmp_path / "out"
    res = invoke(command, *commands(tiny, factors)[command], "--out", out, "--device", device)
    one_line_refusal(res, f"--device {device}: ")
    assert not out.exists()


@pytest.mark.parametrize("command", ["eval", "search", "apply", "train-moice"])
def test_an_unknown_dtype_is_refused_before_any_folder(command, tiny, factors, tmp_path):
    out = tmp_path / "out"
    res = invoke(command, *commands(tiny, factors)[command], "--out", out, "--dtype", "int4")
    one_line_refusal(res, "--dtype 'int4' is not a dtype")
    assert not out.exists()


@pytest.mark.parametrize("device, needle", [pytest.param("cuda", "--device cuda: ", marks=NO_CUDA),
                                            ("shard", "training and this use run on one device")])
@pytest.mark.parametrize("command", ["train", "study"])
def test_training_on_a_device_it_cannot_use_leaves_nothing(command, device, needle, tmp_path):
    """CUDA on a machine without it, or ``shard`` (loading only) anywhere: one line, no folder."""
    out = tmp_path / "out"
    extra = ["--steps", "1"] if command == "train" else ["--schemes", "rope"]
    res = invoke(command, "--out", out, "--device", device, *extra)
    one_line_refusal(res, needle)
    assert not out.exists()


def test_eval_in_bf16_records_the_placement_and_refuses_to_resume_in_fp32(tiny, tmp_path):
    out = tmp_path / "run"
    res = invoke("eval", "--model", tiny, *KV, "--out", out, "--device", "cpu", "--dtype", "bfloat16")
    assert res.exit_code == 0, res.output
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["dtype"] == "bfloat16"
    assert config["load"] == {"device": "cpu", "dtype": "bfloat16", "resolved_device": "cpu",
                              "resolved_dtype": "bfloat16"}
    res = invoke("eval", "--model", tiny, *KV, "--out", out, "--device", "cpu", "--dtype", "float32")
    one_line_refusal(res, "dtype: 'bfloat16' -> 'float32'")
    again = invoke("eval", "--model", tiny, *KV, "--n", "2", "--out", out, "--dtype", "bf16")  # same dtype resumes
    assert again.exit_code == 0, again.output


def test_auto_resolves_on_this_machine(tiny, tmp_path):
    out = tmp_path / "run"
    assert invoke("eval", "--model", tiny, *KV, "--out", out).exit_code == 0
    load = json.loads((out / "config.json").read_text())["config"]["load"]
    want = ("cuda:0", "bfloat16") if torch.cuda.is_available() else ("cpu", "float32")
    assert (load["device"], load["dtype"]) == ("auto", "auto")
    assert (load["resolved_device"], load["resolved_dtype"]) == want


def test_a_run_given_a_loaded_model_records_where_that_model_is(tiny, tmp_path):
    from posbias.evaluation.session import EvalConfig, run_eval
    from posbias.models import LoadOptions, load_model

    loaded = load_model(tiny, LoadOptions("cpu", "bfloat16"))
    run_eval(EvalConfig(model=tiny, task="kv", depths=[0.0], n=1, out=tmp_path / "run", task_options={"num_keys": 4}),
             loaded=loaded)
    load = json.loads((tmp_path / "run" / "config.json").read_text())["config"]["load"]
    assert (load["resolved_device"], load["resolved_dtype"]) == ("cpu", "bfloat16")
