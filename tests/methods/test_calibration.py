"""Found-in-the-middle attention calibration: the re-weighting, the identity settings, the scorers' rows."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import make_tiny_tokenizer, make_variant_model

from posbias.evaluation.teacher_forced import score_instances
from posbias.methods import apply_method
from posbias.methods.calibration import BIAS_FORMAT, per_token_means, record_mass, reweight
from posbias.tasks import make_instances

ARCHS = ["llama", "qwen2-gqa7", "gemma3"]


def kv(shared: bool, num_keys: int = 6, n: int = 2):
    return make_instances("kv", n=n, depths=[0.0, 0.5, 1.0], num_keys=num_keys, shared_context=shared)


def bias_file(tmp_path, slots: int = 6, value: float = 0.01) -> str:
    path = tmp_path / "attention_bias.json"
    path.write_text(json.dumps({"format": BIAS_FORMAT, "version": 1, "bias": [value] * slots}))
    return str(path)


def weights_and_owner(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.softmax(torch.randn(2, 3, 2, 12, generator=g), -1)  # (B, H, R, kv)
    owner = torch.tensor([[-1, 0, 0, 0, 1, 1, -1, 2, 2, 2, 2, -1]] * 2)  # records of 3, 2 and 4 tokens
    counts = torch.tensor([[3.0, 2.0, 4.0]] * 2)
    return w, owner, counts


def test_alpha_proportional_to_the_per_token_means_changes_nothing():
    w, owner, counts = weights_and_owner()
    means = per_token_means(w, owner, counts)  # (B, H, R, K)
    for h in range(w.shape[1]):  # per head: alpha of that head's own means is its identity
        alpha = means[:, h] / means[:, h].sum(-1, keepdim=True)
        torch.testing.assert_close(reweight(w[:, h:h + 1], owner, counts, alpha), w[:, h:h + 1])


def test_the_records_keep_their_mass_and_follow_alpha():
    w, owner, counts = weights_and_owner(1)
    alpha = torch.tensor([0.7, 0.2, 0.1]).expand(2, 2, 3)
    new = reweight(w, owner, counts, alpha)
    before, after = record_mass(w, owner, 3), record_mass(new, owner, 3)
    torch.testing.assert_close(after.sum(-1), before.sum(-1))  # the records' mass is kept (C)
    torch.testing.assert_close(new[..., owner[0] < 0], w[..., owner[0] < 0])  # other keys untouched
    share = alpha[:, None] * counts[:, None, None, :]
    torch.testing.assert_close(after, before.sum(-1, keepdim=True) * share / share.sum(-1, keepdim=True))
    torch.testing.assert_close(new.sum(-1), w.sum(-1))  # rows still sum to one


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("shared", [False, True])
def test_mode_original_is_the_model_bit_for_bit(arch, shared, tmp_path):
    model, tok = make_variant_model(arch), make_tiny_tokenizer()
    insts = kv(shared)
    plain = score_instances(model, tok, insts, batch_size=4)
    with apply_method(model, "calibration", bias=bias_file(tmp_path), mode="original") as handle:
        same = score_instances(handle.model, tok, insts, batch_size=4)
    assert [(r["em"], r["logprob"]) for r in same] == [(r["em"], r["logprob"]) for r in plain]


@pytest.mark.parametrize("arch", ARCHS)
def test_recomposed_answer_rows_equal_the_model_without_a_change(arch, tmp_path, monkeypatch):
    """The intervention's own path (two passes, eager weights of the answer rows times the values, GQA, rows
    put back) with the re-weighting made a no-op reproduces the model."""
    from posbias.methods import calibration

    model, tok = make_variant_model(arch), make_tiny_tokenizer()
    insts = kv(False) + kv(True)
    plain = score_instances(model, tok, insts, batch_size=4)
    monkeypatch.setattr(calibration, "reweight", lambda weights, *a: weights)
    with apply_method(model, "calibration", bias=bias_file(tmp_path)) as handle:
        same = score_instances(handle.model, tok, insts, batch_size=4)
        assert handle.state["layers"] == list(range((len(model.model.layers) + 1) // 2, len(model.model.layers)))
    for a, b in zip(plain, same):
        assert a["em"] == b["em"] and a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_calibration_changes_the_answer_rows_alike_on_every_scorer(arch, tmp_path):
    """The same questions scored one prompt each, from a shared context's prefill, and through the cache give
    the same calibrated log-probs: every scorer describes its rows alike."""
    from posbias.evaluation import scoring

    model, tok = make_variant_model(arch), make_tiny_tokenizer()
    shared = kv(True)
    plain = score_instances(model, tok, shared, batch_size=4)
    with apply_method(model, "calibration", bias=bias_file(tmp_path), t=1e-3) as handle:
        one = score_instances(handle.model, tok, shared, batch_size=4, shared=False)
        ctx = score_instances(handle.model, tok, shared, batch_size=4)
        real = scoring.prompt_dependent
        scoring.prompt_dependent = lambda m: True
        try:
            cache = score_instances(handle.model, tok, shared, batch_size=4, shared=False)
        finally:
            scoring.prompt_dependent = real
    assert any(abs(a["logprob"] - b["logprob"]) > 1e-4 for a, b in zip(plain, one))  # it does something
    for a, b, c in zip(one, ctx, cache):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-4) == pytest.approx(c["logprob"], abs=1e-4)
    assert model.model.layers[0].self_attn.config._attn_implementation == "eager"  # removed


def test_bad_options_are_one_line(tmp_path):
    model = make_variant_model("llama")
    with pytest.raises(ValueError, match="needs the positional bias"):
        apply_method(model, "calibration")
    with pytest.raises(ValueError, match="t must be a finite number > 0"):
        apply_method(model, "calibration", bias=bias_file(tmp_path), t=-1)
    (tmp_path / "x.json").write_text('{"bias": [1]}')
    with pytest.raises(ValueError, match="not an attention-bias file"):
        apply_method(model, "calibration", bias=str(tmp_path / "x.json"))
    with apply_method(model, "ms-poe", r_min=1.2, r_max=1.8, skip_layers=0):
        with pytest.raises(ValueError, match="computes attention itself"):
            apply_method(model, "calibration", bias=bias_file(tmp_path))


def test_attention_bias_command_then_calibrated_eval(tmp_path):
    from conftest import save_tiny_folder
    from typer.testing import CliRunner

    from posbias.cli.main import app

    folder = save_tiny_folder(tmp_path / "tiny", max_positions=4096)
    runner = CliRunner()
    res = runner.invoke(app, ["attention-bias", "--model", folder, "--task", "kv", "--num-keys", "6", "--opt",
                              "shared_context=true", "--n", "2", "--out", str(tmp_path / "bias")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "bias" / "attention_bias.json").read_text())
    assert doc["format"] == BIAS_FORMAT and doc["num_items"] == 6 and doc["split"] == "search"
    assert sum(doc["n"]) == 2 * 5 * 5  # 2 contexts x 5 depths, 5 non-gold records each
    assert (tmp_path / "bias" / "attention_bias.png").exists()
    bias = str(tmp_path / "bias" / "attention_bias.json")
    res = runner.invoke(app, ["eval", "--model", folder, "--task", "kv", "--num-keys", "6", "--n", "2", "--depths",
                              "0,1", "--method", "calibration", "--method-opt", f"bias={bias}", "--out",
                              str(tmp_path / "ev")])
    assert res.exit_code == 0, res.output


def test_greedy_decoding_is_calibrated_at_every_step(tmp_path):
    """Every decoded token is an answer row: the calibrated greedy tokens of a prompt are what teacher forcing
    of those tokens under calibration predicts, token by token (the same rows, the same re-weighting), and
    their probabilities are not the model's own."""
    from posbias.evaluation.batching import encode
    from posbias.evaluation.generation import greedy_batch
    from posbias.evaluation.scoring import score_token_rows

    model, tok = make_variant_model("llama"), make_tiny_tokenizer()
    changed = 0
    for inst in kv(False):
        e = encode(tok, inst, False)
        with apply_method(model, "calibration", bias=bias_file(tmp_path), t=1e-4) as handle:
            ids = greedy_batch(handle.model, [e.prompt_ids], 0, set(), 5, ids=[inst.id], spans=[e.item_spans])[0]
            rec = score_token_rows(handle.model, [e.prompt_ids], [ids], 0, ids=[inst.id], spans=[e.item_spans])[0]
        assert rec["em"]  # teacher forcing reproduces the calibrated generation token by token
        plain = score_token_rows(model, [e.prompt_ids], [ids], 0, ids=[inst.id])[0]
        changed += abs(plain["logprob"] - rec["logprob"]) > 1e-4
    assert changed  # and the calibration changed those tokens' probabilities
