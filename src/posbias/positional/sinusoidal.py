"""Absolute sinusoidal position embedding (Vaswani et al. 2017, "Attention Is All You Need", sec. 3.5).

``PE[m, 2k] = sin(m / base^(2k/d))``, ``PE[m, 2k+1] = cos(m / base^(2k/d))``, added to the token
embeddings. Computed on the fly, so there is no maximum length.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .registry import register_scheme


class SinusoidalEmbedding(nn.Module):
    """Sinusoidal table for model width ``dim``. ``forward(positions[..., n]) -> [..., n, dim]`` float32."""

    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        self.dim = dim
        self.base = float(base)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        half = (self.dim + 1) // 2
        inv = 1.0 / (self.base ** (torch.arange(half, dtype=torch.float64, device=positions.device) * 2 / self.dim))
        ang = positions.to(torch.float32)[..., None] * inv.float()
        pe = torch.stack([ang.sin(), ang.cos()], dim=-1).flatten(-2)  # interleaved sin, cos
        return pe[..., : self.dim]

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base:g}"


register_scheme("sinusoidal", "absolute", lambda hidden_size, base=10000.0, **_: SinusoidalEmbedding(hidden_size, base),
                "absolute sinusoidal embedding added to the input (Vaswani et al.)")
