"""MoICE: expert bases, routing, router training / saving / loading, and the train-moice CLI."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import make_tiny_model, make_tiny_tokenizer

from posbias.methods import apply_method
from posbias.methods.moice import load_routers, save_routers
from posbias.methods.rope_attention import base_inv_freq
from posbias.training.moice import RouterBudget, train_routers, training_windows
from posbias.utils.io import read_jsonl


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
    texts = ["The grass is green. The sky is blue. Here we go, there and back again."] * 4
    windows = training_windows(tok, texts, seq_len=24, count=3, seed=0)
    h = apply_method(model, "moice", top_k=2, multipliers=[1.0, 1.5, 2.0])
    r0 = {k: v.clone() for k, v in h.state["routers"].state_dict().items()}
    hist = []
    spent = train_routers(h, windows, RouterBudget(steps=3, seq_len=24, lr=1e-2), progress=False, log=hist.append)
    assert spent["steps_done"] == 3 and spent["tokens"] == 72 and spent["stopped_by"] == "steps"
    assert len(hist) == 3 and all(torch.isfinite(torch.tensor(r["loss"])) for r in hist)
    assert hist[0]["aux"] > 0
    r1 = h.state["routers"].state_dict()
    assert any(not torch.equal(r0[k], r1[k]) for k in r0)  # routers trained
    assert all(torch.equal(params_before[k], v) for k, v in model.state_dict().items())  # model frozen
    assert [p.requires_grad for p in model.parameters()] == flags
    inputs, valid = _inputs()
    out = h.model(**inputs).logits
    folder = save_routers(h.state["routers"], tmp_path / "routers", extra={"budget": spent})
    h.remove()
    cfg = json.loads((folder / "moice_config.json").read_text())
    assert cfg["top_k"] == 2 and cfg["multipliers"] == [1.0, 1.5, 2.0]
    assert cfg["training"]["budget"]["steps_done"] == 3
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
    data.write_text("\n".join(json.dumps({"text": f"Essay {i}. The sky is blue and the grass is green. " * 3})
                              for i in range(4)))
    out = tmp_path / "routers"
    args = ["train-moice", "--model", str(mdir), "--out", str(out), "--corpus", str(data), "--top-k", "2",
            "--seq-len", "16"]
    res = CliRunner().invoke(app, args + ["--steps", "2"])
    assert res.exit_code == 0, res.output
    assert (out / "routers.safetensors").exists() and (out / "checkpoint.pt").exists()
    budget = json.loads((out / "moice_config.json").read_text())["training"]["budget"]
    assert budget["steps_done"] == 2 and budget["seq_len"] == 16 and budget["tokens"] == 32
    with apply_method(model, "moice", routers=str(out)) as h:
        assert h.options["top_k"] == 2
    more = CliRunner().invoke(app, args + ["--steps", "3"])  # a larger budget resumes from step 2
    assert more.exit_code == 0, more.output
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
    bad = CliRunner().invoke(app, ["train-moice", "--model", str(mdir), "--out", str(tmp_path / "other"),
                                   "--corpus", str(tmp_path / "missing.jsonl")])
    assert bad.exit_code == 2 and "missing.jsonl" in bad.output


def test_defaults_are_the_reference_runs():
    """7 experts at the reference bases / 10000, dense routing, hidden = experts, normal(0, 0.02)."""
    import warnings

    from posbias.methods.moice import DEFAULT_MULTIPLIERS

    model = make_tiny_model("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h = apply_method(model, "moice", seed=3)
    r = h.state["routers"]
    assert r.multipliers == list(DEFAULT_MULTIPLIERS) == [1.0, 1.75, 1.8, 1.9, 2.0, 2.25, 2.5]
    assert r.top_k == 7 and r.hidden == 7
    w = torch.cat([p.flatten() for p in r.parameters()])
    assert abs(float(w.std()) - 0.02) < 0.004 and abs(float(w.mean())) < 0.004
    h.remove()


def test_options_that_define_routers_are_refused_with_a_routers_file(tmp_path):
    import warnings

    from posbias.methods.moice import save_routers

    model = make_tiny_model("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h = apply_method(model, "moice")
    save_routers(h.state["routers"], tmp_path / "r")
    h.remove()
    for opt in ({"multipliers": [1.0, 2.0]}, {"bases": [10000.0]}, {"hidden": 4}, {"layers": [0]}):
        with pytest.raises(ValueError, match="cannot be combined with routers="):
            apply_method(model, "moice", routers=str(tmp_path / "r"), **opt)
    with apply_method(model, "moice", routers=str(tmp_path / "r"), top_k=2) as h2:  # top_k may be overridden
        assert h2.state["routers"].top_k == 2


def test_router_sees_the_query_rotated_with_the_layers_own_base():
    import warnings

    import posbias.methods.moice as M

    model = make_tiny_model("llama")
    ids = torch.randint(3, 500, (1, 12), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h = apply_method(model, "moice")
    seen = []
    router = h.state["routers"].routers["0"]
    hook = router.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    captured = {}
    attn = model.model.layers[0].self_attn
    q_hook = attn.q_proj.register_forward_hook(lambda m, a, o: captured.__setitem__("q", o.detach().clone()))
    with torch.no_grad():
        h.model(input_ids=ids)
    hook.remove(), q_hook.remove(), h.remove()
    b, t = ids.shape
    q = captured["q"].view(b, t, -1, 8).transpose(1, 2)  # (B, H, T, d), no q-norm in llama
    cos, sin = model.model.rotary_emb(q, torch.arange(t)[None])
    from posbias.methods.rope_attention import rotate

    torch.testing.assert_close(seen[0], rotate(q, cos[:, None], sin[:, None]), atol=1e-6, rtol=1e-5)
    assert M.DEFAULT_TOP_K == 7


def test_router_training_resumes_exactly(tmp_path):
    """Killed after 4 of 6 steps (checkpoint every 2) and rerun = one uninterrupted run of 6 steps."""
    tok = make_tiny_tokenizer()
    windows = training_windows(tok, [f"Document {i}: the grass is green, the sky is blue." for i in range(5)],
                               seq_len=12, count=6, seed=1)
    budget = RouterBudget(steps=6, seq_len=12, lr=1e-2, checkpoint_every=2)

    def run(out, steps=None, fail_at=None):
        model = make_tiny_model("llama", layers=2, seed=3)
        h = apply_method(model, "moice", top_k=2, multipliers=[1.0, 2.0], seed=0)
        if fail_at is not None:
            def log(rec):
                if rec["step"] == fail_at:
                    raise KeyboardInterrupt
            with pytest.raises(KeyboardInterrupt):
                train_routers(h, windows, budget, out=out, progress=False, log=log)
        else:
            train_routers(h, windows, budget, out=out, progress=False)
        return {k: v.clone() for k, v in h.state["routers"].state_dict().items()}

    whole = run(tmp_path / "a")
    run(tmp_path / "b", fail_at=5)  # step 5 logged, last checkpoint at step 4
    resumed = run(tmp_path / "b")
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    steps = [r["step"] for r in read_jsonl(tmp_path / "b" / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4, 5, 6]
    losses = lambda p: [r["loss"] for r in read_jsonl(p / "metrics.jsonl")]  # noqa: E731
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_training_windows_are_seeded_general_text_windows():
    tok = make_tiny_tokenizer()
    texts = [f"Document number {i} says something." for i in range(7)]
    a = training_windows(tok, texts, seq_len=10, count=8, seed=0)
    assert len(a) == 8 and all(w.shape == (10,) for w in a)
    assert all(torch.equal(x, y) for x, y in zip(a, training_windows(tok, texts, 10, 8, seed=0)))
    assert not all(torch.equal(x, y) for x, y in zip(a, training_windows(tok, texts, 10, 8, seed=1)))
    with pytest.raises(ValueError, match="no documents"):
        training_windows(tok, [], 10, 1)
    with pytest.raises(ValueError, match="steps >= 1"):
        RouterBudget(steps=0)


def test_router_training_stops_at_the_time_budget_and_says_so(tmp_path):
    tok = make_tiny_tokenizer()
    windows = training_windows(tok, ["The grass is green. The sky is blue."] * 3, seq_len=8, count=2)
    h = apply_method(make_tiny_model("llama", layers=2), "moice", top_k=2, multipliers=[1.0, 2.0])
    spent = train_routers(h, windows, RouterBudget(steps=2, seq_len=8, max_minutes=1e-9), out=tmp_path,
                          progress=False)
    assert spent["stopped_by"] == "time" and spent["steps_done"] == 0
    assert (tmp_path / "checkpoint.pt").exists()


def test_load_balancing_loss_is_the_references_mixtral_form():
    """E * sum_e(fraction of (token, head) units routed to e) * mean router prob of e; dense top-7
    routing makes it the constant 7, as in the reference run (no gradient)."""
    model = make_tiny_model("llama", layers=2)
    ids = torch.randint(3, 500, (1, 12), generator=torch.Generator().manual_seed(0))
    for top_k in (7, 1):
        with apply_method(model, "moice", top_k=top_k, seed=1) as h:
            state = h.state["moice"]
            state.collect_aux = True
            model(input_ids=ids)
            aux = float(state.aux_loss())
            state.collect_aux = False
        if top_k == 7:
            assert aux == pytest.approx(7.0, abs=1e-5)
        else:
            assert 1.0 - 1e-5 <= aux < 7.0  # top-1: >= 1 (perfect balance), below the dense constant
