"""ALiBi: attention with linear biases (Press et al. 2022, "Train Short, Test Long", sec. 3).

``b[h, i, j] = -m_h * |i - j|`` with head slopes ``m_h = start^(h+1)``, ``start = 2^(-8/H)``
(so ``m_h = 2^(-8(h+1)/H)``). For a head count that is not a power of two, the slopes of the
closest lower power of two ``P`` are used, followed by every other slope of ``2P`` (the rule of
the reference implementation). In BAM terms ALiBi is a Laplace prior (GGD with beta = 1).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .registry import register_scheme
from .toeplitz import toeplitz_block


def _pow2_slopes(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (h + 1) for h in range(n)]


def alibi_slope_list(n_heads: int) -> list[float]:
    """ALiBi slopes as Python floats (closest-power-of-two rule for other head counts)."""
    if n_heads < 1:
        raise ValueError(f"n_heads must be positive, got {n_heads}")
    if math.log2(n_heads).is_integer():
        return _pow2_slopes(n_heads)
    p = 2 ** math.floor(math.log2(n_heads))
    return _pow2_slopes(p) + _pow2_slopes(2 * p)[0::2][: n_heads - p]


def alibi_slopes(n_heads: int, device=None) -> torch.Tensor:
    """ALiBi slopes, float32 [n_heads]."""
    return torch.tensor(alibi_slope_list(n_heads), dtype=torch.float32, device=device)


class ALiBiBias(nn.Module):
    """Fixed ALiBi bias. ``forward(q_pos: Long[i], k_pos: Long[j]) -> float32 [h, i, j]`` (``<= 0``)."""

    kind = "bias"

    def __init__(self, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        # plain floats, not a buffer: nothing to save or load, immune to meta-device construction
        self._slope_list = alibi_slope_list(n_heads)

    def slopes(self, device=None) -> torch.Tensor:
        """float32 [H] slopes on ``device``."""
        return torch.tensor(self._slope_list, dtype=torch.float32, device=device)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        dist = (q_pos[:, None] - k_pos[None, :]).abs().to(torch.float32)  # [i, j]
        return -self.slopes(dist.device)[:, None, None] * dist[None]

    def block(self, q_start: int, n_q: int, k_start: int, n_k: int, device=None,
              descending_queries: bool = False) -> torch.Tensor:
        """Bias for contiguous positions (see :meth:`GGDBias.block`): float32 [H, n_q, n_k]."""
        slopes = self.slopes(device)[:, None]
        return toeplitz_block(lambda d: -slopes * d[None], q_start, n_q, k_start, n_k, device, descending_queries)

    def score_fn(self, device=None):
        """Per-element form for FlexAttention: ``f(h, dist_float, q_pos) -> bias`` (dist = q_pos - k_pos)."""
        slopes = self.slopes(device)

        def f(h, dist, q_pos=None):
            return -slopes[h] * dist.abs()

        return f

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}"


register_scheme("alibi", "bias", lambda num_heads, **_: ALiBiBias(num_heads),
                "fixed linear distance bias (Press et al.; Laplace prior)")
