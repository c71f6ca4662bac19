"""GGD-BAM positional prior (Bayesian Attention Mechanism; Bianchessi et al. 2025, "Bayesian
Attention Mechanism: A Probabilistic Framework for Positional Encoding and Context Length
Extrapolation", eq. for the generalized Gaussian prior).

BAM reads attention as posterior = content likelihood x positional prior, so a prior enters the
logits additively as its log density. The generalized Gaussian (GGD) prior over the offset
``j - i`` gives, per head ``h``::

    b[h, i, j] = -|(j - i - mu) / alpha_h|^beta_h
               = -exp(theta_alpha[h]) * (|j - i| + eps) ** theta_beta[h]      (mu = 0)

which is the parametrisation of the reference code (``exp(theta_alpha) = alpha^-beta``). Two
learnable scalars per head (per layer unless shared). Special cases: ``theta_beta = 0`` is a
constant, i.e. NoPE (uniform prior); ``theta_beta = 1`` with ``theta_alpha = log m_h`` is ALiBi
(Laplace prior); ``theta_beta < 0`` is allowed and *suppresses* local context (the bias at
``i = j`` is then ``-exp(theta_alpha) * eps^theta_beta``: large but finite).

Numerical safety (ours, not in the reference): the magnitude is computed in float32 as
``exp(theta_alpha + theta_beta * log(|d| + eps))`` with the exponent clamped at
:data:`MAX_LOG_MAGNITUDE`, so the bias never overflows to ``-inf`` (no NaN in softmax or its
gradient); gradients are exact wherever the clamp is inactive.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn

from .alibi import alibi_slopes
from .params import per_head
from .registry import register_scheme
from .toeplitz import toeplitz_block

MAX_LOG_MAGNITUDE = 60.0  # exp(60) ~ 1.1e26: far beyond any logit, far below float32 max
INITS = ("nope", "alibi", "linear")


class GGDBias(nn.Module):
    """Learnable GGD prior for ``n_heads`` heads.

    Args:
        n_heads: number of attention heads H.
        init: ``"nope"`` (theta_alpha = theta_beta = 0), ``"alibi"`` (theta_alpha = log ALiBi
            slope, theta_beta = 1) or ``"linear"`` (theta_alpha = 0, theta_beta = linspace(0, 1, H)).
        theta_alpha, theta_beta: explicit initial values (a float or H floats); override ``init``.
        eps: offset inside the power (1e-5 as in the reference), keeps ``i = j`` finite for beta < 0.

    Parameters: ``theta_alpha`` float32 [H], ``theta_beta`` float32 [H].
    ``forward(q_pos: Long[i], k_pos: Long[j]) -> float32 [H, i, j]``.
    """

    kind = "bias"

    def __init__(self, n_heads: int, init: str = "nope", *, theta_alpha: float | Sequence[float] | None = None,
                 theta_beta: float | Sequence[float] | None = None, eps: float = 1e-5):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"unknown GGD init {init!r}; known: {', '.join(INITS)}")
        if eps <= 0:
            raise ValueError(f"eps must be positive, got {eps}")
        self.n_heads = n_heads
        self.init = init
        self.eps = float(eps)
        self._init_alpha = theta_alpha
        self._init_beta = theta_beta
        self.theta_alpha = nn.Parameter(torch.zeros(n_heads))
        self.theta_beta = nn.Parameter(torch.zeros(n_heads))
        self.reset_parameters()

    def _values(self, given, default: torch.Tensor) -> torch.Tensor:
        return per_head(given, default, self.n_heads)

    def initial_values(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The initial ``(theta_alpha, theta_beta)``, float32 [H] each, given ``init`` and explicit values."""
        h = self.n_heads
        if self.init == "alibi":
            alpha, beta = alibi_slopes(h, device="cpu").log(), torch.ones(h, device="cpu")
        elif self.init == "linear":
            alpha, beta = torch.zeros(h, device="cpu"), torch.linspace(0.0, 1.0, h, device="cpu")
        else:
            alpha, beta = torch.zeros(h, device="cpu"), torch.zeros(h, device="cpu")
        return self._values(self._init_alpha, alpha), self._values(self._init_beta, beta)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        alpha, beta = self.initial_values()
        if self.theta_alpha.device.type != "meta":
            self.theta_alpha.copy_(alpha)
            self.theta_beta.copy_(beta)

    def log_magnitude(self, dist: torch.Tensor) -> torch.Tensor:
        """``dist``: float32 [...] of |j - i| -> [H, ...] of ``theta_alpha + theta_beta log(dist + eps)``, clamped."""
        logd = torch.log(dist + self.eps)
        shape = (self.n_heads,) + (1,) * dist.dim()
        a = self.theta_alpha.float().view(shape)
        b = self.theta_beta.float().view(shape)
        return (a + b * logd[None]).clamp(max=MAX_LOG_MAGNITUDE)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        # The bias depends on |i - j| only: evaluate it once per distance ([H, D] table, D <= i + j)
        # and gather, instead of a log / exp per (h, i, j) element. Same values, cheaper.
        dist = (q_pos[:, None] - k_pos[None, :]).abs()  # Long [i, j]
        lo, hi = int(dist.min()), int(dist.max())
        d = torch.arange(lo, hi + 1, device=dist.device, dtype=torch.float32)
        table = -torch.exp(self.log_magnitude(d))  # [H, D]
        return table[:, dist - lo]

    def block(self, q_start: int, n_q: int, k_start: int, n_k: int, device=None,
              descending_queries: bool = False) -> torch.Tensor:
        """Bias for contiguous positions ``q_start + [0, n_q)`` x ``k_start + [0, n_k)``: float32 [H, n_q, n_k]
        (rows last query first with ``descending_queries``, then a view without a copy).

        Equal to ``forward(arange(...), arange(...))`` but built as a Toeplitz matrix
        (:func:`~posbias.positional.toeplitz.toeplitz_block`).
        """
        return toeplitz_block(lambda d: -torch.exp(self.log_magnitude(d)), q_start, n_q, k_start, n_k, device,
                              descending_queries)

    def score_fn(self, device=None):
        """Per-element form for FlexAttention ``score_mod``: ``f(h, dist, q_pos) -> bias`` (dist = q_pos - k_pos)."""
        alpha, beta, eps = self.theta_alpha, self.theta_beta, self.eps

        def f(h, dist, q_pos=None):
            lm = alpha[h].float() + beta[h].float() * torch.log(dist.abs().float() + eps)
            return -torch.exp(torch.clamp(lm, max=MAX_LOG_MAGNITUDE))

        return f

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, init={self.init!r}, eps={self.eps:g}"


def _build(num_heads: int, ggd_init: str = "nope", ggd_theta_alpha=None, ggd_theta_beta=None,
           ggd_eps: float = 1e-5, **_):
    return GGDBias(num_heads, ggd_init, theta_alpha=ggd_theta_alpha, theta_beta=ggd_theta_beta, eps=ggd_eps)


register_scheme("ggd", "bias", _build, "learnable generalized-Gaussian prior (GGD-BAM)")

__all__ = ["GGDBias", "INITS", "MAX_LOG_MAGNITUDE"]
