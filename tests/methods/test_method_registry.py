"""Registry-level properties shared by every method: identity settings equal the unpatched model,
cached incremental decoding equals full recompute, remove() restores the model exactly, bad options."""
from __future__ import annotations

import pytest
import torch
from conftest import left_padded_batch, make_tiny_model, make_variant_model

from posbias.methods import METHODS, apply_method, method_options, split_variant

# options that make each method an exact no-op
IDENTITY = {
    "none": {},
    "pi": {"factor": 1.0},
    "ms-poe": {"r_min": 1.0, "r_max": 1.0, "skip_layers": 0},
    "attention-buckets": {"multipliers": [1.0]},
    "moice": {"multipliers": [1.0], "top_k": 1},
    "temperature": {"t": 1.0},
    "positional-hidden": {"dims": [3], "factor": 1.0},
}
# non-trivial, static settings (Ms-PoE by head index: see test_methods_ms_poe for the score order)
ACTIVE = {
    "none": {},
    "pi": {"factor": 1.5},
    "ms-poe": {"order": "index", "skip_layers": 1},
    "attention-buckets": {},
    "moice": {"top_k": 2},
    "temperature": {"t": 1.5},  # positional-hidden is prompt-dependent: tests/methods/test_positional_hidden.py
}


def _pi_available():
    try:
        import posbias.patching.rope_scaling  # noqa: F401
    except ImportError:
        return False
    return True


def _skip_missing(name):
    if name == "pi" and not _pi_available():
        pytest.skip("posbias.patching.rope_scaling not available yet")


def greedy(model, ids, mask, pos, steps):
    """Manual greedy loop with past_key_values (like the lead's scorer); returns per-step last logits."""
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    cache, logits, tokens = out.past_key_values, [out.logits[:, -1]], []
    for _ in range(steps):
        nxt = logits[-1].argmax(-1, keepdim=True)
        tokens.append(nxt)
        mask = torch.cat([mask, torch.ones_like(nxt)], 1)
        pos = pos[:, -1:] + 1
        out = model(input_ids=nxt, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                    logits_to_keep=1)
        cache = out.past_key_values
        logits.append(out.logits[:, -1])
    return logits, tokens


def test_registry_lists_all_methods():
    assert {"none", "pi", "lpes", "ms-poe", "attention-buckets", "moice"} <= set(METHODS)
    assert "factor" in method_options("pi")
    assert split_variant("ms-poe@r_min=1.0@r_max=1.5@order=index") == (
        "ms-poe", {"r_min": 1.0, "r_max": 1.5, "order": "index"})
    assert split_variant("pi") == ("pi", {})


@pytest.mark.filterwarnings("ignore:moice")
@pytest.mark.parametrize("arch,impl", [("llama", "eager"), ("qwen3", "eager"), ("llama", "sdpa"),
                                       ("qwen2-gqa7", "eager"), ("qwen2-gqa7", "sdpa"),  # Qwen2.5's 14:2 heads
                                       ("gemma3", "eager"), ("gemma3", "sdpa")])  # two bases, sliding window 4
@pytest.mark.parametrize("name", list(IDENTITY))
def test_identity_settings_equal_unpatched(arch, impl, name):
    _skip_missing(name)
    model = make_variant_model(arch)
    model.set_attn_implementation(impl)
    ids, mask, pos = left_padded_batch()
    ref = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    with apply_method(model, name, **IDENTITY[name]) as h:
        out = h.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    valid = mask.bool()
    torch.testing.assert_close(out[valid], ref[valid], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(ACTIVE))
def test_cached_decoding_equals_full_recompute(name):
    _skip_missing(name)
    model = make_tiny_model("llama")  # GQA: 4 query heads, 2 kv heads
    ids, mask, pos = left_padded_batch(seed=1)
    with apply_method(model, name, **ACTIVE[name]) as h:
        step_logits, tokens = greedy(h.model, ids, mask, pos, steps=4)
        full_ids, full_mask = ids, mask
        for i, tok in enumerate(tokens):
            full_ids = torch.cat([full_ids, tok], 1)
            full_mask = torch.cat([full_mask, torch.ones_like(tok)], 1)
            full_pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
            full = h.model(input_ids=full_ids, attention_mask=full_mask, position_ids=full_pos).logits[:, -1]
            torch.testing.assert_close(step_logits[i + 1], full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(ACTIVE))
def test_teacher_forced_logits_to_keep_and_batching(name):
    """logits_to_keep slices the same logits, and a row scored alone equals the row in a padded batch."""
    _skip_missing(name)
    model = make_tiny_model("qwen2", seed=3)
    ids, mask, pos = left_padded_batch(seed=2)
    with apply_method(model, name, **ACTIVE[name]) as h:
        full = h.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        kept = h.model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=3).logits
        torch.testing.assert_close(kept, full[:, -3:], atol=1e-5, rtol=1e-5)
        i = 2  # the most padded row
        real = mask[i].bool()
        alone = h.model(input_ids=ids[i:i + 1, real], attention_mask=mask[i:i + 1, real],
                        position_ids=pos[i:i + 1, real]).logits
        torch.testing.assert_close(alone[0], full[i, real], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(ACTIVE))
def test_remove_restores_model_exactly(name):
    _skip_missing(name)
    model = make_tiny_model("mistral")
    ids, mask, pos = left_padded_batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    impl = model.config._attn_implementation
    ref = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    h = apply_method(model, name, **ACTIVE[name])
    h.model(input_ids=ids, attention_mask=mask, position_ids=pos)
    h.remove()
    h.remove()  # idempotent
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert model.config._attn_implementation == impl
    for layer in model.model.layers:
        assert "forward" not in layer.self_attn.__dict__
        assert layer.self_attn.config is model.config
    assert "forward" not in model.model.rotary_emb.__dict__
    assert torch.equal(model(input_ids=ids, attention_mask=mask, position_ids=pos).logits, ref)


def test_unknown_method_lists_known_ones():
    model = make_tiny_model("llama")
    with pytest.raises(ValueError, match="known methods: .*attention-buckets.*ms-poe"):
        apply_method(model, "no-such-method")


def test_unknown_option_is_rejected():
    model = make_tiny_model("llama")
    with pytest.raises(ValueError, match="no option"):
        apply_method(model, "ms-poe", ratio_min=1.0)


@pytest.mark.parametrize("name,opts", [
    ("ms-poe", {"r_min": 0.0}),
    ("ms-poe", {"ratios": [1.0, -1.0, 1.0, 1.0]}),
    ("ms-poe", {"ratios": [1.0, 2.0]}),
    ("ms-poe", {"order": "random"}),
    ("attention-buckets", {"bases": [10000.0, -5.0]}),
    ("moice", {"top_k": 0}),
    ("moice", {"routers": "/nonexistent/routers"}),
    ("lpes", {}),
    ("lpes", {"factors": "/nonexistent/factors.json"}),
    ("pi", {"factor": 0}),
])
def test_bad_options_raise_value_error(name, opts):
    model = make_tiny_model("llama")
    with pytest.raises(ValueError):
        apply_method(model, name, **opts)


def test_aliases_and_string_options():
    model = make_tiny_model("llama")
    with apply_method(model, "ms_poe", ratios="1.0,1.2,1.4,1.6", layers="1,2") as h:
        assert h.name == "ms-poe" and h.options["layers"] == [1, 2]
    with apply_method(model, "buckets", multipliers="1,2") as h:
        assert h.name == "attention-buckets" and len(h.options["bases"]) == 2


@pytest.mark.parametrize("name", [n for n in ACTIVE if n != "none"])
def test_active_settings_change_the_model(name):
    _skip_missing(name)
    model = make_tiny_model("llama")
    ids, mask, pos = left_padded_batch(t=40)
    ref = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    with apply_method(model, name, **ACTIVE[name]) as h:
        out = h.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert (out - ref).abs().max() > 1e-5


def _posbias_attributes(model) -> list[str]:
    return [f"{name or 'model'}.{key}" for name, module in model.named_modules() for key in vars(module)
            if key.startswith("_posbias")]


@pytest.mark.parametrize("name,opts", [*ACTIVE.items(), ("ms-poe", {}), ("lpes", None)])
def test_methods_write_no_state_into_the_model(name, opts, tmp_path):
    """A method keeps its state in its handle or a registry keyed by the model: applied, run with a
    KV cache, and removed, it leaves no ``_posbias*`` attribute on any module of the model."""
    from posbias.methods.registry import prompt_dependent
    from posbias.patching.rope_scaling import save_factors_file

    model = make_tiny_model("llama", layers=3)
    if opts is None:  # lpes: a factors file
        save_factors_file(tmp_path / "factors.json", factors=[1.0, 1.4, 2.0])
        opts = {"factors": str(tmp_path / "factors.json")}
    ids, mask, pos = left_padded_batch()
    h = apply_method(model, name, **opts)
    h.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    assert _posbias_attributes(model) == []
    assert prompt_dependent(model) == (name == "ms-poe" and not opts)  # Ms-PoE's default head order
    h.remove()
    assert _posbias_attributes(model) == [] and not prompt_dependent(model)


def test_lpes_applies_a_factors_file(tmp_path):
    if not _pi_available():
        pytest.skip("posbias.patching.rope_scaling not available yet")
    from posbias.patching.rope_scaling import apply_layer_scaling, save_factors_file

    model = make_tiny_model("llama", layers=3)
    ids, mask, pos = left_padded_batch(t=30)
    path = tmp_path / "factors.json"
    save_factors_file(path, factors=[1.0, 1.4, 2.0])
    inner = apply_layer_scaling(model, [1.0, 1.4, 2.0])
    ref = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    inner.remove()
    with apply_method(model, "lpes", factors=str(path)) as h:
        out = h.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    torch.testing.assert_close(out, ref)


@pytest.mark.smollm2
def test_smollm2_identity_settings_and_one_decode_step(smollm2):
    model, tok = smollm2
    ids = tok("The grass is green. The sky is blue. " * 12, return_tensors="pt")["input_ids"][:, :96]
    mask = torch.ones_like(ids)
    pos = torch.arange(ids.shape[1])[None]
    with torch.no_grad():
        ref = model(input_ids=ids).logits[:, -4:]
        for name in ("ms-poe", "attention-buckets", "moice"):
            with apply_method(model, name, **IDENTITY[name]) as h:
                out = h.model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=4).logits
            torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        with apply_method(model, "ms-poe") as h:  # GQA 9 query / 3 key heads, score order
            step_logits, _ = greedy(h.model, ids, mask, pos, steps=1)
            assert torch.isfinite(step_logits[-1]).all()
