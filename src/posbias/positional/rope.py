"""Rotary position embedding (RoPE; Su et al. 2021, "RoFormer", eq. 34).

Rotates each pair of channels ``(x[k], x[k + d/2])`` of queries and keys by the angle
``m * theta^(-2k/d)`` at position ``m`` (the "rotate_half" layout used by Llama / Hugging Face),
so ``<R_m q, R_n k>`` depends only on ``m - n``.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .registry import register_scheme


class RotaryEmbedding(nn.Module):
    """RoPE with base ``theta`` for heads of size ``head_dim`` (even). No learnable parameters."""

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.theta = float(theta)

    def inv_freq(self, device=None) -> torch.Tensor:
        """float32 [head_dim / 2] frequencies ``theta^(-2k/d)`` (computed on the fly: no buffer to load)."""
        ar = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device)
        return (1.0 / (self.theta ** (ar / self.head_dim))).float()

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions``: LongTensor[n] or [b, n] -> ``(cos, sin)`` each float32 [..., n, head_dim]."""
        ang = positions.to(torch.float32)[..., None] * self.inv_freq(positions.device)
        ang = torch.cat([ang, ang], dim=-1)
        return ang.cos(), ang.sin()

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x``: [b, h, n, head_dim] at ``positions`` ([n] or [b, n]); same shape and dtype."""
        cos, sin = self.cos_sin(positions)
        if cos.dim() == 3:  # [b, n, d] -> [b, 1, n, d]
            cos, sin = cos[:, None], sin[:, None]
        xf = x.float()
        x1, x2 = xf.chunk(2, dim=-1)
        rot = torch.cat([-x2, x1], dim=-1)
        return (xf * cos + rot * sin).to(x.dtype)

    def forward(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor):
        """Rotate queries [b, h, i, d] at ``q_pos`` and keys [b, h_kv, j, d] at ``k_pos``."""
        return self.apply(q, q_pos), self.apply(k, k_pos)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta:g}"


register_scheme("rope", "rotary", lambda head_dim, theta=10000.0, **_: RotaryEmbedding(head_dim, theta),
                "rotary embedding on q and k (RoFormer)")
