"""Find the positional hidden dimensions of a model (Yu et al. 2024, arXiv 2406.02536, Sec. 4.1).

The statistic of the reference code (``experiments/search_dimension``), re-implemented:

1. **Mean hidden states.** ``samples`` texts of a corpus, each cut to exactly ``length`` tokens
   (the reference: 200 pieces of a random-string corpus, 1000 tokens, no BOS), are run through the
   model; the output hidden states of every layer (``output_hidden_states``: the embeddings, then
   each decoder layer) are averaged over the samples: ``H`` of shape (L + 1, T, D). The embedding
   row is dropped (the reference drops it when ``L + 1`` is odd).
2. **Monotone layers.** For each dimension ``d`` and each layer ``l`` in ``2 .. L - 2``, the curve
   ``H[l, skip:, d]`` (``skip`` = 30 % of the length: the reference skips 300 of 1000) is min-max
   normalised and a cubic polynomial is fitted against position; the layer counts as increasing
   (decreasing) when the fitted curve's differences are all >= 0 (<= 0). ``d``'s monotone layers are
   the larger of the two sets (ties: decreasing).
3. **Candidates**: dimensions monotone in more than ``L // 4`` layers.
4. **Smoothness** (lower = smoother): per monotone layer, ``H[l, skip2:, d]`` (``skip2`` = 20 %,
   the reference's 200 of 1000), min-max normalised, Savitzky-Golay filtered (window 10, cubic),
   the sum of squared second differences; a dimension's smoothness is its minimum over its monotone
   layers. Candidates are ranked by ascending smoothness and the first ``top_k`` returned.

The reference then keeps the 3 candidates whose scaling (factor 0, layers 10..25) gives the lowest
answer loss on a validation set of KV prompts; here that step is ``posbias tune --methods
positional-hidden`` on the search split, with the same objective and split as LPES.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from posbias.architecture.layers import model_device

SAVGOL_WINDOW, SAVGOL_ORDER, FIT_DEGREE = 10, 3, 3
MONO_SKIP, SMOOTH_SKIP = 0.3, 0.2  # the reference's 300 and 200 of 1000 tokens


@dataclass
class DimensionScore:
    """One candidate: its index, smoothness (lower is better), monotone layers and direction."""

    dim: int
    smoothness: float
    monotone_layers: list[int]
    direction: str  # "increasing" | "decreasing"

    def to_dict(self) -> dict:
        return {"dim": self.dim, "smoothness": self.smoothness, "monotone_layers": self.monotone_layers,
                "direction": self.direction}


def _normalise(x: np.ndarray) -> np.ndarray:
    """Min-max to 0..1 along axis 0 (a constant curve becomes 0)."""
    lo, hi = x.min(axis=0), x.max(axis=0)
    return (x - lo) / np.where(hi > lo, hi - lo, 1.0)


def monotone_direction(curves: np.ndarray, degree: int = FIT_DEGREE) -> np.ndarray:
    """Per curve (columns of ``curves`` (T, N)): +1 when the fitted polynomial increases on 0..T-1,
    -1 when it decreases, 0 otherwise (curves min-max normalised first, as the reference)."""
    y = _normalise(curves.astype(np.float64))
    x = np.arange(y.shape[0], dtype=np.float64)
    coef = np.polynomial.polynomial.polyfit(x, y, degree)  # (degree + 1, N)
    fit = np.polynomial.polynomial.polyval(x, coef).T  # (T, N)
    diff = np.diff(fit, axis=0)
    return np.where((diff >= 0).all(0), 1, np.where((diff <= 0).all(0), -1, 0))


def savgol_smooth(y: np.ndarray, window: int = SAVGOL_WINDOW, order: int = SAVGOL_ORDER) -> np.ndarray:
    """Savitzky-Golay smoothing along axis 0 of (T, N): least-squares polynomials of ``order`` over
    ``window`` points, evaluated at the window centre; the first / last half windows take the
    polynomial of the first / last window (scipy's ``mode="interp"``)."""
    t = y.shape[0]
    if t < window:
        return y
    x = np.arange(window, dtype=np.float64) - (window - 1) / 2  # the window centre at 0
    basis = np.vander(x, order + 1, increasing=True)  # (W, order + 1)
    pinv = np.linalg.pinv(basis)  # (order + 1, W): polynomial coefficients from the window
    proj = basis @ pinv  # (W, W): the fitted values at each window point
    half = window // 2
    out = np.empty_like(y, dtype=np.float64)
    windows = np.lib.stride_tricks.sliding_window_view(y, window, axis=0)  # (T - W + 1, N, W)
    start = (window - 1) // 2  # scipy's placement: an even window's value goes to its left centre
    out[start: start + windows.shape[0]] = windows @ pinv[0]  # the fit's value at the centre
    out[:half] = proj[:half] @ y[:window]
    out[t - half:] = proj[window - half:] @ y[t - window:]
    return out


def smoothness(curves: np.ndarray) -> np.ndarray:
    """Sum of squared second differences of the normalised, Savitzky-Golay smoothed curves (T, N) -> (N,)."""
    y = savgol_smooth(_normalise(curves.astype(np.float64)))
    return np.square(np.diff(y, n=2, axis=0)).sum(axis=0)


def rank_dimensions(hidden: np.ndarray, top_k: int = 10) -> list[DimensionScore]:
    """The statistic of the module docstring on mean hidden states ``hidden`` (L, T, D) (decoder layers
    only, embeddings dropped); the ``top_k`` smoothest candidates, smoothest first."""
    n_layers, t, n_dims = hidden.shape
    mono_skip, smooth_skip = int(MONO_SKIP * t), int(SMOOTH_SKIP * t)
    if t - mono_skip < FIT_DEGREE + 2 or t - smooth_skip < SAVGOL_WINDOW:
        raise ValueError(f"positional-dims: {t} tokens per sample are too few for the statistic; use >= 20")
    layers = list(range(2, n_layers - 1)) or list(range(n_layers))
    direction = np.stack([monotone_direction(hidden[layer, mono_skip:]) for layer in layers])  # (Ls, D)
    inc, dec = (direction == 1).sum(0), (direction == -1).sum(0)
    out = []
    for d in range(n_dims):
        sign = 1 if inc[d] > dec[d] else -1
        mono = [layers[i] for i in np.flatnonzero(direction[:, d] == sign)]
        if len(mono) <= n_layers // 4:
            continue
        s = float(smoothness(hidden[mono, smooth_skip:, d].T).min())
        out.append(DimensionScore(d, s, mono, "increasing" if sign == 1 else "decreasing"))
    out.sort(key=lambda c: (c.smoothness, c.dim))
    return out[:top_k]


@torch.no_grad()
def mean_hidden_states(model, token_rows: Sequence[Sequence[int]], batch_size: int = 1) -> np.ndarray:
    """Hidden states averaged over equal-length token rows: (L, T, D) float32, decoder layers only."""
    lengths = {len(r) for r in token_rows}
    if len(lengths) != 1:
        raise ValueError(f"positional-dims: every sample must have the same length, got {sorted(lengths)}")
    device = model_device(model)
    total = None
    for start in range(0, len(token_rows), batch_size):
        ids = torch.tensor([list(r) for r in token_rows[start:start + batch_size]], device=device)
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False, logits_to_keep=1)
        # (L, T, D) summed over the batch, on the inputs' device (a --device shard model's layers are not)
        stacked = torch.stack([h.float().sum(0).to(device) for h in out.hidden_states[1:]])
        total = stacked if total is None else total + stacked
    return (total / len(token_rows)).cpu().numpy()


def corpus_rows(tokenizer, texts: Sequence[str], samples: int, length: int) -> list[list[int]]:
    """``samples`` rows of exactly ``length`` tokens (no special tokens), cut from the texts in order."""
    rows: list[list[int]] = []
    buffer: list[int] = []
    for text in texts:
        buffer += tokenizer.encode(text, add_special_tokens=False)
        while len(buffer) >= length and len(rows) < samples:
            rows.append(buffer[:length])
            buffer = buffer[length:]
        if len(rows) == samples:
            return rows
    raise ValueError(f"positional-dims: the corpus gives {len(rows)} samples of {length} tokens, "
                     f"{samples} asked; use fewer --samples or a shorter --length")


def curve_points(curve: np.ndarray, points: int = 100) -> list[float]:
    """At most ``points`` evenly spaced values of a (T,) curve, rounded for a JSON record."""
    idx = np.unique(np.linspace(0, len(curve) - 1, min(points, len(curve))).round().astype(int))
    return [round(float(v), 5) for v in curve[idx]]


def find_positional_dims(model, tokenizer, texts: Sequence[str], *, samples: int, length: int, top_k: int = 10,
                         batch_size: int = 1) -> dict:
    """The statistic on ``samples`` rows of ``length`` tokens of ``texts``: ``{"dims": [...], "num_layers",
    "hidden_size", "seconds"}``; each dim record also holds its mean curve at its middle monotone layer."""
    start = time.perf_counter()
    hidden = mean_hidden_states(model, corpus_rows(tokenizer, texts, samples, length), batch_size)
    ranked = rank_dimensions(hidden, top_k)
    dims = []
    for c in ranked:
        layer = c.monotone_layers[len(c.monotone_layers) // 2]
        dims.append({**c.to_dict(), "curve_layer": layer, "curve": curve_points(hidden[layer, :, c.dim])})
    return {"dims": dims, "num_layers": int(hidden.shape[0]), "hidden_size": int(hidden.shape[2]),
            "seconds": round(time.perf_counter() - start, 1)}
