"""Attention Buckets: per-copy RoPE bases, logit mixing, repeated cache."""
from __future__ import annotations

import torch
from conftest import make_tiny_model

from posbias.methods import apply_method
from posbias.methods.attention_buckets import mix_logits
from posbias.methods.rope_attention import base_inv_freq


def _logits_with_base(model, base, **inputs):
    rot = model.model.rotary_emb
    saved = rot.inv_freq.clone()
    rot.inv_freq.copy_(base_inv_freq(saved, 10000.0, base))
    try:
        return model(**inputs).logits
    finally:
        rot.inv_freq.copy_(saved)


def test_mix_logits_formula():
    logits = torch.randn(3, 2, 4, 7)
    w = torch.softmax(logits.max(-1).values, dim=0)
    torch.testing.assert_close(mix_logits(logits), (w[..., None] * logits).sum(0))
    torch.testing.assert_close(mix_logits(logits[:1]), logits[0])


def test_default_bases_scale_with_theta():
    model = make_tiny_model("llama", theta=500000.0)
    with apply_method(model, "attention-buckets") as h:
        assert h.options["bases"] == [500000.0 * m for m in (1.0, 1.3, 1.6, 1.9, 2.2, 2.5, 2.8)]


def test_each_copy_runs_with_its_base_and_logits_are_mixed():
    model = make_tiny_model("llama", seed=4)
    ids = torch.randint(3, 500, (2, 30))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=pos)
    bases = [10000.0, 30000.0, 3000.0]
    per_base = torch.stack([_logits_with_base(model, b, **inputs) for b in bases])
    with apply_method(model, "attention-buckets", bases=bases) as h:
        out = h.model(**inputs, use_cache=True)
    valid = mask.bool()
    torch.testing.assert_close(out.logits[valid], mix_logits(per_base)[valid], atol=1e-5, rtol=1e-5)
    # the cache holds one copy of the batch per base
    assert out.past_key_values.get_seq_length() == 30
    k = out.past_key_values.layers[0].keys
    assert k.shape[0] == len(bases) * 2


def test_wrapper_delegates_attributes():
    model = make_tiny_model("llama")
    with apply_method(model, "attention-buckets") as h:
        assert h.model.config is model.config
        assert h.model.device == model.device
