"""Per-layer RoPE scaling (LPES patch) on tiny models of each supported architecture."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import ARCHS, make_tiny_model

from posbias.patching.rope_scaling import (
    FactorsFileError,
    active_scaling,
    apply_factors_file,
    apply_layer_scaling,
    load_factors_file,
    save_factors_file,
)

IDS = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 8, 64, 11, 300, 21]])


def logits(model, ids=IDS, **kw):
    with torch.no_grad():
        return model(input_ids=ids, **kw).logits


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("s", [0.7, 2.0])
def test_uniform_factor_equals_hf_linear_rope(arch, s):
    model = make_tiny_model(arch)
    hf = make_tiny_model(arch, rope_parameters={"rope_type": "linear", "factor": s})
    hf.load_state_dict(model.state_dict())
    ids = torch.randint(3, 500, (2, 40), generator=torch.Generator().manual_seed(1))
    ref = logits(hf, ids)
    assert not torch.allclose(logits(model, ids), ref, atol=1e-5)
    with apply_layer_scaling(model, [s] * 3):
        torch.testing.assert_close(logits(model, ids), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_composes_with_existing_rope_type(arch):
    """On a model already using linear scaling f, factor s gives linear scaling f * s."""
    base = make_tiny_model(arch, rope_parameters={"rope_type": "linear", "factor": 2.0})
    target = make_tiny_model(arch, rope_parameters={"rope_type": "linear", "factor": 3.0})
    target.load_state_dict(base.state_dict())
    with apply_layer_scaling(base, [1.5] * 3):
        torch.testing.assert_close(logits(base), logits(target), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_per_layer_factor_only_changes_that_layer(arch):
    model = make_tiny_model(arch)
    with torch.no_grad():
        ref = model(input_ids=IDS, output_hidden_states=True).hidden_states
    with apply_layer_scaling(model, [1.0, 1.0, 1.7]):
        with torch.no_grad():
            hs = model(input_ids=IDS, output_hidden_states=True).hidden_states
    # hidden_states[i] is the input of layer i: layers 0 and 1 untouched
    for i in range(3):
        assert torch.equal(hs[i], ref[i])
    assert not torch.allclose(hs[3], ref[3])


@pytest.mark.parametrize("arch", ARCHS)
def test_remove_restores_identical_logits(arch):
    model = make_tiny_model(arch)
    ref = logits(model)
    h = apply_layer_scaling(model, [0.8, 1.3, 2.0])
    assert not torch.allclose(logits(model), ref)
    h.remove()
    h.remove()  # idempotent
    assert torch.equal(logits(model), ref)
    assert active_scaling(model) is None


def test_reapply_replaces_previous_scaling():
    model = make_tiny_model("llama")
    apply_layer_scaling(model, [2.0, 2.0, 2.0])
    with apply_layer_scaling(model, [0.8, 1.0, 1.2]):
        a = logits(model)
    with apply_layer_scaling(model, [0.8, 1.0, 1.2]):
        assert torch.equal(logits(model), a)
    assert torch.equal(logits(model), logits(make_tiny_model("llama")))


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_with_cache_matches_no_cache_argmax(arch):
    model = make_tiny_model(arch)
    with apply_layer_scaling(model, [0.7, 1.0, 1.6]):
        out = model.generate(IDS, max_new_tokens=8, do_sample=False, use_cache=True, pad_token_id=0)
        seq = IDS
        for _ in range(8):
            nxt = logits(model, seq)[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(out, seq)


@pytest.mark.parametrize("arch", ARCHS)
def test_left_padded_batch_matches_single(arch):
    model = make_tiny_model(arch)
    a = torch.tensor([5, 17, 42, 99, 3, 250, 7, 8])
    b = torch.tensor([64, 11, 300, 21, 9])
    pad = 3
    ids = torch.stack([a, torch.cat([torch.zeros(pad, dtype=torch.long), b])])
    mask = torch.stack([torch.ones(8, dtype=torch.long), torch.cat([torch.zeros(pad), torch.ones(5)]).long()])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with apply_layer_scaling(model, [1.4, 0.6, 2.5]):
        batch = logits(model, ids, attention_mask=mask, position_ids=pos)
        la = logits(model, a[None])
        lb = logits(model, b[None])
        torch.testing.assert_close(batch[0], la[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(batch[1, pad:], lb[0], atol=1e-5, rtol=1e-5)
        # batched generation with left padding: cached decoding keeps the per-row positions
        gen = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
        gb = model.generate(b[None], max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(gen[1, pad:], gb[0])


def test_shared_factor_computed_once_and_tables_reused():
    model = make_tiny_model("llama", layers=4)
    h = apply_layer_scaling(model, [1.5, 1.5, 2.0, 1.5])
    calls = []
    orig = torch.Tensor.cos

    def counting(self):
        calls.append(1)
        return orig(self)

    torch.Tensor.cos = counting
    try:
        logits(model)
        first = len(calls)
        logits(model)
        second = len(calls) - first
    finally:
        torch.Tensor.cos = orig
    h.remove()
    assert first == 1 + 2  # the model's own rotary + one table per distinct factor
    assert second == 1  # later forwards gather rows from the cached tables


def test_table_rows_equal_direct_computation_and_grow():
    model = make_tiny_model("qwen2")
    h = apply_layer_scaling(model, [1.3, 0.7, 1.0])
    like = torch.empty(0)
    for pos in (torch.arange(10)[None], torch.tensor([[0, 0, 3, 4, 700]]), torch.arange(5000)[None]):
        for f in (1.3, 0.7):
            got = h.cos_sin(f, pos, like)
            want = h._direct(f, pos, like)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert h._tables[(1.3, None)][1].shape[0] == 8192  # grown by doubling
    neg = torch.tensor([[-1, 0, 1]])  # never gathered from a table (would wrap around)
    torch.testing.assert_close(h.cos_sin(1.3, neg, like)[0], h._direct(1.3, neg, like)[0])
    h.max_table_bytes = 0  # over budget: direct computation
    h._tables.clear()
    pos = torch.arange(20)[None]
    assert torch.equal(h.cos_sin(0.7, pos, like)[0], h._direct(0.7, pos, like)[0])
    assert not h._tables
    h.remove()


def test_validation_errors():
    model = make_tiny_model("llama")
    with pytest.raises(ValueError, match="2 factors .* 3 decoder layers"):
        apply_layer_scaling(model, [1.0, 1.0])
    with pytest.raises(ValueError, match="a number from 0.001 to 1000"):
        apply_layer_scaling(model, [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="a number from 0.001 to 1000"):
        apply_layer_scaling(model, [1.0, -2.0, 1.0])
    with pytest.raises(ValueError, match="a number from 0.001 to 1000"):
        apply_layer_scaling(model, [1.0, float("nan"), 1.0])
    assert active_scaling(model) is None


def test_model_without_rope_is_rejected():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=32))
    with pytest.raises(ValueError, match="no rotary position embeddings"):
        apply_layer_scaling(gpt2, [1.0, 1.0])


# -- factors files ----------------------------------------------------------------------------

CURVE = {"type": "linear", "control_points": [[0.0, 1.0], [0.5, 1.2], [1.0, 0.8]]}


def test_factors_file_roundtrip_and_apply(tmp_path):
    path = tmp_path / "f.json"
    save_factors_file(path, factors=[1.0, 1.2, 0.8], curve=CURVE, model="tiny", task="kv", score=0.5)
    doc = load_factors_file(path)
    assert doc["factors"] == [1.0, 1.2, 0.8] and doc["task"] == "kv" and doc["num_layers"] == 3
    model = make_tiny_model("qwen2")
    ref = make_tiny_model("qwen2")
    with apply_layer_scaling(ref, [1.0, 1.2, 0.8]):
        want = logits(ref)
    h = apply_factors_file(model, path)
    assert torch.equal(logits(model), want)
    h.remove()


def test_factors_file_reevaluates_curve_for_other_depth(tmp_path):
    path = tmp_path / "f.json"
    save_factors_file(path, factors=[1.0, 1.2, 0.8], curve=CURVE)
    doc = load_factors_file(path, num_layers=5)
    assert doc["factors"] == pytest.approx([1.0, 1.1, 1.2, 1.0, 0.8])
    model = make_tiny_model("llama", layers=5)
    h = apply_factors_file(model, path)
    assert h.factors == pytest.approx((1.0, 1.1, 1.2, 1.0, 0.8))


def test_factors_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(FactorsFileError, match="not valid JSON"):
        load_factors_file(bad)
    bad.write_text(json.dumps({"model": "x"}))
    with pytest.raises(FactorsFileError, match="missing the list 'factors'"):
        load_factors_file(bad)
    bad.write_text(json.dumps({"factors": [1.0, -1.0]}))
    with pytest.raises(FactorsFileError, match="a number from 0.001 to 1000"):
        load_factors_file(bad)
    bad.write_text(json.dumps({"factors": [1.0, 1.0], "num_layers": 3}))
    with pytest.raises(FactorsFileError, match="num_layers is 3 but the file lists 2"):
        load_factors_file(bad)
    bad.write_text(json.dumps({"factors": [1.0, 1.0], "curve": {"type": "spline", "control_points": [[0, 1], [1, 1]]}}))
    with pytest.raises(FactorsFileError, match="unknown curve type"):
        load_factors_file(bad)
    bad.write_text(json.dumps({"factors": [1.0, 1.0]}))
    with pytest.raises(FactorsFileError, match="2 factors but the model has 3 .* no 'curve'"):
        apply_factors_file(make_tiny_model("llama"), bad)
    with pytest.raises(FactorsFileError, match="not found"):
        load_factors_file(tmp_path / "missing.json")


def test_saved_patched_model_reloads_with_scaling(tmp_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    from posbias.models import load_model
    from posbias.patching.rope_scaling import save_patched_model

    src = tmp_path / "src"
    base = make_tiny_model("llama")
    base.save_pretrained(src)
    tiny_tokenizer.save_pretrained(src)
    fpath = tmp_path / "f.json"
    save_factors_file(fpath, factors=[0.8, 1.0, 1.5], curve=None, model=str(src))
    model, tok = load_model(str(src))
    out = save_patched_model(model, tok, fpath, tmp_path / "patched")
    assert (out / "posbias_factors.json").exists()
    with apply_layer_scaling(base, [0.8, 1.0, 1.5]):
        want = logits(base)
    reloaded, _ = load_model(str(out))
    assert active_scaling(reloaded).factors == (0.8, 1.0, 1.5)
    torch.testing.assert_close(logits(reloaded), want, atol=1e-6, rtol=1e-6)
    plain = AutoModelForCausalLM.from_pretrained(out).eval()  # weights still load, unpatched
    torch.testing.assert_close(logits(plain), logits(base), atol=1e-5, rtol=1e-5)  # sdpa vs eager


@pytest.mark.smollm2
def test_smollm2_uniform_factor_equals_hf_linear(smollm2):
    """On the real SmolLM2-135M: factor s on every layer == HF linear rope scaling s; ones == identity."""
    from transformers import AutoModelForCausalLM

    model, tok = smollm2
    ids = tok("The grass is green. The sky is blue. " * 8, return_tensors="pt")["input_ids"]
    ref = logits(model, ids)
    n = model.config.num_hidden_layers
    with apply_layer_scaling(model, [1.0] * n):
        assert torch.equal(logits(model, ids), ref)
    cfg = model.config.__class__.from_dict(model.config.to_dict())
    cfg.rope_parameters = {**cfg.rope_parameters, "rope_type": "linear", "factor": 1.5}
    hf = AutoModelForCausalLM.from_config(cfg).eval()
    hf.load_state_dict(model.state_dict())
    want = logits(hf, ids)
    with apply_layer_scaling(model, [1.5] * n):
        torch.testing.assert_close(logits(model, ids), want, atol=1e-4, rtol=1e-4)


def test_a_short_table_is_extended_by_its_missing_rows_only():
    """Decoding past the prompt's power of two must not recompute the whole table (a one-time cost
    per factor that showed in LPES's per-token decode time at 4K tokens)."""
    model = make_tiny_model("llama", layers=3)
    h = apply_layer_scaling(model, [1.3, 1.0, 1.0])
    like, direct, rows = torch.empty(0), h._direct, []

    def recording(factor, positions, *args):
        rows.append((int(positions.min()), int(positions.max())))
        return direct(factor, positions, *args)

    h._direct = recording
    h.cos_sin(1.3, torch.arange(1024)[None], like)
    got = h.cos_sin(1.3, torch.tensor([[1024]]), like)
    assert rows == [(0, 1023), (1024, 2047)]
    want = direct(1.3, torch.arange(2048)[None], like)
    table = h._tables[(1.3, None)]
    assert torch.equal(table[1], want[0][0]) and torch.equal(table[2], want[1][0])
    assert torch.equal(got[0], want[0][:, 1024:1025])
    h.remove()


def test_consecutive_positions_use_a_view_of_the_table():
    model = make_tiny_model("llama")
    h = apply_layer_scaling(model, [1.3, 1.3, 1.3])
    like = torch.empty(0)
    pos = torch.arange(3, 40)[None]
    cos, sin = h.cos_sin(1.3, pos, like)
    table = h._tables[(1.3, None)][1]
    assert h._span == (3, 40) and cos.untyped_storage().data_ptr() == table.untyped_storage().data_ptr()
    want = h._direct(1.3, pos, like)
    assert torch.equal(cos, want[0]) and torch.equal(sin, want[1]) and cos.shape == (1, 37, 8)
    gap = torch.tensor([[0, 1, 2, 9]])
    h.cos_sin(1.3, gap, like)
    assert h._span is None
    h.remove()


def test_works_under_inference_mode():
    model = make_tiny_model("mistral")
    with torch.no_grad():
        ref = logits(model)
    with torch.inference_mode(), apply_layer_scaling(model, [0.9, 1.0, 1.4]) as h:
        a = model(input_ids=IDS).logits
        b = model(input_ids=IDS).logits
        h2 = h.cos_sin(0.9, torch.arange(5)[None], a)
    assert torch.equal(a, b) and not torch.allclose(a, ref) and h2[0].shape == (1, 5, 8)


def test_a_killed_apply_leaves_no_folder_and_the_next_one_writes(tmp_path, tiny_tokenizer, monkeypatch):
    """The patched model is written under a temporary name and renamed when complete: a kill while the
    weights are written leaves no output folder (never one that loads unpatched)."""
    from posbias.patching.rope_scaling import save_patched_model

    model = make_tiny_model("llama")
    fpath = tmp_path / "f.json"
    save_factors_file(fpath, factors=[0.8, 1.0, 1.5], curve=None, model="m")
    out = tmp_path / "patched"

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(tiny_tokenizer, "save_pretrained", killed)
    with pytest.raises(KeyboardInterrupt):
        save_patched_model(model, tiny_tokenizer, fpath, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
    monkeypatch.undo()
    (tmp_path / ".patched.partial-999999999").mkdir()  # what a killed process (long gone) left
    save_patched_model(model, tiny_tokenizer, fpath, out)
    save_patched_model(model, tiny_tokenizer, fpath, out)  # re-applied over its own output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json", "patched"]
    assert (out / "posbias_factors.json").exists() and (out / "model.safetensors").exists()


def test_resampling_for_another_layer_count_is_announced_and_recorded(tmp_path, tiny_tokenizer, capsys):
    from posbias.patching.rope_scaling import save_patched_model

    fpath = tmp_path / "f.json"
    save_factors_file(fpath, factors=[1.0, 1.2, 1.4, 1.6, 1.8], model="five-layer-model",
                      curve={"type": "linear", "control_points": [[0, 1.0], [1, 1.8]]})
    model = make_tiny_model("llama")  # 3 layers
    model.config._name_or_path = "three-layer-model"
    out = save_patched_model(model, tiny_tokenizer, fpath, tmp_path / "patched")
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("note:")]
    assert len(err) == 1 and "holds 5 factors (found on five-layer-model); the model has 3 decoder layers" in err[0]
    saved = json.loads((out / "posbias_factors.json").read_text())
    assert saved["model"] == "three-layer-model" and saved["num_layers"] == 3
    assert saved["resampled_from"] == {"model": "five-layer-model", "num_layers": 5}


def test_factors_below_one_on_sliding_window_layers_warn():
    """Gemma 3's sliding layers were trained on distances below the window: stretching them warns."""
    import warnings

    from conftest import make_variant_model

    from posbias.architecture.rope_layout import rope_layout
    from posbias.patching.rope_scaling import window_overreach

    model = make_variant_model("gemma3")  # layers: sliding, full, sliding, full; window 4
    layout = rope_layout(model)
    message = window_overreach(model, [0.8, 1.0, 1.0, 1.0], layout)
    assert message and "window 4 tokens" in message and "beyond the 3" in message
    assert window_overreach(model, [1.0, 0.5, 1.0, 0.5], layout) is None  # full-attention layers only
    assert window_overreach(model, [1.2, 1.0, 2.0, 1.0], layout) is None  # compression stays inside
    assert window_overreach(make_tiny_model("llama"), [0.5] * 3, rope_layout(make_tiny_model("llama"))) is None
    with pytest.warns(UserWarning, match="sliding-window layers"):
        apply_layer_scaling(model, [0.8, 1.0, 1.0, 1.0]).remove()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_layer_scaling(model, [1.0, 0.5, 1.0, 0.5]).remove()
