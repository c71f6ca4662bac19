"""Attention temperature: identity, equivalence with scaled query weights, cache, values files."""
from __future__ import annotations

import copy

import pytest
import torch
from conftest import left_padded_batch, make_tiny_model, make_variant_model

from posbias.methods import apply_method
from posbias.patching.rope_scaling import save_factors_file


def _logits(model, **inputs):
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("name", ["llama", "qwen2-gqa7", "gemma3"])
def test_t_one_is_bit_identical_and_installs_nothing(name):
    model = make_variant_model(name)
    ids, mask, pos = left_padded_batch()
    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=pos)
    ref = _logits(model, **inputs)
    with apply_method(model, "temperature", t=1.0) as h:
        assert torch.equal(_logits(model, **inputs), ref)
        assert not h.state["hooks"]._hooks


def _scaled_query_weights(model, values):
    """Reference: a copy whose query weights (q_norm's for models with one, else q_proj's) carry t_l."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for layer, t in zip(ref.model.layers, values):
            attn = layer.self_attn
            if hasattr(attn, "q_norm"):
                w = attn.q_norm.weight
                if type(attn.q_norm).__name__.startswith("Gemma"):  # Gemma's RMSNorm multiplies by (1 + w)
                    w.copy_((1 + w) * t - 1)
                else:
                    w.mul_(t)
            else:
                attn.q_proj.weight.mul_(t)
                if attn.q_proj.bias is not None:
                    attn.q_proj.bias.mul_(t)
    return ref


@pytest.mark.parametrize("name", ["llama", "qwen2-gqa7", "qwen3", "gemma3"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_per_layer_temperature_equals_scaled_query_weights(name, impl):
    model = make_variant_model(name)
    model.set_attn_implementation(impl)
    n = len(model.model.layers)
    values = [1.0, 1.7, 0.6, 2.0][:n] + [1.3] * max(0, n - 4)
    ids, mask, pos = left_padded_batch()
    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=pos)
    ref = _logits(_scaled_query_weights(model, values), **inputs)
    plain = _logits(model, **inputs)
    with apply_method(model, "temperature", values=values) as h:
        got = _logits(model, **inputs)
        assert len(h.state["hooks"]._hooks) == sum(v != 1.0 for v in values)
    valid = mask.bool()
    torch.testing.assert_close(got[valid], ref[valid], atol=1e-5, rtol=1e-4)
    assert (got - plain)[valid].abs().max() > 1e-3


def test_cached_decoding_equals_full_recompute():
    model = make_tiny_model("qwen2", layers=3)
    ids = torch.randint(3, 500, (1, 12), generator=torch.Generator().manual_seed(0))
    with apply_method(model, "temperature", t=1.8):
        full = _logits(model, input_ids=ids, use_cache=False)
        with torch.no_grad():
            out = model(input_ids=ids[:, :8], use_cache=True)
            steps = [out.logits]
            for j in range(8, 12):
                out = model(input_ids=ids[:, j:j + 1], cache=out.past_key_values, use_cache=True)
                steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_values_file_and_refusals(tmp_path):
    model = make_tiny_model("llama", layers=3)
    f = tmp_path / "t.json"
    save_factors_file(f, factors=[1.0, 1.5, 2.0], curve={"type": "linear", "control_points": [[0, 1.0], [1, 2.0]]},
                      target="temperature")
    with apply_method(model, "temperature", values_file=str(f)) as h:
        assert h.options["values"] == [1.0, 1.5, 2.0]
    deep = make_tiny_model("llama", layers=5)
    with apply_method(deep, "temperature", values_file=str(f)) as h:  # the curve re-evaluated for 5 layers
        assert h.options["values"] == pytest.approx([1.0, 1.25, 1.5, 1.75, 2.0])
    rope = tmp_path / "rope.json"
    save_factors_file(rope, factors=[1.0, 1.0, 0.9])
    for opts, words in [({"values_file": str(rope)}, "RoPE factors"), ({"t": 0}, "> 0"),
                        ({"values": [1.0, 2.0]}, "one per layer"), ({"t": "x"}, "number"),
                        ({"values": [1.0] * 3, "values_file": str(f)}, "not both")]:
        with pytest.raises(ValueError, match=words):
            apply_method(model, "temperature", **opts)


def test_lpes_refuses_a_temperature_file(tmp_path):
    f = tmp_path / "t.json"
    save_factors_file(f, factors=[1.0, 1.5, 2.0], target="temperature")
    with pytest.raises(ValueError, match="temperature values, not RoPE factors"):
        apply_method(make_tiny_model("llama", layers=3), "lpes", factors=str(f))


def test_fused_qkv_is_refused_in_one_line():
    model = make_variant_model("phi3")
    with pytest.raises(ValueError, match="fused qkv"):
        apply_method(model, "temperature", t=1.5)
    assert not any(m._forward_hooks for m in model.modules())
