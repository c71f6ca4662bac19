"""FIRE prior (Li et al. 2024, "Functional Interpolation for Relative Positions Improves Long Context
Transformers", ICLR 2024): a learned function of the *normalised* distance::

    b[h, i, j] = f( psi(i - j) / psi(max(L, i)) )[h],     psi(x) = log(c x + 1),   i >= j

``f``: an MLP R -> R^H with one hidden layer of ``hidden`` (32) ReLU units, one output per head; ``c > 0``
and the threshold ``L`` learnable. Normalising by the query position ``i`` maps every query's distances
into [0, 1] (progressive interpolation), and ``L`` keeps the distances of early queries from being
over-stretched. The paper shows FIRE can represent T5's RPE, ALiBi and KERPLE.

Parametrisation and initialisation as the paper's reference implementation (appendix): ``c = |c_raw|``
with ``c_raw = 0.1``; ``L = |l_raw| * L0`` with ``l_raw = 1`` and ``L0 = threshold`` (512 there);
``1e-6`` added to ``psi(max(L, i))``; the MLP's weights and biases as ``torch.nn.Linear`` initialises
them (``U(+-1/sqrt(fan_in))``). ``i`` is the query's own position (0-based): the attention kernel passes
it as ``q_index``, which the BAM model restarts at every packed document and counts after left padding
(as the sinusoidal scheme's positions), so a document scores the same packed or alone, batched or
not; ``|i - j|`` is used (only ``j <= i`` is attended).

Evaluation: a one-hidden-layer ReLU MLP of a scalar is piecewise linear with at most ``hidden + 1``
pieces (the hidden units switch at ``u = -b1_k / w1_k``). :meth:`FIREBias.forward` finds each
element's piece (``searchsorted``) and applies that piece's slope and intercept per head, which is the
MLP's value (same function, summed in another order) in ``O(H)`` per element instead of
``O(hidden * H)`` and without a ``[hidden, i, j]`` activation; gradients reach every parameter as through
the MLP. The bias depends on the query position, so it has no Toeplitz form: the chunked attention path
asks it per query chunk (``[H, chunk, keys]``), never for the full ``L x L`` matrix.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .registry import register_scheme

NORM_EPS = 1e-6  # added to psi(max(L, i)) (the reference implementation's eps)


class FIREBias(nn.Module):
    """Learnable FIRE prior for ``n_heads`` heads.

    Args:
        n_heads: number of attention heads H.
        hidden: hidden units K of the MLP (32 in the paper).
        c: initial ``c`` of ``psi(x) = log(c x + 1)`` (0.1).
        threshold: ``L0``, the initial threshold ``L`` (512 in the paper's implementation).

    Parameters: ``w1``, ``b1`` float32 [K] (input -> hidden), ``w2`` float32 [H, K], ``b2`` float32 [H]
    (hidden -> heads), ``c_raw`` and ``l_raw`` float32 [1].
    ``forward(q_pos: Long[i], k_pos: Long[j], q_index: Long[i] | Long[b, i] | None) -> float32 [H, i, j]``
    (``[b, H, i, j]`` for a 2-D ``q_index``): distances from ``q_pos`` / ``k_pos``, the normaliser from
    ``q_index`` (default ``q_pos``).
    """

    kind = "bias"
    query_dependent = True  # the attention kernel passes the queries' own positions (q_index)

    def __init__(self, n_heads: int, hidden: int = 32, *, c: float = 0.1, threshold: float = 512.0):
        super().__init__()
        if hidden < 1:
            raise ValueError(f"FIRE needs at least one hidden unit, got {hidden}")
        if not threshold > 0 or not c > 0:
            raise ValueError(f"FIRE's threshold and c must be positive, got threshold={threshold}, c={c}")
        self.n_heads, self.hidden = n_heads, hidden
        self.c_init, self.threshold = float(c), float(threshold)
        self.w1 = nn.Parameter(torch.zeros(hidden))
        self.b1 = nn.Parameter(torch.zeros(hidden))
        self.w2 = nn.Parameter(torch.zeros(n_heads, hidden))
        self.b2 = nn.Parameter(torch.zeros(n_heads))
        self.c_raw = nn.Parameter(torch.zeros(1))
        self.l_raw = nn.Parameter(torch.zeros(1))
        self.reset_parameters()

    def initial_state(self) -> dict[str, torch.Tensor]:
        """Fresh initial values of every parameter (MLP drawn as ``nn.Linear`` does; c and L as the paper)."""
        def linear_init(*shape, fan_in):
            bound = 1.0 / math.sqrt(fan_in)
            return (torch.rand(*shape, device="cpu") * 2 - 1) * bound

        k, h = self.hidden, self.n_heads
        return {"w1": linear_init(k, fan_in=1), "b1": linear_init(k, fan_in=1),
                "w2": linear_init(h, k, fan_in=k), "b2": linear_init(h, fan_in=k),
                "c_raw": torch.tensor([self.c_init]), "l_raw": torch.tensor([1.0])}

    @torch.no_grad()
    def reset_parameters(self) -> None:
        if self.w1.device.type != "meta":
            for name, value in self.initial_state().items():
                getattr(self, name).copy_(value)

    def c(self) -> torch.Tensor:
        """``c = |c_raw|``: float32 [1]."""
        return self.c_raw.float().abs()

    def threshold_value(self) -> torch.Tensor:
        """``L = |l_raw| * threshold``: float32 [1]."""
        return self.l_raw.float().abs() * self.threshold

    def normalised_distance(self, q_pos: torch.Tensor, k_pos: torch.Tensor,
                            q_index: torch.Tensor | None = None) -> torch.Tensor:
        """``psi(|q_pos - k_pos|) / (psi(max(L, q_index)) + 1e-6)``: float32 [i, j], or [b, i, j] for a
        2-D ``q_index`` (in [0, 1] for the attended keys)."""
        c = self.c()
        dist = (q_pos[:, None] - k_pos[None, :]).abs().to(torch.float32)
        index = q_pos if q_index is None else q_index
        norm = torch.maximum(index.to(torch.float32), self.threshold_value())  # [i] or [b, i]
        return torch.log1p(c * dist) / (torch.log1p(c * norm) + NORM_EPS)[..., None]

    def mlp(self, u: torch.Tensor) -> torch.Tensor:
        """The MLP itself, unit by unit: ``u`` float32 [...] -> float32 [H, ...] (reference form)."""
        hid = torch.relu(self.w1.float().view((-1,) + (1,) * u.dim()) * u[None]
                         + self.b1.float().view((-1,) + (1,) * u.dim()))  # [K, ...]
        out = torch.tensordot(self.w2.float(), hid, dims=([1], [0]))  # [H, ...]
        return out + self.b2.float().view((-1,) + (1,) * u.dim())

    def pieces(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The MLP as a piecewise-linear function: ``(knots float32 [K] ascending, slope [H, K + 1],
        intercept [H, K + 1])``; on piece ``m`` (``m`` knots strictly below ``u``) the MLP is
        ``slope[:, m] * u + intercept[:, m]``."""
        w1, b1, w2, b2 = self.w1.float(), self.b1.float(), self.w2.float(), self.b2.float()
        inf = torch.full_like(w1, float("inf"))
        knots = torch.where(w1 != 0, -b1 / torch.where(w1 != 0, w1, torch.ones_like(w1)), inf).detach()
        order = torch.argsort(knots)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order), device=order.device)
        m = torch.arange(self.hidden + 1, device=w1.device)[:, None]  # [K + 1, 1]
        # unit k is on where w1_k u + b1_k > 0: above its knot (w1 > 0), below it (w1 < 0), always if b1 > 0 (w1 = 0)
        always = (b1 > 0)[None].expand(len(m), -1)
        active = torch.where(w1 > 0, rank[None] < m, torch.where(w1 < 0, rank[None] >= m, always)).to(w1.dtype)
        slope = (w2 * w1[None]) @ active.T  # [H, K + 1]
        intercept = (w2 * b1[None]) @ active.T + b2[:, None]
        return knots[order].contiguous(), slope, intercept

    def of_normalised(self, u: torch.Tensor) -> torch.Tensor:
        """The MLP's value at ``u`` float32 [...] -> float32 [H, ...], evaluated piecewise."""
        knots, slope, intercept = self.pieces()
        piece = torch.searchsorted(knots, u.contiguous())  # Long [...]: knots strictly below u
        index = piece.view(1, -1).expand(self.n_heads, -1)
        out = torch.gather(intercept, 1, index).view(self.n_heads, *u.shape)
        # in place: gather's backward needs only the index, addcmul's only the slope and u
        return out.addcmul_(torch.gather(slope, 1, index).view(self.n_heads, *u.shape), u[None])

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q_index: torch.Tensor | None = None) -> torch.Tensor:
        out = self.of_normalised(self.normalised_distance(q_pos, k_pos, q_index))  # [H, (b,) i, j]
        return out.transpose(0, 1) if out.dim() == 4 else out

    def score_fn(self, device=None):
        """Per-element form for FlexAttention: ``f(h, dist, q_pos) -> bias`` (dist = q_pos - k_pos), the
        MLP unit by unit (the compiled kernel fuses it)."""

        def f(h, dist, q_pos):
            c = self.c()[0]
            norm = torch.maximum(q_pos.float(), self.threshold_value()[0])
            u = torch.log1p(c * dist.abs().float()) / (torch.log1p(c * norm) + NORM_EPS)
            out = self.b2[h].float()
            for k in range(self.hidden):
                out = out + self.w2[h, k].float() * torch.relu(self.w1[k].float() * u + self.b1[k].float())
            return out

        return f

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, hidden={self.hidden}, c={self.c_init:g}, threshold={self.threshold:g}"


def _build(num_heads: int, fire_hidden: int = 32, fire_threshold: float = 512.0, **_):
    return FIREBias(num_heads, fire_hidden, threshold=fire_threshold)


register_scheme("fire", "bias", _build, "learned MLP of the log distance normalised by the query position (FIRE)")

__all__ = ["FIREBias", "NORM_EPS"]
