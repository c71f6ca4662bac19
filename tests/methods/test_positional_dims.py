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


def test_positional_dimension_by_construction_ranks_first():
    """Dimension 11 of the embeddings carries sqrt(position); it flows through the residual stream of
    every layer, so the statistic must rank it first (the other dims hold averaged token noise)."""
    model = make_tiny_model("llama", layers=8, hidden=32, heads=4, kv_heads=2, seed=3)

    def positional(module, args, out):
        pos = torch.arange(out.shape[1], dtype=out.dtype)
        out = out.clone()
        out[..., 11] += 2.0 * torch.sqrt(pos / out.shape[1])
        return out

    hook = model.model.embed_tokens.register_forward_hook(positional)
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
