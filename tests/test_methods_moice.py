"""MoICE: expert bases, routing, router training / saving / loading, and the train-moice CLI."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import make_tiny_model, make_tiny_tokenizer
from posbias.methods import apply_method
from posbias.methods._attention import base_inv_freq
from posbias.methods.moice import load_routers, save_routers, train_routers


def _inputs(seed=0, t=20):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (2, t), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return dict(input_ids=ids, attention_mask=mask, position_ids=pos), mask.bool()


def test_single_expert_with_other_base_equals_model_with_that_base():
    model = make_tiny_model("qwen3", seed=1)
    inputs, valid = _inputs()
    rot = model.model.rotary_emb
    saved = rot.inv_freq.clone()
    rot.inv_freq.copy_(base_inv_freq(saved, 10000.0, 25000.0))
    ref = model(**inputs).logits
    rot.inv_freq.copy_(saved)
    with apply_method(model, "moice", multipliers=[2.5], top_k=1) as h:
        out = h.model(**inputs).logits
    torch.testing.assert_close(out[valid], ref[valid], atol=1e-5, rtol=1e-5)


def test_identical_experts_mix_to_the_unpatched_model():
    model = make_tiny_model("llama", seed=1)
    inputs, valid = _inputs()
    ref = model(**inputs).logits
    with apply_method(model, "moice", multipliers=[1.0, 1.0, 1.0], top_k=2) as h:
        out = h.model(**inputs).logits
    torch.testing.assert_close(out[valid], ref[valid], atol=1e-5, rtol=1e-5)


def test_routing_weights_are_top_k_renormalised():
    model = make_tiny_model("llama")
    inputs, _ = _inputs()
    with apply_method(model, "moice", top_k=3) as h:
        h.model(**inputs)
        w = h.state["moice"].last_weights[0]
    assert w.shape[-1] == 7
    assert torch.all((w > 0).sum(-1) == 3)
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))


def test_train_save_load_roundtrip(tmp_path):
    model = make_tiny_model("llama", layers=2)
    tok = make_tiny_tokenizer()
    params_before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [p.requires_grad for p in model.parameters()]
    texts = ["The pass key is 12345. Remember it. The grass is green. What is the pass key? The pass key is 12345."]
    h = apply_method(model, "moice", top_k=2, multipliers=[1.0, 1.5, 2.0])
    r0 = {k: v.clone() for k, v in h.state["routers"].state_dict().items()}
    hist = train_routers(h, tok, texts, steps=3, lr=1e-2)
    assert len(hist) == 3 and all(torch.isfinite(torch.tensor(r["loss"])) for r in hist)
    assert hist[0]["aux"] > 0
    r1 = h.state["routers"].state_dict()
    assert any(not torch.equal(r0[k], r1[k]) for k in r0)  # routers trained
    assert all(torch.equal(params_before[k], v) for k, v in model.state_dict().items())  # model frozen
    assert [p.requires_grad for p in model.parameters()] == flags
    inputs, valid = _inputs()
    out = h.model(**inputs).logits
    folder = save_routers(h.state["routers"], tmp_path / "routers")
    h.remove()
    cfg = json.loads((folder / "moice_config.json").read_text())
    assert cfg["top_k"] == 2 and cfg["multipliers"] == [1.0, 1.5, 2.0]
    assert load_routers(folder / "routers.safetensors").top_k == 2
    with apply_method(model, "moice", routers=str(folder)) as h2:
        torch.testing.assert_close(h2.model(**inputs).logits, out, atol=1e-6, rtol=1e-6)
    with apply_method(model, "moice", routers=str(folder), top_k=1) as h3:  # explicit top_k overrides the file
        assert h3.options["top_k"] == 1


def test_missing_or_mismatched_router_files(tmp_path):
    model = make_tiny_model("llama")
    with pytest.raises(ValueError, match="router files not found"):
        apply_method(model, "moice", routers=str(tmp_path / "nothing"))
    other = make_tiny_model("llama", hidden=64)  # head_dim 16
    h = apply_method(other, "moice")
    save_routers(h.state["routers"], tmp_path / "r")
    h.remove()
    with pytest.raises(ValueError, match="head_dim"):
        apply_method(model, "moice", routers=str(tmp_path / "r"))


def test_train_moice_cli(tmp_path):
    from typer.testing import CliRunner

    from posbias.cli.main import app

    model = make_tiny_model("llama", layers=2)
    tok = make_tiny_tokenizer()
    mdir = tmp_path / "m"
    model.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": "The pass key is 12345. The sky is blue. " * 3})
                              for _ in range(2)))
    out = tmp_path / "routers"
    res = CliRunner().invoke(app, ["train-moice", "--model", str(mdir), "--out", str(out), "--steps", "2",
                                   "--data", str(data), "--top-k", "2"])
    assert res.exit_code == 0, res.output
    assert (out / "routers.safetensors").exists() and (out / "moice_config.json").exists()
    with apply_method(model, "moice", routers=str(out)) as h:
        assert h.options["top_k"] == 2
    bad = CliRunner().invoke(app, ["train-moice", "--model", str(mdir), "--out", str(out), "--data",
                                   str(tmp_path / "missing.jsonl")])
    assert bad.exit_code == 2
