"""The positional-dimension statistic: Savitzky-Golay smoothing, and a dimension made positional by construction."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_tiny_model

from posbias.methods.positional_dims import mean_hidden_states, rank_dimensions, savgol_smooth


def test_savgol_matches_scipy():
    signal = pytest.importorskip("scipy.signal")
    y = np.random.default_rng(0).normal(size=(40, 3)).cumsum(0)
    for window in (10, 7):
        ref = signal.savgol_filter(y, window_length=window, polyorder=3, axis=0)
        np.testing.assert_allclose(savgol_smooth(y, window, 3), ref, atol=1e-10)


def _positional(module, args, out):
    """Dimension 11 of the embeddings carries sqrt(position)."""
    pos = torch.arange(out.shape[1], dtype=out.dtype)
    out = out.clone()
    out[..., 11] += 2.0 * torch.sqrt(pos / out.shape[1])
    return out


def test_positional_dimension_by_construction_ranks_first():
    """A dimension made positional in the embeddings flows through the residual stream of every layer,
    so the statistic must rank it first (the other dims hold averaged token noise)."""
    model = make_tiny_model("llama", layers=8, hidden=32, heads=4, kv_heads=2, seed=3)
    hook = model.model.embed_tokens.register_forward_hook(_positional)
    try:
        rows = torch.randint(3, 500, (24, 80), generator=torch.Generator().manual_seed(0)).tolist()
        hidden = mean_hidden_states(model, rows, batch_size=8)
    finally:
        hook.remove()
    assert hidden.shape == (8, 80, 32)
    ranked = rank_dimensions(hidden, top_k=5)
    assert ranked[0].dim == 11 and ranked[0].direction == "increasing"
    assert len(ranked[0].monotone_layers) > 8 // 4
    assert all(a.smoothness <= b.smoothness for a, b in zip(ranked, ranked[1:]))


def test_too_short_samples_are_refused():
    with pytest.raises(ValueError, match="too few"):
        rank_dimensions(np.zeros((4, 8, 6)))


def test_find_positional_dims_record_feeds_the_method(tmp_path, tiny_tokenizer):
    import json

    from posbias.methods import apply_method
    from posbias.methods.positional_dims import find_positional_dims

    model = make_tiny_model("llama", layers=8, hidden=32, heads=4, kv_heads=2, seed=3)
    text = "The grass is green. The sky is blue. The pass key is 12345. Remember it. " * 80
    hook = model.model.embed_tokens.register_forward_hook(_positional)
    try:
        res = find_positional_dims(model, tiny_tokenizer, [text], samples=12, length=60, top_k=3, batch_size=4)
    finally:
        hook.remove()
    first = res["dims"][0]
    assert first["dim"] == 11 and len(first["curve"]) == 60 and first["curve_layer"] in first["monotone_layers"]
    assert first["curve"][-1] > first["curve"][len(first["curve"]) // 3]  # increasing
    f = tmp_path / "dims.json"
    f.write_text(json.dumps(res))
    with apply_method(model, "positional-hidden", dims_file=str(f)) as h:
        assert h.options["dims"] == [11]
