"""lm-evaluation-harness adapter on a tiny local multiple-choice task (skipped without lm_eval)."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("lm_eval")

from conftest import make_tiny_model  # noqa: E402

from posbias.evaluation.lm_eval_adapter import PosbiasLM  # noqa: E402


class _Req:
    def __init__(self, *args):
        self.args = args


def _direct_loglik(model, tok, ctx, cont):
    c = tok(ctx)["input_ids"]
    w = tok(ctx + cont)["input_ids"]
    ids = torch.tensor([w])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    return sum(float(lp[i - 1, w[i]]) for i in range(len(c), len(w)))


def test_loglikelihood_batched_matches_direct(tiny_tokenizer):
    model = make_tiny_model("llama")
    lm = PosbiasLM(model, tiny_tokenizer, batch_size=3)
    pairs = [("The sky is", " blue."), ("The pass key is 12345. Remember it. The pass key is", " 12345."),
             ("Question: who wrote the document? Answer:", " Document Title"), ("The grass", " is green.")]
    got = lm.loglikelihood([_Req(c, x) for c, x in pairs], disable_tqdm=True)
    for (c, x), (ll, greedy) in zip(pairs, got):
        assert ll == pytest.approx(_direct_loglik(model, tiny_tokenizer, c, x), abs=1e-4)
        assert isinstance(greedy, bool)
    # a no-op method gives the same scores; the adapter removes what it applied
    lm2 = PosbiasLM(model, tiny_tokenizer, method="ms-poe", method_options={"r_min": 1.0, "r_max": 1.0}, batch_size=2)
    got2 = lm2.loglikelihood([_Req(c, x) for c, x in pairs], disable_tqdm=True)
    lm2.close()
    assert [g[0] for g in got2] == pytest.approx([g[0] for g in got], abs=1e-4)
    assert "forward" not in model.model.layers[-1].self_attn.__dict__
    gens = lm.generate_until([_Req("The sky is", {"until": ["."], "max_gen_toks": 5}),
                              _Req("The grass is green. The sun", {"max_gen_toks": 3})])
    assert len(gens) == 2 and all(isinstance(g, str) and "." not in g for g in gens[:1])
    assert lm.loglikelihood_rolling([_Req("The sky is blue. The sun is yellow.")])[0] < 0


def test_simple_evaluate_on_local_multiple_choice_task(tmp_path, tiny_tokenizer, monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    data = tmp_path / "tiny_mc.jsonl"
    docs = [{"question": "The sky is", "choices": ["blue", "green", "yellow"], "label": 0},
            {"question": "The grass is", "choices": ["blue", "green", "yellow"], "label": 1},
            {"question": "The sun is", "choices": ["blue", "green", "yellow"], "label": 2}]
    data.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    (tmp_path / "tiny_mc.yaml").write_text(
        "task: posbias_tiny_mc\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        f"  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: \"{{question}}\"\n"
        "doc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: label\n"
        "metric_list:\n  - metric: acc\n"
    )
    model = make_tiny_model("qwen2")
    lm = PosbiasLM(model, tiny_tokenizer, method="attention-buckets", batch_size=4)
    try:
        res = lm_eval.simple_evaluate(model=lm, tasks=["posbias_tiny_mc"],
                                      task_manager=TaskManager(include_path=str(tmp_path)),
                                      bootstrap_iters=0, log_samples=False)
    finally:
        lm.close()
    acc = res["results"]["posbias_tiny_mc"]["acc,none"]
    assert 0.0 <= acc <= 1.0


@pytest.mark.parametrize("method", ["none", "attention-buckets"])
def test_choices_of_one_question_are_scored_from_one_prefill(tiny_tokenizer, method):
    """Requests sharing their context (multiple-choice) take the shared-prefill path; the scores
    equal scoring each (context + choice) row alone."""
    model = make_tiny_model("qwen2")
    ctx = "Question: what colour is the sky on a clear day?\nAnswer:"
    reqs = [(ctx, " blue"), (ctx, " green"), (ctx, " yellow and orange"), ("The grass", " is green.")]
    with_shared = PosbiasLM(model, tiny_tokenizer, method=method, batch_size=2)
    calls = []
    import posbias.evaluation.lm_eval_adapter as adapter

    real = adapter.score_shared_context
    try:
        adapter.score_shared_context = lambda *a, **k: calls.append(len(a[2])) or real(*a, **k)
        got = with_shared.loglikelihood([_Req(c, x) for c, x in reqs], disable_tqdm=True)
    finally:
        adapter.score_shared_context = real
        with_shared.close()
    assert calls == [3]  # the three choices, one prefill; the lone request row by row
    alone = PosbiasLM(model, tiny_tokenizer, method=method, batch_size=1)
    want = [alone._loglikelihood_tokens([(None, alone.tok_encode(c), alone.tok_encode(x))])[0]
            for c, x in [(ctx + "", x) for _c, x in reqs[:3]]]
    alone.close()
    for (ll, greedy), (ll2, greedy2) in zip(got[:3], want):
        assert ll == pytest.approx(ll2, abs=1e-4) and greedy == greedy2


def test_loglikelihood_shows_progress_over_every_request(tiny_tokenizer, monkeypatch):
    """Long ability runs show a progress bar: it counts shared-prefill and row-by-row requests alike."""
    import posbias.evaluation.lm_eval_adapter as adapter

    seen = []

    class Bar:
        def __init__(self, total=None, disable=False, **_kw):
            seen.append(("total", total, disable))

        def update(self, n):
            seen.append(n)

        def close(self):
            seen.append("closed")

    monkeypatch.setattr(adapter, "tqdm", Bar)
    lm = PosbiasLM(make_tiny_model("qwen2"), tiny_tokenizer, batch_size=2)
    ctx = "Question: what colour is the sky?\nAnswer:"
    lm.loglikelihood([_Req(ctx, " blue"), _Req(ctx, " green"), _Req("The grass", " is green."),
                      _Req("The sun", " is yellow.")])
    lm.close()
    assert seen[0] == ("total", 4, False) and seen[-1] == "closed"
    assert sum(u for u in seen if isinstance(u, int)) == 4 and 2 in seen  # the two choices in one step


def _tiny_task(folder, lead: str = ""):
    """A two-question multiple-choice lm-eval task over a local jsonl file, in ``folder``; ``lead`` goes before
    each question (a longer context, where RoPE scaling moves the scores more)."""
    docs = [{"question": lead + "The sky is", "choices": ["blue", "green"], "label": 0},
            {"question": lead + "The grass is", "choices": ["blue", "green"], "label": 1}]
    (folder / "tiny.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    (folder / "tiny.yaml").write_text(
        "task: posbias_cli_tiny\ndataset_path: json\ndataset_kwargs:\n"
        f"  data_files:\n    test: {folder / 'tiny.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{question}}\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: label\nmetric_list:\n  - metric: acc\n")


def _lm_eval(tmp_path, module: str, model_args: str, out: str) -> tuple[dict, list[list[float]]]:
    """Run lm-eval's command line (``python -m <module>``: ``lm_eval`` with its ``hf`` model, or
    ``posbias.evaluation.lm_eval_cli`` with ``posbias``) on the local task in ``tmp_path / "tasks"`` in a
    subprocess, offline; returns its results file and each question's choice log-likelihoods."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tasks = tmp_path / "tasks"
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf-cache"), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", module, "--model", "hf" if module == "lm_eval" else "posbias",
            "--model_args", model_args, "--tasks", "posbias_cli_tiny", "--include_path", str(tasks),
            "--batch_size", "2", "--log_samples", "--output_path", str(tmp_path / out)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = list((tmp_path / out).rglob("results*.json"))
    samples = list((tmp_path / out).rglob("samples_posbias_cli_tiny*.jsonl"))
    assert len(results) == 1 and len(samples) == 1
    rows = sorted((json.loads(line) for line in samples[0].read_text().splitlines()), key=lambda r: r["doc_id"])
    return json.loads(results[0].read_text()), [[float(r[0][0]) for r in row["resps"]] for row in rows]


def test_lm_eval_command_lines_score_lpes(tmp_path):
    """Through lm-eval's own command line, in subprocesses: ``posbias-lm-eval --model posbias --model_args
    pretrained=...,method=lpes,factors=...`` loads the model, applies the method and writes results; plain
    ``lm_eval --model hf --model_args pretrained=<apply --merge folder>,trust_remote_code=True`` loads the folder's
    modeling file and scores the same log-likelihoods; the model without the method scores others."""
    from conftest import save_tiny_folder
    from typer.testing import CliRunner

    from posbias.cli.main import app
    from posbias.patching.rope_scaling import save_factors_file

    model = save_tiny_folder(tmp_path / "model")
    factors = tmp_path / "factors.json"
    save_factors_file(factors, factors=[1.0, 2.0, 4.0])
    (tmp_path / "tasks").mkdir()
    _tiny_task(tmp_path / "tasks", lead="A long road of stones and rivers and hills and trees. " * 12)
    res, ours = _lm_eval(tmp_path, "posbias.evaluation.lm_eval_cli",
                         f"pretrained={model},method=lpes,factors={factors},device=cpu,dtype=float32", "posbias")
    assert res["results"]["posbias_cli_tiny"]["acc,none"] in (0.0, 0.5, 1.0)
    assert res["config"]["model_args"]["method"] == "lpes"
    assert len(ours) == 2 and all(len(choices) == 2 for choices in ours)

    merged = tmp_path / "merged"
    applied = CliRunner().invoke(app, ["apply", "--model", model, "--factors", str(factors), "--out", str(merged),
                                       "--merge"])
    assert applied.exit_code == 0, applied.output
    _, plain = _lm_eval(tmp_path, "lm_eval", f"pretrained={merged},trust_remote_code=True,dtype=float32", "hf")
    _, unscaled = _lm_eval(tmp_path, "lm_eval", f"pretrained={model},dtype=float32", "none")
    plain, ours, unscaled = map(torch.tensor, (plain, ours, unscaled))
    assert (plain - ours).abs().max() <= 1e-6  # equal on CPU fp32; the scaling moves them 3e-4 on this model
    assert (plain - unscaled).abs().max() > 1e-4


def test_model_args_build_the_method(tmp_path):
    from conftest import save_tiny_folder

    from posbias.evaluation.lm_eval_adapter import PosbiasLM

    model = save_tiny_folder(tmp_path / "model")
    lm = PosbiasLM.create_from_arg_string(f"pretrained={model},method=pi,factor=2,dtype=float32",
                                          {"batch_size": "4", "device": None, "max_batch_size": None})
    assert lm.handle.name == "pi" and lm.handle.options == {"factor": 2.0} and lm.batch_size == 4
    lm.close()
    with pytest.raises(ValueError, match="is not a dtype"):
        PosbiasLM.create_from_arg_string(f"pretrained={model},dtype=int8")


def test_harness_default_device_means_auto(tmp_path):
    """lm-eval passes ``device=cuda:0`` when its ``--device`` is not given: that loads where ``auto`` would (the
    CPU here); ``device=cuda:0`` written in ``--model_args`` stays strict."""
    from conftest import save_tiny_folder

    model = save_tiny_folder(tmp_path / "model")
    lm = PosbiasLM.create_from_arg_string(f"pretrained={model}", {"device": "cuda:0", "batch_size": None})
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert lm.device.type == expected
    lm.close()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda:0"):
            PosbiasLM.create_from_arg_string(f"pretrained={model},device=cuda:0")


def test_posbias_lm_eval_script_is_declared():
    import tomllib
    from pathlib import Path

    from lm_eval.api.registry import get_model

    from posbias.evaluation import lm_eval_cli
    from posbias.evaluation.lm_eval_adapter import PosbiasLM

    doc = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert doc["project"]["scripts"]["posbias-lm-eval"] == "posbias.evaluation.lm_eval_cli:main"
    assert callable(lm_eval_cli.main) and get_model("posbias") is PosbiasLM
