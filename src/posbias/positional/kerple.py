"""KERPLE priors (Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation", NeurIPS 2022): conditionally positive definite kernels of the distance
``d = |i - j|``, added to the attention logits as a bias, per head ``h``::

    kerple-power:  b[h, i, j] = -r1[h] * d ** r2[h]             r1 > 0, 0 < r2 <= 2
    kerple-log:    b[h, i, j] = -r1[h] * log(1 + r2[h] * d)     r1, r2 > 0

Two learnable scalars per head (per layer). ``r2 = 1`` in the power kernel is ALiBi with learnable
slopes; the logarithmic variant was the paper's best at extrapolation. In BAM terms both are
log-priors of the offset (the power kernel is GGD with ``theta_alpha = log r1``, ``theta_beta = r2``
restricted to ``(0, 2]``).

Initialisation and constraints follow the reference implementation (``chijames/KERPLE``): the
outer scale and the exponent start uniform in (0, 2) and the inner scale / power scale in (0, 1),
i.e. log: ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``; power: ``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)``. Every
parameter is kept ``>= 0.01`` (and the power's exponent ``<= 2``) by clamping the stored values, a
projected gradient step: the reference clamps them before every forward pass, posbias after every
optimizer step (:func:`posbias.positional.registry.project_parameters`, the same sequence of values),
and the forward pass also uses the clamped values, so any loaded state is evaluated in-domain.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn

from .params import per_head
from .registry import register_scheme
from .toeplitz import toeplitz_block

EPS = 1e-2  # smallest value of every KERPLE parameter (the reference's clamp)


class KerpleBias(nn.Module):
    """A learnable KERPLE kernel for ``n_heads`` heads (base of the log and power variants).

    Args:
        n_heads: number of attention heads H.
        r1, r2: explicit initial values (a float or H floats) instead of the reference's uniform draws.

    Parameters: ``r1``, ``r2`` float32 [H] (stored; :meth:`constrained` are the values used).
    ``forward(q_pos: Long[i], k_pos: Long[j]) -> float32 [H, i, j]``.
    """

    kind = "bias"
    R1_INIT: tuple[float, float] = (0.0, 1.0)  # uniform range of the initial r1
    R2_INIT: tuple[float, float] = (0.0, 1.0)
    R2_MAX: float | None = None  # upper bound of r2 (the power kernel's exponent: 2)

    def __init__(self, n_heads: int, *, r1: float | Sequence[float] | None = None,
                 r2: float | Sequence[float] | None = None):
        super().__init__()
        self.n_heads = n_heads
        self._init_r1, self._init_r2 = r1, r2
        self.r1 = nn.Parameter(torch.ones(n_heads))
        self.r2 = nn.Parameter(torch.ones(n_heads))
        self.reset_parameters()

    def initial_state(self) -> dict[str, torch.Tensor]:
        """``{"r1": float32 [H], "r2": float32 [H]}``: explicit values, else fresh uniform draws, clamped."""
        def draw(lo_hi):
            return lo_hi[0] + (lo_hi[1] - lo_hi[0]) * torch.rand(self.n_heads, device="cpu")

        r1 = per_head(self._init_r1, draw(self.R1_INIT), self.n_heads)
        r2 = per_head(self._init_r2, draw(self.R2_INIT), self.n_heads)
        return {"r1": r1.clamp(min=EPS), "r2": r2.clamp(min=EPS, max=self.R2_MAX)}

    @torch.no_grad()
    def reset_parameters(self) -> None:
        if self.r1.device.type != "meta":
            for name, value in self.initial_state().items():
                getattr(self, name).copy_(value)

    @torch.no_grad()
    def project_(self) -> None:
        """Clamp the stored parameters into their domain (after an optimizer step)."""
        self.r1.clamp_(min=EPS)
        self.r2.clamp_(min=EPS, max=self.R2_MAX)

    def constrained(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r1, r2)`` as used: float32 [H] each, clamped into their domain (gradients pass inside it)."""
        return self.r1.float().clamp(min=EPS), self.r2.float().clamp(min=EPS, max=self.R2_MAX)

    @staticmethod
    def kernel(r1: torch.Tensor, r2: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
        """The bias at distance ``dist`` (>= 0) for parameters broadcastable against it."""
        raise NotImplementedError

    def of_distance(self, dist: torch.Tensor) -> torch.Tensor:
        """``dist``: float32 [...] of |i - j| -> float32 [H, ...]."""
        r1, r2 = self.constrained()
        shape = (self.n_heads,) + (1,) * dist.dim()
        return self.kernel(r1.view(shape), r2.view(shape), dist[None])

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        # distance-only: one [H, D] table over the distances present, gathered (as GGDBias.forward)
        dist = (q_pos[:, None] - k_pos[None, :]).abs()  # Long [i, j]
        lo, hi = int(dist.min()), int(dist.max())
        table = self.of_distance(torch.arange(lo, hi + 1, device=dist.device, dtype=torch.float32))
        return table[:, dist - lo]

    def block(self, q_start: int, n_q: int, k_start: int, n_k: int, device=None,
              descending_queries: bool = False) -> torch.Tensor:
        """Bias for contiguous positions as a Toeplitz view (see :meth:`posbias.positional.GGDBias.block`):
        float32 [H, n_q, n_k]."""
        return toeplitz_block(self.of_distance, q_start, n_q, k_start, n_k, device, descending_queries)

    def score_fn(self, device=None):
        """Per-element form for FlexAttention: ``f(h, dist, q_pos) -> bias`` (dist = q_pos - k_pos)."""
        kernel = self.kernel

        def f(h, dist, q_pos=None):
            r1, r2 = self.constrained()
            return kernel(r1[h], r2[h], dist.abs().float())

        return f

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}"


class KerpleLogBias(KerpleBias):
    """KERPLE logarithmic kernel ``-r1 log(1 + r2 d)``; r1 ~ U(0, 2), r2 ~ U(0, 1) at initialisation."""

    R1_INIT = (0.0, 2.0)
    R2_INIT = (0.0, 1.0)

    @staticmethod
    def kernel(r1, r2, dist):
        return -r1 * torch.log1p(r2 * dist)


class KerplePowerBias(KerpleBias):
    """KERPLE power kernel ``-r1 d^r2`` (0 < r2 <= 2); r1 ~ U(0, 1), r2 ~ U(0, 2) at initialisation."""

    R1_INIT = (0.0, 1.0)
    R2_INIT = (0.0, 2.0)
    R2_MAX = 2.0

    @staticmethod
    def kernel(r1, r2, dist):
        return -r1 * torch.pow(dist, r2)  # 0 ** r2 = 0 (r2 > 0), and torch gives it a zero r2 gradient


register_scheme("kerple-log", "bias", lambda num_heads, **_: KerpleLogBias(num_heads),
                "learnable logarithmic distance kernel -r1 log(1 + r2 d) (KERPLE)")
register_scheme("kerple-power", "bias", lambda num_heads, **_: KerplePowerBias(num_heads),
                "learnable power distance kernel -r1 d^r2 (KERPLE)")

__all__ = ["KerpleBias", "KerpleLogBias", "KerplePowerBias", "EPS"]
