"""Per-layer RoPE scaling and the methods on every RoPE layout posbias claims (tiny random configs).

The reference for "positions m / s" is the model's own rotary module fed the float positions m / s
(whatever its pairing, partial rotary, rope type or per-layer-type bases), and, where the model has
one, Hugging Face's own ``linear`` rope type with factor s.
"""
from __future__ import annotations

import pytest
import torch
from conftest import GEMMA3_ROPE, ROPE_VARIANTS, make_variant_model

from posbias.architecture.layers import get_decoder_layers
from posbias.architecture.rope_layout import RopeLayoutError, rope_layout
from posbias.methods import apply_method
from posbias.patching.rope_scaling import apply_layer_scaling

VARIANTS = list(ROPE_VARIANTS)
IDS = torch.randint(3, 500, (2, 13), generator=torch.Generator().manual_seed(4))


def logits(model, ids=IDS, **kw):
    with torch.no_grad():
        return model(input_ids=ids, **kw).logits


def n_layers(model):
    return model.config.num_hidden_layers


class FeedScaledPositions:
    """Reference: the model's own rotary module sees positions m / s (context manager)."""

    def __init__(self, model, s: float):
        self.rot, self.s = model.model.rotary_emb, s

    def __enter__(self):
        orig = type(self.rot).forward.__get__(self.rot)
        self.rot.forward = lambda x, position_ids, *a: orig(x, position_ids.float() / self.s, *a)

    def __exit__(self, *exc):
        del self.rot.forward


@pytest.mark.parametrize("name", VARIANTS)
def test_factors_one_are_bit_identical(name):
    model = make_variant_model(name)
    ref = logits(model)
    with apply_layer_scaling(model, [1.0] * n_layers(model)) as h:
        assert "0 layers patched" in repr(h)  # a factor of 1 leaves its layer untouched
        assert not any(layer._forward_pre_hooks for layer in get_decoder_layers(model))
        assert torch.equal(logits(model), ref)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("s", [0.6, 2.0])
def test_one_factor_everywhere_equals_scaled_positions(name, s):
    model = make_variant_model(name)
    base = logits(model)
    with FeedScaledPositions(model, s):
        want = logits(model)
    assert (want - base).abs().max() > 1e-5  # the scaling moves the logits
    with apply_layer_scaling(model, [s] * n_layers(model)):
        got = logits(model)
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", [v for v in VARIANTS if v not in ("llama3", "phi3")])  # Phi-3 allows only longrope
def test_one_factor_everywhere_equals_hf_linear_rope_type(name):
    s = 2.0
    model = make_variant_model(name)
    arch, fields = ROPE_VARIANTS[name]
    if name == "gemma3":
        rope = {t: {**p, "rope_type": "linear", "factor": s} for t, p in GEMMA3_ROPE.items()}
    else:
        rope = {"rope_type": "linear", "factor": s}
    hf = make_variant_model(name, rope_parameters=rope)
    hf.load_state_dict(model.state_dict())
    with apply_layer_scaling(model, [s] * n_layers(model)):
        torch.testing.assert_close(logits(model), logits(hf), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
def test_remove_restores(name):
    model = make_variant_model(name)
    ref = logits(model)
    h = apply_layer_scaling(model, [0.8 + 0.3 * i for i in range(n_layers(model))])
    assert not torch.allclose(logits(model), ref)
    h.remove()
    assert torch.equal(logits(model), ref)


def test_gemma3_layers_get_the_base_of_their_type():
    model = make_variant_model("gemma3")
    layout = rope_layout(model)
    assert [lr.layer_type for lr in layout.layers] == ["sliding_attention", "full_attention"] * 2
    assert [lr.theta for lr in layout.layers] == [1e4, 1e6] * 2
    with torch.no_grad():
        ref = model(input_ids=IDS, output_hidden_states=True).hidden_states
    with apply_layer_scaling(model, [1.0, 1.7, 1.0, 1.0]), torch.no_grad():
        hs = model(input_ids=IDS, output_hidden_states=True).hidden_states
    assert torch.equal(hs[1], ref[1]) and not torch.allclose(hs[2], ref[2])


def test_layout_reads_pairing_partial_rotary_and_rope_type():
    assert rope_layout(make_variant_model("cohere")).layers[0].interleaved
    phi = rope_layout(make_variant_model("phi3")).layers[0]
    assert (phi.rotary_dim, phi.head_dim, phi.interleaved) == (4, 8, False)
    assert rope_layout(make_variant_model("llama3")).layers[0].rope_type == "llama3"
    assert rope_layout(make_variant_model("qwen2")).layers[0].rotate_half_full_head


# -- the inference methods on the new layouts --------------------------------------------------

# (the identity settings of every method on Qwen2.5's 14:2 heads and Gemma 3's two bases are
# checked with the other layouts in tests/methods/test_method_registry.py)


@pytest.mark.filterwarnings("ignore:moice")
@pytest.mark.parametrize("name", ["gemma3", "cohere", "phi3"])
def test_attention_buckets_bases_follow_each_layers_own_base(name):
    """One bucket of multiplier m equals the model whose every RoPE base is multiplied by m."""
    m = 2.5
    model = make_variant_model(name)
    arch, fields = ROPE_VARIANTS[name]
    rope = ({t: {**p, "rope_theta": p["rope_theta"] * m} for t, p in GEMMA3_ROPE.items()} if name == "gemma3"
            else {"rope_theta": 10000.0 * m if name != "cohere" else model.config.rope_parameters["rope_theta"] * m})
    other = make_variant_model(name, rope_parameters=rope)
    other.load_state_dict(model.state_dict())
    with apply_method(model, "attention-buckets", multipliers=[m]) as h:
        torch.testing.assert_close(h.model(input_ids=IDS).logits, logits(other), atol=1e-5, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:moice")
@pytest.mark.parametrize("method", ["ms-poe", "moice"])
@pytest.mark.parametrize("name,why", [("cohere", "interleaved"), ("phi3", "partial 4/8"), ("gemma2", "soft-capping")])
def test_self_rotating_methods_refuse_layouts_they_cannot_reproduce(method, name, why):
    model = make_variant_model(name)
    with pytest.raises(ValueError, match=why):
        apply_method(model, method)


def test_model_without_position_embeddings_kwarg_is_refused():
    model = make_variant_model("llama")
    layer_cls = type(model.model.layers[0])

    class OldLayer(layer_cls):
        def forward(self, hidden_states, attention_mask=None):  # noqa: D401 - a pre-5.x signature
            raise AssertionError

    model.model.layers[0].__class__ = OldLayer
    with pytest.raises(RopeLayoutError, match="position_embeddings"):
        rope_layout(model)


def test_float_mask_keeps_causality_with_a_2d_padding_mask():
    from posbias.methods.rope_attention import float_mask

    pad = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    m = float_mask(pad, 4, 4, torch.float32, "cpu")
    assert m.shape == (2, 1, 4, 4)
    allowed = m == 0
    causal = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    assert torch.equal(allowed[1, 0], causal)
    assert torch.equal(allowed[0, 0], causal & pad[0].bool()[None])
    step = float_mask(pad, 1, 4, torch.float32, "cpu")  # one decoding query sees every real key
    assert step.shape == (2, 1, 1, 4) and torch.equal(step[:, 0, 0] == 0, pad.bool())


def test_an_image_text_wrapper_is_refused_with_its_text_decoder_named():
    import torch

    from posbias.architecture.layers import ModelLoadError, get_decoder_layers

    class Wrapper(torch.nn.Module):  # Gemma3ForConditionalGeneration's nesting: model.language_model.layers
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.language_model = torch.nn.Module()
            self.model.language_model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])

    with pytest.raises(ModelLoadError, match="image-text model whose text decoder sits at model.model.language_model"):
        get_decoder_layers(Wrapper())
    with pytest.raises(ModelLoadError, match="no decoder layers at model.model.layers"):
        get_decoder_layers(torch.nn.Linear(2, 2))
